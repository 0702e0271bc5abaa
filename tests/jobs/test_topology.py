"""Every kind of rendered job starts: the runtime's topology planning, run on the environment
each of its pods gets from the renderer and Volcano's plugins, gives one consistent world.

Issue 22 #7: parameter-server jobs named a `master` task they do not have, so every pod's
supervisor stopped with a config error (exit 2, AbortJob) before training.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pytest
from trainstack_runtime.topology import NodePlan, node_plan

from tests.conftest import ROOT
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import JobSpec, load_job
from trainstack.preview.plan import Plan

SPECS = sorted((ROOT / "job_specs").glob("**/*.yaml"))
DEMO = ROOT / "job_specs" / "vision" / "demo-train.yaml"
PS = ROOT / "job_specs" / "vision" / "embeddings-ps.yaml"
JOB_UID = "0c5e8a8e-7d4b-4f7e-9c51-2b1f6f1d9a10"


def _replicas(spec: JobSpec, workers: int, gpus: int | None = None) -> JobSpec:
    shape = dataclasses.replace(spec.workers, replicas=workers, gpus=gpus or spec.workers.gpus)
    return dataclasses.replace(spec, workers=shape)


def _one_server(spec: JobSpec) -> JobSpec:
    assert spec.parameter_servers is not None
    servers = dataclasses.replace(spec.parameter_servers, replicas=1)
    return dataclasses.replace(spec, parameter_servers=servers)


# Every example with a fixed number of workers (elastic ones plan a range: tests/jobs/
# test_elastic.py), and each job kind the tests use: data parallel with one pod (a master task
# alone) or several processes per pod, parameter servers with one server.
VARIANTS: dict[str, Callable[[], JobSpec]] = {
    **{
        p.stem: functools.partial(load_job, p)
        for p in SPECS
        if not load_job(p).workers.scale.elastic
    },
    "data-parallel-one-pod": lambda: _replicas(load_job(DEMO), 1),
    "data-parallel-4x2": lambda: _replicas(load_job(DEMO), 4, 2),
    "parameter-server-one-server": lambda: _one_server(load_job(PS)),
}


def _task_env(name: str) -> str:
    return name.upper().replace("-", "_")


def volcano_env(manifest: dict[str, Any], task: dict[str, Any], index: int) -> dict[str, str]:
    """The trainer's environment in pod `index` of `task`: the rendered values (the downward
    API's from the annotations Volcano gives the pod), then what Volcano v1.15.1's job
    plugins add (docs: shared/reference/volcano/FACTS.md, section 1):
    `env` (pkg/controllers/job/plugins/env: VC_TASK_INDEX, VK_TASK_INDEX), `svc`
    (plugins/svc: VC_<TASK>_HOSTS and VC_<TASK>_NUM for every task) and `pytorch`
    (plugins/distributed-framework/pytorch: MASTER_ADDR, MASTER_PORT, WORLD_SIZE counting the
    master and worker pods, RANK 0 for the master, index + 1 for workers, none for others)."""
    job = manifest["metadata"]["name"]
    plugins = manifest["spec"]["plugins"]
    tasks = manifest["spec"]["tasks"]
    annotations = {  # the job controller's (job_controller_util.go createJobPod)
        "scheduling.k8s.io/group-name": f"{job}-{JOB_UID}",
        "volcano.sh/task-index": str(index),
        "volcano.sh/job-retry-count": "0",
    }
    env: dict[str, str] = {}
    for e in task["template"]["spec"]["containers"][0]["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:  # the downward API: the node's IP, or from the annotations
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path == "status.hostIP":
                env[e["name"]] = "10.0.0.7"
                continue
            env[e["name"]] = annotations[path.removeprefix("metadata.annotations['")[:-2]]
    if "env" in plugins:
        env["VC_TASK_INDEX"] = env["VK_TASK_INDEX"] = str(index)
    if "svc" in plugins:
        for t in tasks:
            hosts = [f"{job}-{t['name']}-{i}.{job}" for i in range(t["replicas"])]
            env[f"VC_{_task_env(t['name'])}_HOSTS"] = ",".join(hosts)
            env[f"VC_{_task_env(t['name'])}_NUM"] = str(len(hosts))
    if "pytorch" in plugins:
        args = dict(a.removeprefix("--").split("=", 1) for a in plugins["pytorch"])
        replicas = {t["name"]: t["replicas"] for t in tasks}
        if args["master"] in replicas:  # else the plugin does nothing (pytorch.go)
            env["MASTER_ADDR"] = f"{job}-{args['master']}-0.{job}"
            env["MASTER_PORT"] = args["port"]
            env["WORLD_SIZE"] = str(replicas[args["master"]] + replicas.get(args["worker"], 0))
            if task["name"] == args["master"]:
                env["RANK"] = "0"
            elif task["name"] == args["worker"]:
                env["RANK"] = str(index + 1)
    return env


def _gpus(task: dict[str, Any]) -> int:
    limits = task["template"]["spec"]["containers"][0]["resources"]["limits"]
    return int(limits.get("nvidia.com/gpu", 0))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_of_every_job_kind_plans_one_world(
    variant: str, example_plans: dict[str, Plan]
) -> None:
    manifest = render(VARIANTS[variant](), PlatformView(example_plans["prod"].outputs), "vision")
    job = manifest["metadata"]["name"]
    plans: dict[str, NodePlan] = {}
    for task in manifest["spec"]["tasks"]:
        for index in range(task["replicas"]):
            pod = f"{job}-{task['name']}-{index}"  # the svc plugin's hostname
            env = volcano_env(manifest, task, index)
            plans[pod] = node_plan(env, gpus=_gpus(task), hostname=pod)
            command = task["template"]["spec"]["containers"][0]["command"]
            nproc = int(command[command.index("--nproc-per-node") + 1])
            assert plans[pod].nproc_per_node == nproc, pod
    assert {p.num_nodes for p in plans.values()} == {len(plans)}
    assert sorted(p.node_rank or 0 for p in plans.values()) == list(range(len(plans)))
    assert len({p.rdzv_endpoint for p in plans.values()}) == 1
    assert {p.rdzv_backend for p in plans.values()} == {"static"}
    (first,) = (pod for pod, p in plans.items() if p.node_rank == 0)
    endpoint = next(iter(plans.values())).rdzv_endpoint
    assert endpoint.rsplit(":", 1)[0] == f"{first}.{job}", "rendezvous on node rank 0's pod"
