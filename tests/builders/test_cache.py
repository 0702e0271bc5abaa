"""Issue 24 #1: the node cache agent as the platform deploys it (builders/cache.py)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from trainstack_prewarm.cli import build_parser
from trainstack_prewarm.csi import DRIVER_NAME

from trainstack.builders import cache
from trainstack.builders import pools as pool_builders
from trainstack.builders.platform import system_namespace
from trainstack.builders.storage import cache_sources
from trainstack.config import ConfigError, PlatformConfig, load_stack_file
from trainstack.config.model import SYSTEM_NAMESPACE, NvmeCache

ROOT = Path(__file__).resolve().parent.parent.parent


def platform(stack: str) -> PlatformConfig:
    cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def test_the_csi_driver_is_the_agents_and_serves_inline_volumes_only() -> None:
    cfg = platform("dev")
    driver = cache.csi_driver(cfg)
    assert driver["metadata"]["name"] == cache.DRIVER == DRIVER_NAME
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    assert driver["spec"]["attachRequired"] is False
    assert driver["spec"]["podInfoOnMount"] is True


def test_the_agent_runs_privileged_only_in_the_privileged_system_namespace() -> None:
    cfg = platform("dev")
    ds = cache.daemonset(cfg)
    assert ds["metadata"]["namespace"] == SYSTEM_NAMESPACE
    labels = system_namespace(cfg)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    pod = ds["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no Kubernetes API access at all
    agent, registrar = pod["containers"]
    assert agent["securityContext"]["privileged"] is True
    assert "privileged" not in registrar["securityContext"]
    pods = next(m for m in agent["volumeMounts"] if m["name"] == "pods")
    assert pods["mountPropagation"] == "Bidirectional"


@pytest.mark.parametrize("stack", ["dev", "onprem"])
def test_the_agents_arguments_are_ones_its_cli_accepts(stack: str) -> None:
    cfg = platform(stack)
    args = build_parser().parse_args(cache.agent_args(cfg))
    assert args.subcommand == "agent"
    assert args.start_jitter == cache.START_JITTER_S
    assert args.allow_source == cache_sources(cfg)


def _onprem_with_cache(tmp_path: Path, **fields: object) -> Path:
    """stacks/Pulumi.onprem.yaml with these storage.nvmeCache fields set."""
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.onprem.yaml").read_text())
    doc["config"]["trainstack:platform"]["storage"]["nvmeCache"].update(fields)
    path = tmp_path / "Pulumi.onprem.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _onprem_cache_config(tmp_path: Path, **fields: object) -> PlatformConfig:
    cfg = load_stack_file(_onprem_with_cache(tmp_path, **fields))
    assert isinstance(cfg, PlatformConfig)
    return cfg


@pytest.mark.parametrize(
    "kubelet", ["/var/lib/k0s/kubelet", "/var/snap/microk8s/common/var/lib/kubelet"]
)
def test_the_agent_follows_a_kubelet_that_lives_elsewhere(tmp_path: Path, kubelet: str) -> None:
    """Also check of issue 39: the kubelet names publish targets by host path under its
    --root-dir and watches plugins_registry there; with /var/lib/kubelet fixed, the agent on
    k0s or MicroK8s never registered (registration hostPath type Directory: it did not even
    start) and its bind mounts would land outside the pods' volumes."""
    default = cache.daemonset(platform("onprem"))["spec"]["template"]["spec"]
    assert {v["name"]: v["hostPath"]["path"] for v in default["volumes"]}["pods"] == (
        "/var/lib/kubelet/pods"
    )
    cfg = _onprem_cache_config(tmp_path, kubeletDir=kubelet)
    pod = cache.daemonset(cfg)["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert volumes["pods"] == f"{kubelet}/pods"
    assert volumes["registration"] == f"{kubelet}/plugins_registry"
    assert volumes["plugin"] == f"{kubelet}/plugins/{cache.DRIVER}"
    agent, registrar = pod["containers"]
    pods = next(m for m in agent["volumeMounts"] if m["name"] == "pods")
    assert pods["mountPath"] == volumes["pods"]  # targets arrive as host paths
    assert (
        f"--kubelet-registration-path={kubelet}/plugins/{cache.DRIVER}/csi.sock"
        in (registrar["args"])
    )


@pytest.mark.parametrize("bad", ["var/lib/kubelet", "/var/lib/kubelet/", "/", "/a b"])
def test_a_kubelet_dir_that_is_not_an_absolute_path_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_stack_file(_onprem_with_cache(tmp_path, kubeletDir=bad))
    assert "storage.nvmeCache.kubeletDir" in str(info.value)


def test_the_agent_keeps_the_configured_share_of_its_volume_free(tmp_path: Path) -> None:
    """issue 39 #1: the cache shares the instance-store array with the kubelet and containerd;
    the reserve (default 20 %, above the kubelet's nodefs 10 % / imagefs 15 % hard eviction)
    reaches the agent as the CLI's --reserve, and a stack's own value replaces it."""
    args = build_parser().parse_args(cache.agent_args(platform("dev")))
    assert args.reserve == 20.0
    assert not args.no_evict
    cfg = _onprem_cache_config(tmp_path, reservePercent=35)
    assert build_parser().parse_args(cache.agent_args(cfg)).reserve == 35.0


@pytest.mark.parametrize("stack", ["dev", "onprem"])
def test_a_hung_agent_is_restarted_by_a_liveness_probe_of_its_csi_server(stack: str) -> None:
    agent = cache.daemonset(platform(stack))["spec"]["template"]["spec"]["containers"][0]
    probe = agent["livenessProbe"]
    command = probe["exec"]["command"]
    assert command[0] == "trainstack-prewarm"  # the image's entrypoint, on its PATH
    args = build_parser().parse_args(command[1:])
    assert args.subcommand == "probe"
    served = build_parser().parse_args(cache.agent_args(platform(stack)))
    assert args.csi_endpoint == served.csi_endpoint  # the socket the agent serves
    # The CLI's deadline fits in the kubelet's, and a busy agent gets a minute, not a period.
    assert args.timeout < probe["timeoutSeconds"] <= probe["periodSeconds"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 60


def test_the_registrar_image_is_the_platforms_choice() -> None:
    cfg = platform("dev")
    assert cfg.storage.nvme_cache is not None
    assert cfg.storage.nvme_cache.registrar_image == (
        "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0"  # the default
    )
    mirror = "mirror.example.com/sig-storage/csi-node-driver-registrar@sha256:" + "0" * 64
    nvme = dataclasses.replace(cfg.storage.nvme_cache, registrar_image=mirror)
    cfg = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, nvme_cache=nvme))
    _, registrar = cache.daemonset(cfg)["spec"]["template"]["spec"]["containers"]
    assert registrar["image"] == mirror


