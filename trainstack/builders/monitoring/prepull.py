"""Image pre-pull's metrics and alert (issue 48 #4, docs/prepull.md).

- Images present per pool: kube-state-metrics' DaemonSet status of each pool's pre-pull
  DaemonSet (kube_daemonset_status_number_ready and _desired_number_scheduled, labels namespace
  and daemonset: kube-state-metrics internal/store/daemonset.go): a Ready pod is a node that
  holds every image of its pool's list.
- Pull durations per pool: the kubelet's kubelet_image_pull_duration_seconds histogram (ALPHA,
  k8s.io/kubernetes v1.37.2 pkg/kubelet/metrics/metrics.go; it includes the time a pull waits
  in the kubelet's queue), whose series carry the `node` that the prometheus-operator's
  endpoints scrape of the kubelet Service gives them; joined to the node's pool.
- The alert: a pre-pull container waiting on its image with a pull error
  (kube_pod_container_status_waiting_reason, labels namespace, pod, container, reason), named by
  image (kube_pod_container_info), node (kube_pod_info) and pool (the node's, from
  node:trainstack_node_labels:info): that image is missing on that node, and a job of that pool
  that uses it pulls it at start, or cannot.
"""

from __future__ import annotations

from typing import Any, Final

from trainstack.builders import prepull
from trainstack.builders.monitoring.common import alert_rule
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig

MISSING_ALERT: Final = "TrainstackPrePullImageMissing"
MISSING_MINUTES: Final = 15
# The kubelet's waiting reasons for an image it could not get (k8s.io/kubernetes v1.37.2
# pkg/kubelet/images/types.go ErrImagePullBackOff, ErrImagePull, ErrImageInspect,
# ErrImageNeverPull, ErrInvalidImageName, and pkg/kubelet/container ErrSignatureValidationFailed).
PULL_ERRORS: Final = (
    "ErrImagePull",
    "ImagePullBackOff",
    "ImageInspectError",
    "ErrImageNeverPull",
    "InvalidImageName",
    "SignatureValidationFailed",
)
_PODS: Final = f'namespace="{SYSTEM_NAMESPACE}", pod=~"{prepull.NAME_PREFIX}.+"'
_DAEMONSETS: Final = f'namespace="{SYSTEM_NAMESPACE}", daemonset=~"{prepull.NAME_PREFIX}.+"'


def _by_pool(metric: str) -> str:
    """A pre-pull DaemonSet's series with its pool (the DaemonSet's name after the prefix)."""
    return (
        f'sum by (pool) (label_replace({metric}{{{_DAEMONSETS}}}, "pool", "$1", "daemonset", '
        f'"{prepull.NAME_PREFIX}(.+)"))'
    )


def prepull_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Recording rules (none with pre-pull off)."""
    if not prepull.pools_of(cfg):
        return []
    pulls = (
        "sum by (pool, le) (rate(kubelet_image_pull_duration_seconds_bucket[1h]) "
        "* on (node) group_left (pool) max by (node, pool) (node:trainstack_node_labels:info))"
    )
    return [
        {
            "record": "pool:trainstack_prepull_nodes_ready:sum",
            "expr": _by_pool("kube_daemonset_status_number_ready"),
        },
        {
            "record": "pool:trainstack_prepull_nodes:sum",
            "expr": _by_pool("kube_daemonset_status_desired_number_scheduled"),
        },
        {
            "record": "pool:trainstack_image_pull_seconds:p90_1h",
            "expr": f"histogram_quantile(0.9, {pulls})",
        },
    ]


def prepull_alerts(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The missing-image alert (none with pre-pull off)."""
    if not prepull.pools_of(cfg):
        return []
    reasons = "|".join(PULL_ERRORS)
    expr = (
        "max by (pool, node, image) ("
        f'(kube_pod_container_status_waiting_reason{{{_PODS}, reason=~"{reasons}"}} == 1) '
        "* on (namespace, pod, container) group_left (image) "
        f"max by (namespace, pod, container, image) (kube_pod_container_info{{{_PODS}}}) "
        "* on (namespace, pod) group_left (node) "
        f"max by (namespace, pod, node) (kube_pod_info{{{_PODS}}}) "
        "* on (node) group_left (pool) max by (node, pool) (node:trainstack_node_labels:info))"
    )
    return [
        alert_rule(
            cfg.monitoring.runbook_url,
            MISSING_ALERT,
            expr,
            MISSING_MINUTES,
            "warning",
            "Image {{ $labels.image }} is missing on node {{ $labels.node }} (pool "
            "{{ $labels.pool }})",
            f"The pool's pre-pull pod could not pull it for {MISSING_MINUTES}m: jobs on the "
            "node pull it at start (slow) or cannot (a wrong reference or no access). "
            "kubectl -n trainstack-system describe pod on the node says why.",
        )
    ]
