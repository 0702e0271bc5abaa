"""In-pod restarts on the rendezvous rendered jobs use (issue 22 #4).

Rendered data-parallel jobs get the pod-level variables of Volcano's pytorch plugin
(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK), which the supervisor planned as torch's static
rendezvous. Its store lives for every round (torch/distributed/elastic/rendezvous/
static_tcp_rendezvous.py, ``StaticTCPRendezvous.next_rendezvous`` creates ``self._store``
once) and the workers use it with no per-round prefix (torch/distributed/rendezvous.py,
``_create_c10d_store`` under ``TORCHELASTIC_USE_AGENT_STORE``), so workers restarted in the
pod read the addresses their dead peers left: "Connection refused", or a hang in the next
rendezvous (3 of 3 runs of the single-pod test below failed before the fix, 2 hung until
killed). With restarts the supervisor now uses the c10d rendezvous (topology.restartable).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainstack_runtime.contract import ExitCode
from trainstack_runtime.exitcodes import ConfigError
from trainstack_runtime.topology import NodePlan, node_plan, restartable

from tests.runtime.harness import (
    HAVE_TORCH,
    Baseline,
    JobResult,
    RunJob,
    assert_matches_baseline,
    free_port,
    kill_all,
    start_pods,
)

POD_ENV = {"MASTER_ADDR": "job-master-0.job", "MASTER_PORT": "23456"}


@pytest.mark.parametrize(
    ("env", "backend", "host"),
    [
        pytest.param({**POD_ENV, "WORLD_SIZE": "2", "RANK": "0"}, "c10d", True, id="pod-env-0"),
        pytest.param({**POD_ENV, "WORLD_SIZE": "2", "RANK": "1"}, "c10d", False, id="pod-env-1"),
        pytest.param(
            {"VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": "h0", "VC_WORKER_HOSTS": "h1"},
            "c10d",
            False,
            id="volcano-svc-worker",
        ),
        pytest.param(
            {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_RDZV_ENDPOINT": "h0:29400"},
            "c10d",
            True,
            id="pet-implied-static",
        ),
        pytest.param(
            {"PET_NNODES": "1:4", "PET_RDZV_ENDPOINT": "h0:29400"}, "c10d", None, id="pet-c10d"
        ),
        pytest.param({}, "c10d", None, id="single"),
    ],
)
def test_restarts_plan_a_rendezvous_that_survives_them(
    env: dict[str, str], backend: str, host: bool | None
) -> None:
    plan = node_plan(env, hostname="h1")
    assert restartable(plan, 0, env) == plan, "no restarts: the plan is unchanged"
    again = restartable(plan, 2, env)
    assert (again.rdzv_backend, again.store_host) == (backend, host)
    assert (again.num_nodes, again.rdzv_endpoint) == (plan.num_nodes, plan.rdzv_endpoint)


def test_explicit_static_rendezvous_with_restarts_is_refused() -> None:
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_RDZV_ENDPOINT": "h0:29400"}
    plan: NodePlan = node_plan({**env, "PET_RDZV_BACKEND": "static"})
    with pytest.raises(ConfigError, match="PET_RDZV_BACKEND=c10d, or TRAINSTACK_MAX_RESTARTS=0"):
        restartable(plan, 1, {**env, "PET_RDZV_BACKEND": "static"})


needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


@needs_torch
@pytest.mark.faults
def test_in_pod_restart_with_pod_level_env_resumes_bit_exact(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    """One pod of two workers, planned from Volcano's pytorch-plugin variables, a worker
    SIGKILLed, one in-pod restart: the job finishes and every loss matches."""
    result = run_job(
        tmp_path,
        fault="sigkill@13,rank=1",
        max_restarts=1,
        timeout=240,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE="1",
        RANK="0",
    )
    assert result.code == ExitCode.OK, result.output[-3000:]
    assert "rdzv=c10d@127.0.0.1" in result.output
    assert_matches_baseline(result, baseline, replayed_from=(10, 5))


@needs_torch
@pytest.mark.faults
def test_in_pod_restart_across_two_pods(tmp_path: Path, baseline: Baseline) -> None:
    """Two one-worker pods with pod-level env (as Volcano's pytorch plugin sets it) and
    TRAINSTACK_MAX_RESTARTS=1; one pod's worker is SIGKILLed. The other pod's workers are
    restarted by the new rendezvous round too, and both pods finish the job."""
    procs = start_pods(
        tmp_path, max_restarts=1, TRAINSTACK_MAX_RESTARTS="1", TRAINSTACK_FAULT="sigkill@13,rank=1"
    )
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outputs.append(out.decode(errors="replace"))
    finally:
        kill_all(procs)
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == ExitCode.OK, out[-3000:]
    assert_matches_baseline(JobResult(0, tmp_path, ""), baseline, replayed_from=(10, 5))