def test_the_agent_may_read_the_dataset_repository_and_nothing_else() -> None:
    prod = platform("prod")  # Lustre's data repository; with a cache added
    storage = dataclasses.replace(prod.storage, nvme_cache=NvmeCache("/mnt/trainstack-cache", 8))
    prod = dataclasses.replace(prod, storage=storage)
    assert cache_sources(prod) == ["s3://acme-ml-datasets/datasets/"]
    policy = cache.s3_read_policy(prod)
    assert policy is not None
    actions = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert actions == {"s3:ListBucket", "s3:GetObject"}
    assert cache.s3_read_policy(platform("onprem")) is None  # no S3 source: no role


@settings(max_examples=300, deadline=None)
@given(
    budget=st.one_of(st.integers(1, 100_000), st.floats(0.001, 100_000.0)),
    pool_sizes=st.lists(st.integers(0, 5_000), max_size=12),
)
def test_a_fleet_of_node_ceilings_never_exceeds_the_budget(
    budget: float, pool_sizes: list[int]
) -> None:
    """Issue 24: every node that can run the agent at its ceiling stays within the budget,
    exactly (no float rounding above it), and no ceiling is above the budget."""
    nodes = sum(pool_sizes)
    rate = cache.node_request_rate(budget, nodes)
    assert 0 < rate <= budget
    assert Fraction(rate) * max(nodes, 1) <= Fraction(budget)
    if nodes:  # not needlessly low: one ulp-ish below the exact share at most
        assert rate >= budget / nodes * (1 - 1e-12)


# dev: one aws pool of at most 2 nodes; onprem: one existing pool of 16 nodes.
@pytest.mark.parametrize(("stack", "nodes"), [("dev", 2), ("onprem", 16)])
def test_the_agents_ceiling_is_its_share_of_the_fleet_budget(stack: str, nodes: int) -> None:
    cfg = platform(stack)
    assert cfg.storage.nvme_cache is not None
    assert cache.cache_nodes(cfg) == nodes
    args = build_parser().parse_args(cache.agent_args(cfg))
    assert args.max_request_rate == cache.node_request_rate(
        cfg.storage.nvme_cache.request_rate_budget, nodes
    )
    assert args.max_request_rate * nodes <= cfg.storage.nvme_cache.request_rate_budget
    pod = cache.daemonset(cfg)["spec"]["template"]["spec"]
    if cfg.cloud == "existing":  # the agent runs on the pools' nodes only: those counted
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        selectors = {
            tuple((e["key"], e["values"][0]) for e in t["matchExpressions"])
            for t in terms["nodeSelectorTerms"]
        }
        assert selectors == {p.existing.node_selector for p in cfg.gpu_pools if p.existing}
    else:
        assert pod["nodeSelector"] == {cache.CACHE_NODE_LABEL: "true"}


