"""Every kind of rendered job may restart its workers in the pod (TRAINSTACK_MAX_RESTARTS in
the job's env): the runtime then plans the c10d rendezvous on the rendered endpoint, hosted
by exactly the pod that endpoint names (issue 22 #4; the real runs are in
tests/runtime/test_restart_rendezvous.py)."""

from __future__ import annotations

import pytest
from trainstack_runtime.topology import node_plan, restartable

from tests.jobs.test_topology import VARIANTS, _gpus, volcano_env
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.preview.plan import Plan


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_jobs_restart_on_c10d_hosted_by_the_endpoint_pod(
    variant: str, example_plans: dict[str, Plan]
) -> None:
    manifest = render(VARIANTS[variant](), PlatformView(example_plans["prod"].outputs), "vision")
    job = manifest["metadata"]["name"]
    plans = {}
    for task in manifest["spec"]["tasks"]:
        for index in range(task["replicas"]):
            pod = f"{job}-{task['name']}-{index}"
            env = {**volcano_env(manifest, task, index), "TRAINSTACK_MAX_RESTARTS": "2"}
            plan = node_plan(env, gpus=_gpus(task), hostname=pod)
            plans[pod] = restartable(plan, 2, env)
    assert {p.rdzv_backend for p in plans.values()} == {"c10d"}
    assert {p.num_nodes for p in plans.values()} == {len(plans)}
    (host,) = (pod for pod, p in plans.items() if p.store_host)
    endpoint = next(iter(plans.values())).rdzv_endpoint
    assert endpoint.rsplit(":", 1)[0] == f"{host}.{job}"
