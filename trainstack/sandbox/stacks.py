"""A platform stack and its team stacks deployed on a control plane (`cluster.ControlPlane`).

What the e2e fixtures (`prod`, `dev` in tests/e2e/conftest.py) and `trainstack sandbox up` both
do, so that the sandbox a person tries is the platform the scenarios test: the platform's plan
applied in the engine's order (`deploy.converge`), Volcano's controller ConfigMap written as the
chart renders it from the stack's values, its pools' nodes simulated, Volcano's scheduler
restarted with the stack's generated configuration, and the queues open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainstack.builders import topology
from trainstack.builders.scheduling import VOLCANO_CHART, scheduler_config
from trainstack.builders.teams import team_group
from trainstack.config.model import PlatformConfig, TeamStackConfig
from trainstack.kube import Identity, Kube, wait_for
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan
from trainstack.sandbox import deploy
from trainstack.sandbox.cluster import ControlPlane


@dataclass
class Deployed:
    """A platform stack applied to the control plane, its nodes created, its scheduler running."""

    stack: str
    cfg: PlatformConfig
    plan: Plan
    outcome: deploy.Outcome
    plane: ControlPlane

    @property
    def kube(self) -> Kube:
        return self.plane.kube

    def member(self, team: str) -> Identity:
        """A person of `team`, as EKS access entries or the IdP present them."""
        entry = next(t for t in self.cfg.registry.teams if t.name == team)
        return Identity(f"{team}-member@example.com", (team_group(entry), "system:authenticated"))


def deploy_platform(plane: ControlPlane, previewer: Previewer, stack: str) -> Deployed:
    """Reset the control plane, then deploy platform stack `stack` on it."""
    deploy.reset(plane.kube)
    cfg, _ = previewer.load(stack)
    if not isinstance(cfg, PlatformConfig):
        raise ValueError(f"{stack} is not a platform stack (trainstack:platform)")
    plan = previewer.preview(stack)
    outcome = deploy.converge(plane.kube, plan)
    if outcome.errors:
        raise RuntimeError(f"{stack}: objects never accepted: {outcome.errors}")
    configmap = volcano_controller_configmap(plan)
    if configmap is not None:
        plane.kube.apply(configmap)
    deploy.simulate_nodes(plane.kube, cfg, plan)
    if topology.discovers(cfg):
        deploy.settle_discovered_topology(plane.kube, cfg.scheduling.topology.labels[-1])
    plane.restart_scheduler(scheduler_config(cfg))

    def queues_open() -> bool:
        queues = plane.kube.list("scheduling.volcano.sh/v1beta1", "Queue")
        return all(q.get("status", {}).get("state") == "Open" for q in queues)

    wait_for(f"{stack}'s queues Open", queues_open, timeout=60)
    plane.check()
    return Deployed(stack, cfg, plan, outcome, plane)


def volcano_controller_configmap(plan: Plan) -> dict[str, Any] | None:
    """What Volcano's chart renders as its controller ConfigMap from the plan's values
    (templates/controllers.yaml: `<release>-controller-configmap` in the release's namespace,
    key volcano-controller.conf, `toYaml` of custom.controller_config_override). Helm releases
    are not applied here (deploy.py); Volcano's controller reads this one at start and on every
    change (builders/topology.py). None when the plan installs no Volcano (pre-installed)."""
    for resource in plan.resources:
        inputs = resource.inputs
        if (
            resource.type == "kubernetes:helm.sh/v3:Release"
            and inputs.get("chart") == VOLCANO_CHART["chart"]
        ):
            override = (
                (inputs.get("values") or {}).get("custom", {}).get("controller_config_override")
            )
            release = str(inputs["name"])
            return {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": topology.controller_configmap_name(release),
                    "namespace": inputs["namespace"],
                },
                "data": {topology.CONTROLLER_CONF_KEY: topology.controller_conf(override)},
            }
    return None


def team_stacks(previewer: Previewer, platform: str) -> list[str]:
    """The project's team stacks whose `platformStack` is `platform` (any organisation)."""
    found = []
    for name in previewer.project.stacks():
        cfg, _ = previewer.load(name)
        if isinstance(cfg, TeamStackConfig) and cfg.platform_stack_name == platform:
            found.append(name)
    return found


def deploy_team_stack(platform: Deployed, previewer: Previewer, stack: str) -> list[str]:
    """Create a team stack's objects (its jobs) as a member of the team, as `pulumi up` with
    the team's credentials would: admission checks them as it checks the team's own. Returns
    the created objects as `namespace/name`."""
    cfg, _ = previewer.load(stack)
    if not isinstance(cfg, TeamStackConfig):
        raise ValueError(f"{stack} is not a team stack (trainstack:team)")
    member = platform.member(cfg.team)
    created = []
    for _, obj in previewer.preview(stack).kubernetes_objects():
        body: dict[str, Any] = obj
        platform.kube.create(body, as_=member)
        meta = body["metadata"]
        created.append(f"{meta.get('namespace', '')}/{meta['name']}")
    return created
