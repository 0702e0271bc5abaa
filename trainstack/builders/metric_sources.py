"""Every metric name trainstack's rules and dashboards may use, with the exporter that makes it.

Tests parse every rule and dashboard expression and fail on a name that is neither listed
here nor recorded by one of trainstack's own recording rules. Sources:

- DCGM: dcgm-exporter 4.8.2, fields from the counters CSV trainstack ships
  (`DCGM_COUNTERS`, mounted over the chart's default list; field names as in
  NVIDIA/dcgm-exporter `etc/dcp-metrics-included.csv`).
- kube-state-metrics (bundled with kube-prometheus-stack): standard pod and node metrics
  (kube-state-metrics docs/metrics/workload/pod-metrics.md, cluster/node-metrics.md); pod and
  node labels only for the keys in `KSM_LABELS_ALLOWLIST`.
- kube-state-metrics custom-resource state (configured by trainstack, `ksm_custom_resources()`
  in builders/monitoring/values.py): Volcano Job annotations and PodGroup phases.
- node-exporter: the infiniband collector (on by default) on InfiniBand/RoCE nodes.
- the kubelet: its image pull durations (image pre-pull, docs/prepull.md).
- Volcano v1.15 scheduler and controllers (`--enable-metrics`, volcano docs/design/metrics.md;
  the queue PodGroup counts come from the controllers, pkg/controllers/metrics/queue.go).
- The training runtime: `trainstack.contracts.runtime.METRICS` (docs/runtime.md).
- The maximum-duration enforcer: `trainstack.contracts.deadlines.METRICS` (docs/deadlines.md).
- The node health agent and its repair controller: `trainstack.contracts.health.METRICS`
  (docs/health.md).
- Prometheus: `ALERTS`.
"""

from __future__ import annotations

from typing import Final

from trainstack.contracts import deadlines, health
from trainstack.contracts import runtime as contract

# (DCGM field, Prometheus type, help): the exact list dcgm-exporter exports (`-f` CSV).
DCGM_COUNTERS: Final[tuple[tuple[str, str, str], ...]] = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles device memory is active."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit volatile ECC errors."),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Rows remapped for uncorrectable errors.",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth counters, all lanes."),
)

KSM_METRICS: Final = (
    # image pre-pull (builders/monitoring/prepull.py): the pods' waiting reasons, images and
    # nodes, and the DaemonSets' status (kube-state-metrics v2 internal/store/pod.go,
    # daemonset.go; both collectors on by default in the chart)
    "kube_pod_container_status_waiting_reason",
    "kube_pod_container_info",
    "kube_pod_info",
    "kube_daemonset_status_number_ready",
    "kube_daemonset_status_desired_number_scheduled",
    "kube_pod_container_resource_requests",
    "kube_pod_status_phase",
    "kube_pod_labels",
    "kube_pod_start_time",
    "kube_node_labels",
    "kube_node_status_condition",
    "kube_node_status_capacity",
    "kube_node_status_allocatable",
)

# Metrics from kube-state-metrics' custom-resource-state config that trainstack ships.
KSM_CUSTOM_METRICS: Final = (
    "trainstack_volcano_job_max_duration_seconds",
    "trainstack_volcano_job_checkpoint_interval_seconds",
    "trainstack_volcano_podgroup_status_phase",
)

NODE_EXPORTER_METRICS: Final = (
    "node_infiniband_port_data_transmitted_bytes_total",
    "node_infiniband_port_data_received_bytes_total",
)

# Volcano v1.15.1: the scheduler's pkg/scheduler/metrics and the controllers'
# pkg/controllers/metrics (queue PodGroup counts), each scraped through its chart Service.
VOLCANO_SCHEDULER_METRICS: Final = (
    "volcano_queue_allocated_scalar_resources",
    "volcano_queue_deserved_scalar_resources",
    # queue.go: request (allocated + pending tasks) and capability, per queue and resource.
    "volcano_queue_request_scalar_resources",
    "volcano_queue_capacity_scalar_resources",
    "volcano_e2e_scheduling_latency_milliseconds_bucket",
    "volcano_e2e_job_scheduling_duration",
    # metrics.go: unix seconds of the job's last scheduling (allocate/backfill).
    "volcano_e2e_job_scheduling_last_time",
    # metrics.go: cluster-wide only, no queue label.
    "volcano_total_preemption_attempts",
    "volcano_pod_preemption_victims",
)
VOLCANO_CONTROLLER_METRICS: Final = (
    "volcano_queue_pod_group_pending_count",
    "volcano_queue_pod_group_inqueue_count",
    "volcano_queue_pod_group_running_count",
)

# The kubelet, scraped by kube-prometheus-stack's kubelet ServiceMonitor (on by default):
# k8s.io/kubernetes v1.37.2 pkg/kubelet/metrics/metrics.go ImagePullDuration (ALPHA).
KUBELET_METRICS: Final = ("kubelet_image_pull_duration_seconds_bucket",)

# Prometheus itself: the ALERTS series of firing and pending alerts.
PROMETHEUS_METRICS: Final = ("ALERTS",)

SOURCES: Final[dict[str, tuple[str, ...]]] = {
    "prometheus": PROMETHEUS_METRICS,
    "dcgm-exporter": tuple(name for name, _, _ in DCGM_COUNTERS),
    "kube-state-metrics": KSM_METRICS,
    "kube-state-metrics custom resources": KSM_CUSTOM_METRICS,
    "node-exporter": NODE_EXPORTER_METRICS,
    "kubelet": KUBELET_METRICS,
    "volcano-scheduler": VOLCANO_SCHEDULER_METRICS,
    "volcano-controllers": VOLCANO_CONTROLLER_METRICS,
    "trainstack runtime": tuple(contract.METRICS),
    "trainstack deadlines": tuple(deadlines.METRICS),
    "trainstack health": tuple(health.METRICS),
}


def exported_metrics() -> dict[str, str]:
    """Metric name -> the exporter that produces it."""
    return {name: source for source, names in SOURCES.items() for name in names}


def dcgm_counters_csv() -> str:
    """The dcgm-exporter `-f` file: exactly `DCGM_COUNTERS`."""
    lines = ["# trainstack: DCGM fields exported (builders/metric_sources.py)"]
    lines += [f"{name}, {kind}, {text}" for name, kind, text in DCGM_COUNTERS]
    return "\n".join(lines) + "\n"
