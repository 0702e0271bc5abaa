"""Topology from the environment: tables of env dicts -> topology, plan, or error message."""

from __future__ import annotations

from typing import Any

import pytest
from trainstack_runtime.topology import (
    NodePlan,
    TopologyError,
    comm_timeout,
    node_plan,
    process_topology,
)

ELASTIC = {
    "TORCHELASTIC_RUN_ID": "job-1",
    "LOCAL_RANK": "1",
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "2",
}
POD = {"MASTER_ADDR": "job-master-0.job", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            ELASTIC,
            {
                "rank": 5,
                "world_size": 8,
                "local_rank": 1,
                "local_world_size": 4,
                "node_rank": 1,
                "num_nodes": 2,
                "master_addr": "10.0.0.1",
                "master_port": 29500,
                "source": "elastic",
                "restart_count": 2,
            },
            id="torchrun",
        ),
        pytest.param(
            {k: v for k, v in ELASTIC.items() if not k.startswith("GROUP_")},
            {"node_rank": 1, "num_nodes": 2},
            id="torchrun-without-group-vars",
        ),
        pytest.param(
            POD,
            {
                "rank": 2,
                "world_size": 3,
                "local_rank": 0,
                "local_world_size": 1,
                "node_rank": 2,
                "source": "pod-env",
                "master_addr": "job-master-0.job",
                "master_port": 23456,
            },
            id="volcano-or-pytorchjob-one-process-per-pod",
        ),
        pytest.param(
            {},
            {"rank": 0, "world_size": 1, "source": "single", "master_addr": "127.0.0.1"},
            id="nothing-set",
        ),
    ],
)
def test_process_topology(env: dict[str, str], expected: dict[str, Any]) -> None:
    topo = process_topology(env)
    for key, value in expected.items():
        assert getattr(topo, key) == value, key


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"RANK": "0", "WORLD_SIZE": "2"},
            "missing environment variable(s) MASTER_ADDR, MASTER_PORT (found WORLD_SIZE, RANK)",
            id="partial-pod-env",
        ),
        pytest.param(
            {k: v for k, v in ELASTIC.items() if k not in ("MASTER_PORT", "LOCAL_WORLD_SIZE")},
            "torchrun/elastic worker: missing environment variable(s) LOCAL_WORLD_SIZE, "
            "MASTER_PORT",
            id="partial-elastic",
        ),
        pytest.param({**POD, "RANK": "3"}, "RANK=3 is outside 0..2 (WORLD_SIZE)", id="rank-range"),
        pytest.param({**POD, "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer", id="nan"),
        pytest.param(
            {**POD, "PET_NPROC_PER_NODE": "8"},
            "WORLD_SIZE/RANK count pods here but 8 processes per pod were requested",
            id="pods-vs-processes",
        ),
        pytest.param(
            {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "8"},
            "node-level launcher arguments (PET_NNODES, PET_NPROC_PER_NODE) are set",
            id="pet-without-launcher",
        ),
        pytest.param(
            {"VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": "j-master-0.j"},
            "Volcano env/svc variables are set but no ranks were assigned",
            id="volcano-svc-without-launcher",
        ),
    ],
)
def test_process_topology_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyError) as info:
        process_topology(env)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("env", "gpus", "hostname", "expected"),
    [
        pytest.param(
            {}, 0, None, NodePlan(1, 0, 1, "c10d", "localhost:0", "trainstack", "single"), id="one"
        ),
        pytest.param(
            {}, 8, None, NodePlan(1, 0, 8, "c10d", "localhost:0", "trainstack", "single"), id="gpus"
        ),
        pytest.param(
            {**POD, "TRAINSTACK_NPROC_PER_NODE": "4"},
            4,
            None,
            # Volcano/PyTorchJob count pods: they become nodes, not ranks.
            NodePlan(3, 2, 4, "static", "job-master-0.job:23456", "trainstack", "pod-env"),
            id="volcano-pytorch-plugin",
        ),
        pytest.param(
            {
                "PET_NNODES": "2",
                "PET_NODE_RANK": "1",
                "PET_NPROC_PER_NODE": "gpu",
                "PET_MASTER_ADDR": "tj-node-0-0.tj",
                "PET_MASTER_PORT": "29400",
                # Kubeflow v1.9 also sets WORLD_SIZE = replicas * nproc: PET_* must win.
                "WORLD_SIZE": "16",
                "RANK": "1",
                "MASTER_ADDR": "x",
                "MASTER_PORT": "1",
            },
            8,
            None,
            NodePlan(2, 1, 8, "static", "tj-node-0-0.tj:29400", "trainstack", "pet"),
            id="kubeflow-trainer-v2",
        ),
        pytest.param(
            {
                "PET_NNODES": "1:4",
                "PET_RDZV_ENDPOINT": "job-master-0:29400",
                "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ID": "run-7",
                "PET_NPROC_PER_NODE": "2",
            },
            0,
            None,
            NodePlan((1, 4), None, 2, "c10d", "job-master-0:29400", "run-7", "pet"),
            id="elastic-pytorchjob",
        ),
        pytest.param(
            {
                "VC_TASK_INDEX": "1",
                "VC_MASTER_HOSTS": "j-master-0.j",
                "VC_MASTER_NUM": "1",
                "VC_WORKER_HOSTS": "j-worker-0.j,j-worker-1.j",
                "VC_WORKER_NUM": "2",
            },
            1,
            "j-worker-1",
            NodePlan(3, 2, 1, "static", "j-master-0.j:23456", "trainstack", "volcano-svc"),
            id="volcano-env-svc",
        ),
    ],
)
def test_node_plan(
    env: dict[str, str], gpus: int, hostname: str | None, expected: NodePlan
) -> None:
    assert node_plan(env, gpus=gpus, hostname=hostname) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({"MASTER_ADDR": "m"}, "missing environment variable(s) MASTER_PORT", id="pod"),
        pytest.param({"PET_NNODES": "2"}, "missing PET_RDZV_ENDPOINT", id="pet-endpoint"),
        pytest.param(
            {"PET_NNODES": "0:2", "PET_RDZV_ENDPOINT": "m:1"}, "PET_NNODES='0:2'", id="nnodes"
        ),
        pytest.param(
            {"TRAINSTACK_NPROC_PER_NODE": "lots"}, "must be a positive integer", id="nproc"
        ),
        pytest.param({"VC_TASK_INDEX": "0"}, "missing VC_MASTER_HOSTS", id="volcano-no-svc"),
        pytest.param(
            {"VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": "j-master-0.j"},
            "hostname 'elsewhere' is not listed",
            id="volcano-foreign-host",
        ),
    ],
)
def test_node_plan_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyError) as info:
        node_plan(env, hostname="elsewhere")
    assert message in str(info.value)


def test_comm_timeout() -> None:
    assert comm_timeout({}).total_seconds() == 600
    assert comm_timeout({"TRAINSTACK_COMM_TIMEOUT_S": "5"}).total_seconds() == 5
    with pytest.raises(TopologyError):
        comm_timeout({"TRAINSTACK_COMM_TIMEOUT_S": "0"})
