"""The typed config model: frozen dataclasses that components receive.

Built only by the loader, from documents that already passed the schema and the
cross-field checks, with schema defaults filled in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Cloud = Literal["aws", "existing"]
Environment = Literal["development", "production"]
NatGateways = Literal["single", "perAz"]
Fabric = Literal["efa", "infiniband", "roce", "tcp"]
CapacityType = Literal["onDemand", "spot", "reservation", "capacityBlock"]
DeviceListStrategy = Literal["volume-mounts", "envvar"]
DevicePlugin = Literal["nvidia-device-plugin", "gpu-operator"]

# Namespaces the platform owns; a team may not be named like them.
SYSTEM_NAMESPACE = "trainstack-system"
RESERVED_NAMESPACES = frozenset(
    {"default", "kube-system", "kube-public", "kube-node-lease", SYSTEM_NAMESPACE}
)


PriorityName = Literal["critical", "high", "normal", "preemptible"]
QueueMode = Literal["hierarchical", "flat"]
TopologySource = Literal["labels", "pools"]


@dataclass(frozen=True)
class Group:
    name: str
    owners: tuple[str, ...]
    quota_gpus: int | None = None  # guarantee for the whole group; None: sum of its teams
    deserved_gpus: int | None = None  # fair share of the group; None: derived (queues)


@dataclass(frozen=True)
class TeamQuota:
    """A team's share in GPUs; other dimensions derive from its pools' per-GPU shape."""

    gpus: int  # guarantee
    deserved: int | None = None  # None: equal to the guarantee
    borrow_limit: int = 0
    reclaimable: bool = True
    weight: int | None = None  # flat mode only (the proportion plugin); None: Volcano's 1

    @property
    def deserved_gpus(self) -> int:
        return self.gpus if self.deserved is None else self.deserved

    @property
    def capability_gpus(self) -> int:
        return self.deserved_gpus + self.borrow_limit


@dataclass(frozen=True)
class Team:
    name: str
    group: str | None
    owners: tuple[str, ...]
    quota: TeamQuota
    pools: tuple[str, ...] = ()  # resolved: every pool when the config lists none
    priority_classes: tuple[PriorityName, ...] = ("normal", "preemptible")
    max_job_hours: float = 168
    iam_principals: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    # The team's own retention in the platform's bucket; None: the platform's default
    # (Storage.retention_days, Storage.log_retention_days; builders/storage.team_retention).
    checkpoint_retention_days: int | None = None
    log_retention_days: int | None = None

    @property
    def namespace(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return self.name


@dataclass(frozen=True)
class Registry:
    groups: tuple[Group, ...]
    teams: tuple[Team, ...]

    def team(self, name: str) -> Team | None:
        return next((t for t in self.teams if t.name == name), None)


@dataclass(frozen=True)
class Subnet:
    id: str
    availability_zone: str


# The smallest VPC the platform lays out (builders/network.plan_subnets): private subnets hold
# every pod IP (VPC CNI), so they get almost all of the space. The loader refuses a smaller one.
MAX_VPC_PREFIX = 20


@dataclass(frozen=True)
class NewVpc:
    cidr: str
    availability_zones: tuple[str, ...]
    nat_gateways: NatGateways


@dataclass(frozen=True)
class ExistingVpc:
    vpc_id: str
    private_subnets: tuple[Subnet, ...]


@dataclass(frozen=True)
class EndpointAccess:
    public: bool
    private: bool
    public_cidrs: tuple[str, ...]


@dataclass(frozen=True)
class NodeGroupSize:
    min: int
    desired: int
    max: int


@dataclass(frozen=True)
class SystemNodeGroup:
    instance_type: str
    size: NodeGroupSize
    disk_size_gib: int


@dataclass(frozen=True)
class AddonPin:
    name: str
    version: str | None


@dataclass(frozen=True)
class EksSettings:
    endpoint: EndpointAccess
    logging: tuple[str, ...]
    log_retention_days: int
    secrets_kms_key_arn: str | None
    admin_principal_arns: tuple[str, ...]
    system_node_group: SystemNodeGroup
    addons: tuple[AddonPin, ...]


@dataclass(frozen=True)
class AwsSettings:
    region: str
    network: NewVpc | ExistingVpc
    cluster: EksSettings


@dataclass(frozen=True)
class ExistingCluster:
    kubeconfig: str | None
    context: str


@dataclass(frozen=True)
class Capacity:
    type: CapacityType
    reservation_id: str | None = None
    reservation_group_arn: str | None = None
    instance_count: int | None = None  # the reservation's or block's instances
    window: tuple[datetime, datetime] | None = None  # a capacity block's [start, end), UTC


@dataclass(frozen=True)
class AwsPool:
    instance_type: str
    availability_zone: str | None
    size: NodeGroupSize
    capacity: Capacity
    placement_group: bool  # the pool's instances launch in a cluster placement group
    instance_store_raid0: bool
    disk_size_gib: int
    # An existing placement group's name (the one a reservation was created in); None with
    # placement_group: trainstack creates `<cluster>-<pool>`.
    placement_group_name: str | None = None


@dataclass(frozen=True)
class RdmaSettings:
    resource_name: str
    interfaces: tuple[str, ...]
    hcas: str
    gid_index: int | None
    # The NetworkAttachmentDefinition ([namespace/]name) job pods attach to, as net1.
    secondary_network: str | None = None

    @property
    def resource(self) -> str:
        """The extended resource the RDMA shared device plugin advertises."""
        return f"rdma/{self.resource_name}"


@dataclass(frozen=True)
class ExistingPool:
    node_selector: tuple[tuple[str, str], ...]
    gpus_per_node: int
    nodes: int
    cpus_per_node: int
    memory_gib_per_node: int
    socket_ifname: str
    rdma: RdmaSettings | None


@dataclass(frozen=True)
class MigSharing:
    """Every GPU of the pool cut by the GPU operator's MIG manager into `layout`."""

    layout: str  # the node label nvidia.com/mig.config, e.g. all-1g.10gb
    gpu: str  # the GPU's entry in data/mig.yaml, e.g. H100-80GB


