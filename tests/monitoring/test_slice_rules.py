"""Issue 47: GPU accounting and the idle-GPU alert on MIG slices, through promtool.

A MIG instance counts as its share of a GPU's compute (1g: 1/7) in GPUs allocated, used and
GPU-hours; its utilisation is DCGM_FI_PROF_GR_ENGINE_ACTIVE, since dcgm-exporter reports no
DCGM_FI_DEV_GPU_UTIL for MIG instances (NVIDIA/dcgm-exporter#430; a 0 there is "normal",
#216), which made every MIG job look idle before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.monitoring.conftest import platform, platform_doc, rule_tests_pass
from tests.monitoring.test_rules import VISION, case, firing, series

MIG = "nvidia_com_mig_1g_10gb"  # nvidia.com/mig-1g.10gb as kube-state-metrics labels it


def mig_platform() -> Any:
    doc = platform_doc()
    doc["gpu"] = {"devicePlugin": "gpu-operator"}
    doc["gpuPools"].append(
        {
            "name": "slices",
            "instanceType": "p5.48xlarge",
            "fabric": "tcp",
            "availabilityZone": "us-east-1a",
            "capacity": {"type": "reservation", "reservationId": "cr-0a1b2c3d4e5f60719"},
            "size": {"min": 1, "max": 1},
            "gpuSharing": {"mig": {"layout": "all-1g.10gb"}},
        }
    )
    return platform(doc)


def mig_pod(minutes: int, activity: str) -> list[Any]:
    """vision's llm-worker-0 holds one 1g.10gb instance on node n1, `activity` busy."""
    n = f"1x{minutes}"
    ids = {"namespace": "vision", "pod": "llm-worker-0"}
    return [
        series(
            "kube_pod_labels",
            n,
            **ids,
            label_trainstack_io_team="vision",
            label_trainstack_io_job="llm",
            label_volcano_sh_queue_name="vision",
            label_trainstack_io_pool="slices",
        ),
        series("kube_pod_status_phase", n, **ids, phase="Running"),
        series(
            "kube_pod_container_resource_requests",
            n,
            **ids,
            container="trainer",
            node="n1",
            resource=MIG,
            unit="integer",
        ),
        series("kube_pod_start_time", f"0x{minutes}", **ids),
        # The instance's series: GPU_I_PROFILE set; GPU_UTIL is 0 on MIG, whatever it does.
        series("DCGM_FI_DEV_GPU_UTIL", f"0x{minutes}", **ids, gpu="0", GPU_I_PROFILE="1g.10gb"),
        series(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            activity,
            **ids,
            gpu="0",
            GPU_I_PROFILE="1g.10gb",
            GPU_I_ID="7",
        ),
        series("kube_node_status_allocatable", n, node="n1", resource=MIG, unit="integer"),
    ]


def test_a_busy_mig_instance_counts_a_seventh_and_is_not_idle(
    promtool: str, tmp_path: Path
) -> None:
    checks: list[dict[str, Any]] = [
        {
            "expr": "namespace_pod:trainstack_gpus_allocated:sum",
            "eval_time": "40m",
            "exp_samples": [
                {
                    "labels": "namespace_pod:trainstack_gpus_allocated:sum{namespace='vision', "
                    "pod='llm-worker-0', node='n1', team='vision', queue='vision', "
                    "job_name='llm', pool='slices'}",
                    "value": 1 / 7,
                }
            ],
        },
        {
            "expr": "sum(namespace_pod:trainstack_gpus_used:sum)",
            "eval_time": "40m",
            "exp_samples": [{"labels": "{}", "value": 0.5 / 7}],
        },
        # A half-busy instance: not idle, though its DCGM_FI_DEV_GPU_UTIL reads 0.
        firing("TrainstackGpuAllocatedIdle", "45m", None),
    ]
    rule_tests_pass(promtool, mig_platform(), tmp_path, [case(mig_pod(60, "0.5x60"), checks)])


def test_an_idle_mig_instance_is_idle(promtool: str, tmp_path: Path) -> None:
    checks = [firing("TrainstackGpuAllocatedIdle", "45m", {**VISION, "severity": "warning"})]
    rule_tests_pass(promtool, mig_platform(), tmp_path, [case(mig_pod(60, "0.02x60"), checks)])