def test_the_agent_runs_only_where_the_cache_directory_is(tmp_path: Path) -> None:
    """Issue 39 #9: only pools with an instance-store array get the cache directory (the
    node's user data makes it there), and the agent's hostPath is type Directory, so an agent
    on any other GPU node never starts and its rollout never completes. The agent selects a
    label only cache pools carry; the fleet's request-rate budget is shared among them."""
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    pools = doc["config"]["trainstack:platform"]["gpuPools"]
    pools.append({**pools[0], "name": "no-array", "instanceStore": "none", "size": {"max": 5}})
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(doc))
    cfg = load_stack_file(path)
    assert isinstance(cfg, PlatformConfig)
    with_array, without = cfg.gpu_pools
    assert pool_builders.node_labels(cfg, with_array)[cache.CACHE_NODE_LABEL] == "true"
    assert cache.CACHE_NODE_LABEL not in pool_builders.node_labels(cfg, without)
    pod = cache.daemonset(cfg)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {cache.CACHE_NODE_LABEL: "true"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache"]["hostPath"]["type"] == "Directory"
    assert cache.cache_nodes(cfg) == 2  # the array pool's 2 nodes, not the other's 5
    outputs = {p["name"]: p for p in (pool_builders.pool_output(cfg, x) for x in cfg.gpu_pools)}
    assert (outputs["l40s-dev"]["datasetCache"], outputs["no-array"]["datasetCache"]) == (
        True,
        False,
    )


def test_each_directory_source_is_mounted_read_only_into_the_agent_at_its_own_path(
    tmp_path: Path,
) -> None:
    """The agent fetches a directory source from its own file system: without the mount a
    fill from it could not work."""
    cfg = _onprem_cache_config(tmp_path, sources=["/fsx/datasets/", "/scratch/sets/"])
    pod = cache.daemonset(cfg)["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    for source in ("/fsx/datasets/", "/scratch/sets/"):
        mount = mounts[source.rstrip("/")]
        assert mount["readOnly"] is True
        assert "mountPropagation" not in mount  # nothing the agent mounts goes back to the host
        # Directory: a source missing on the node stops the agent instead of being made empty.
        assert volumes[mount["name"]]["hostPath"] == {
            "path": source.rstrip("/"),
            "type": "Directory",
        }
    args = build_parser().parse_args(cache.agent_args(cfg))
    assert args.allow_source == ["/fsx/datasets/", "/scratch/sets/"]
    # S3 sources and none at all: no extra volume.
    dev = cache.daemonset(platform("dev"))["spec"]["template"]["spec"]
    assert [v["name"] for v in dev["volumes"]] == ["cache", "plugin", "registration", "pods"]


@pytest.mark.parametrize(
    "source",
    [
        "/fsx/datasets/../../etc/",
        "/fsx/./datasets/",
        "/fsx//datasets/",
        "/fsx/datasets",  # a prefix without its `/` would also cover /fsx/datasetsX
        "/",  # the node's whole file system
        "fsx/datasets/",
    ],
)
def test_a_directory_source_must_be_a_normalised_absolute_directory(
    tmp_path: Path, source: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_stack_file(_onprem_with_cache(tmp_path, sources=[source]))
    (issue,) = refused.value.issues
    assert issue.path == "trainstack:platform.storage.nvmeCache.sources[0]"
    assert repr(source) in issue.message
    assert "ending in /, without '.', '..' or empty segments" in issue.message


@pytest.mark.parametrize(
    ("source", "holds"),
    [
        ("/var/lib/", "/var/lib/kubelet"),  # the kubelet's client key, every pod's volumes
        ("/var/lib/kubelet/pods/", "/var/lib/kubelet"),
        ("/mnt/", "/mnt/nvme"),  # the cache itself (hostDir)
        ("/etc/", "/etc"),
    ],
)
def test_a_directory_source_may_not_hold_the_nodes_own_state(
    tmp_path: Path, source: str, holds: str
) -> None:
    """Every team reads what is under a source through the agent, which reads as root."""
    with pytest.raises(ConfigError) as refused:
        load_stack_file(_onprem_with_cache(tmp_path, sources=[source]))
    (issue,) = refused.value.issues
    assert issue.path == "trainstack:platform.storage.nvmeCache.sources[0]"
    assert issue.message.startswith(f"{source!r} overlaps {holds}")