@dataclass(frozen=True)
class TimeSlicing:
    """Every GPU of the pool shared by `replicas` processes (nvidia.com/gpu.shared)."""

    replicas: int


@dataclass(frozen=True)
class GpuPool:
    """A GPU node pool: exactly one of `aws` or `existing` is set, per the stack's cloud."""

    name: str
    fabric: Fabric
    aws: AwsPool | None = None
    existing: ExistingPool | None = None
    # Fractional GPUs (docs/gpu-sharing.md): None, the pool's GPUs are handed out whole.
    sharing: MigSharing | TimeSlicing | None = None


@dataclass(frozen=True)
class DataRepository:
    bucket: str
    prefix: str
    auto_import: tuple[str, ...]
    auto_export: tuple[str, ...]


@dataclass(frozen=True)
class Lustre:
    deployment_type: str
    storage_capacity_gib: int
    per_unit_storage_throughput: int | None
    efa: bool
    availability_zone: str
    data_repository: DataRepository | None


@dataclass(frozen=True)
class ExistingLustre:
    csi_driver: str
    volume_handle: str
    volume_attributes: tuple[tuple[str, str], ...]
    capacity_gib: int


@dataclass(frozen=True)
class NvmeCache:
    host_dir: str  # the node's cache directory, owned by the cache agent (docs/prewarm.md)
    max_concurrent_fetches: int
    volumes_per_node: int = 8  # no longer used (issue 24 #1: one shared cache per node)
    # Prefixes the node agent may fetch from, besides the Lustre data repository.
    sources: tuple[str, ...] = ()
    agent_image: str = "registry.example.com/trainstack/prewarm:0.1.0"
    # kubernetes-csi/node-driver-registrar: registers the agent's socket with the kubelet's
    # plugin watcher. A tag by default; production pins it by digest or names a mirror.
    registrar_image: str = "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0"
    # Requests/s all agents together may send to one source; each agent's ceiling is its share
    # (trainstack.builders.cache.node_request_rate). Default: half of S3's 5,500 GET/s/prefix.
    request_rate_budget: float = 2750.0
    # Share of the cache volume the agent keeps free (issue 39 #1; the schema says why 20).
    reserve_percent: float = 20.0
    # The kubelet's --root-dir: where the agent registers and publishes (also check of issue 39).
    kubelet_dir: str = "/var/lib/kubelet"


@dataclass(frozen=True)
class Efs:
    throughput_mode: str = "elastic"


@dataclass(frozen=True)
class ObjectStore:
    """existing clusters: an S3-compatible store the jobs copy checkpoints and hand-offs to."""

    endpoint: str
    bucket: str
    region: str = "us-east-1"
    credentials_secret: str = "trainstack-object-store"
    collector_secret: str = "trainstack-log-collector"  # in trainstack-system


@dataclass(frozen=True)
class Storage:
    lustre: Lustre | None = None
    efs: Efs | None = None
    existing_lustre: ExistingLustre | None = None
    nvme_cache: NvmeCache | None = None
    checkpoint_bucket: str | None = None  # aws: durable copies
    retention_days: int = 30
    noncurrent_version_days: int = 7
    log_retention_days: int = 30  # job logs under logs/teams/<team>/ (docs/logs.md)
    log_collector: bool = True  # the node log collector that writes them (aws)
    object_store: ObjectStore | None = None  # existing clusters

    @property
    def job_bucket(self) -> str | None:
        """The bucket of checkpoint copies, hand-offs and logs: the platform's (aws) or the
        object store's (existing)."""
        if self.object_store is not None:
            return self.object_store.bucket
        return self.checkpoint_bucket

    # The image whose `trainstack-prewarm layout` gives each team its checkpoint directory.
    layout_image: str = "registry.example.com/trainstack/prewarm:0.1.0"

    @property
    def has_shared_filesystem(self) -> bool:
        """A file system holding datasets (Lustre) — and so also checkpoints."""
        return self.lustre is not None or self.existing_lustre is not None

    @property
    def has_checkpoint_volume(self) -> bool:
        return self.has_shared_filesystem or self.efs is not None


@dataclass(frozen=True)
class PolicySettings:
    allowed_registries: tuple[str, ...] = ()
    max_cpu_limit_request_ratio: float = 2.0
    max_memory_limit_request_ratio: float = 1.0
    advisory: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreInstalled:
    """An add-on the cluster's owners installed: Helm release `release` in `namespace` (None:
    the release name and namespace trainstack would have used)."""

    namespace: str | None = None
    release: str | None = None


@dataclass(frozen=True)
class AddonSource:
    """Where an upstream chart comes from: at most one of the three is set; none is the
    chart's public repository."""

    repository: str | None = None  # a chart repository URL or an oci:// registry path
    path: str | None = None  # a local chart directory
    pre_installed: PreInstalled | None = None


@dataclass(frozen=True)
class Deadlines:
    """The maximum-duration enforcer (docs/deadlines.md); the schema holds the defaults."""

    image: str = "registry.example.com/trainstack/deadlines:0.1.0"
    interval_seconds: int = 60
    margin_seconds: int = 300


@dataclass(frozen=True)
class Topology:
    """Where Volcano's HyperNodes come from (docs/scheduling.md, "Topology"): `labels`, the
    nodes' own network labels, top tier first, turned into HyperNodes by Volcano's controller;
    or `pools`, HyperNodes the platform writes per pool and zone. The loader fills both from
    the cloud and the pools (config/topology.py); this default is for configs built in code."""

    source: TopologySource = "pools"
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scheduling:
    queue_mode: QueueMode = "hierarchical"
    preemption: bool = True
    topology_aware: bool = True
    deadlines: Deadlines = Deadlines()
    topology: Topology = Topology()


@dataclass(frozen=True)
class AlertThresholds:
    """Alert thresholds; the schema holds the defaults (docs/monitoring.md)."""

    gpu_idle_utilization_percent: float = 5.0
    gpu_idle_minutes: int = 30
    reserved_idle_minutes: int = 60
    stall_minutes: int = 15
    checkpoint_interval_minutes: int = 60
    pending_minutes: int = 60
    max_duration_warn_ratio: float = 0.9
    data_wait_ratio: float = 0.3
    data_wait_minutes: int = 15
    step_time_regression_ratio: float = 1.5
    step_time_jitter_ratio: float = 0.5
    node_not_ready_minutes: int = 5


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret in the monitoring namespace (never read by trainstack)."""

    name: str
    key: str


@dataclass(frozen=True)
class AlertReceiver:
    name: str
    severities: tuple[str, ...] = ("critical", "warning")
    teams: tuple[str, ...] = ()
    slack_channel: str | None = None
    slack_webhook: SecretRef | None = None
    webhook_url: str | None = None
    webhook_url_secret: SecretRef | None = None
    pagerduty_routing_key: SecretRef | None = None


@dataclass(frozen=True)
class GpuPrice:
    """USD per GPU-hour for one instance type bought one way."""

    instance_type: str
    capacity: CapacityType
    usd_per_gpu_hour: float


@dataclass(frozen=True)
class Monitoring:
    retention: str = "15d"
    storage_gib: int = 100
    storage_class: str | None = None
    grafana_admin_secret: str | None = None
    runbook_url: str = "docs/monitoring.md"
    thresholds: AlertThresholds = AlertThresholds()
    receivers: tuple[AlertReceiver, ...] = ()
    prices: tuple[GpuPrice, ...] = ()


RepairMode = Literal["replace", "hook", "none"]


@dataclass(frozen=True)
class RepairConfig:
    """What happens to a node that failed its health check (docs/health.md)."""

    mode: RepairMode = "none"  # the loader: replace on aws, none on existing clusters
    hook_url: str | None = None  # mode hook: where the failed node is POSTed (https)
    delay_minutes: int = 10
    # The Prometheus asked for straggler alerts; the loader fills the platform's own.
    prometheus_url: str | None = None


@dataclass(frozen=True)
class HealthConfig:
    """The GPU node health gate (`health:`); the schema holds the defaults."""

    enabled: bool = False
    image: str = "registry.example.com/trainstack/health:0.1.0"
    dcgm_level: int = 2  # contracts.health.DEFAULT_DCGM_LEVEL
    recheck_minutes: int = 60
    straggler_ratio: float = 1.25
    straggler_minutes: int = 30
    straggler_alerts: int = 3
    repair: RepairConfig = RepairConfig()


@dataclass(frozen=True)
class PrePullImage:
    """An image the platform config asks to pre-pull (`prePull.images[]`)."""

    image: str
    pools: tuple[str, ...] = ()  # empty: every GPU pool


@dataclass(frozen=True)
class PrePull:
    """Training images on the GPU nodes ahead of use (`prePull:`); the schema holds the
    defaults (docs/prepull.md)."""

    enabled: bool = False
    team_jobs: bool = True
    images: tuple[PrePullImage, ...] = ()
    max_parallel_pulls: int = 4
    gate_minutes: int = 20
    holder_image: str = "docker.io/library/busybox:1.37.0"
    soci: Literal["off", "parallel-pull-unpack"] = "off"
    max_concurrent_downloads: int | None = None


@dataclass(frozen=True)
class PlatformConfig:
    """The platform stack: cluster, shared services and the team registry."""

    stack: str
    cloud: Cloud
    environment: Environment
    cluster_name: str
    kubernetes_version: str
    tags: tuple[tuple[str, str], ...]
    aws: AwsSettings | None
    existing: ExistingCluster | None
    registry: Registry
    gpu_device_plugin: DevicePlugin = "nvidia-device-plugin"
    # volume-mounts: pods see only their allocated GPUs (docs/security.md); envvar: any pod
    # setting NVIDIA_VISIBLE_DEVICES=all sees the node's. Unset: volume-mounts on aws (the
    # platform configures its nodes' toolkit), envvar on existing clusters (the owners' nodes).
    gpu_device_list_strategy: DeviceListStrategy = "volume-mounts"
    gpu_pools: tuple[GpuPool, ...] = ()
    scheduling: Scheduling = Scheduling()
    storage: Storage = Storage()
    monitoring: Monitoring = Monitoring()
    policy: PolicySettings = PolicySettings()
    addons: tuple[tuple[str, AddonSource], ...] = ()
    health: HealthConfig = HealthConfig()
    pre_pull: PrePull = PrePull()

    def pool(self, name: str) -> GpuPool | None:
        return next((p for p in self.gpu_pools if p.name == name), None)

    def addon_source(self, key: str) -> AddonSource:
        """Where add-on `key` comes from (the default: its public chart repository)."""
        return dict(self.addons).get(key, AddonSource())

    def addon_namespace(self, key: str, default: str) -> str:
        """Where add-on `key` runs: the namespace a pre-installed one names, else `default`
        (where trainstack installs it)."""
        pre = self.addon_source(key).pre_installed
        return (pre.namespace if pre else None) or default


@dataclass(frozen=True)
class TeamStackConfig:
    """A team stack: which team, on which platform stack."""

    stack: str
    team: str
    platform_stack: str
    jobs: tuple[str, ...] = ()  # glob patterns, relative to the project root

    @property
    def platform_stack_name(self) -> str:
        """The short stack name (last segment of <org>/<project>/<stack>)."""
        return self.platform_stack.rsplit("/", 1)[-1]


StackConfig = PlatformConfig | TeamStackConfig
