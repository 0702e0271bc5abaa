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
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig, TeamStackConfig
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
    # The uid of the system namespace this deployment made: while the control plane still has
    # that namespace, nothing has reset it since (restore_platform).
    marker: str = ""

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
    deployed = Deployed(stack, cfg, plan, outcome, plane, _marker(plane.kube))
    _bring_up(deployed)
    return deployed


def _marker(kube: Kube) -> str:
    namespace = kube.get_or_none("v1", "Namespace", SYSTEM_NAMESPACE)
    return str(namespace["metadata"]["uid"]) if namespace is not None else ""


def _bring_up(platform: Deployed) -> None:
    """What follows the objects: Volcano's controller configuration, the simulated nodes, the
    discovered topology, the scheduler with the stack's configuration, the queues Open."""
    plane, cfg, plan = platform.plane, platform.cfg, platform.plan
    configmap = volcano_controller_configmap(plan)
    if configmap is not None:
        plane.kube.apply(configmap)
    deploy.simulate_nodes(plane.kube, cfg, plan)
    if topology.discovers(cfg):
        deploy.settle_discovered_topology(plane.kube, cfg.scheduling.topology.labels[-1])
    plane.restart_scheduler(scheduler_config(cfg))
    wait_for(f"{platform.stack}'s queues Open", lambda: _queues_open(plane.kube), timeout=60)
    plane.check()


def _queues_open(kube: Kube) -> bool:
    queues = kube.list("scheduling.volcano.sh/v1beta1", "Queue")
    return all(q.get("status", {}).get("state") == "Open" for q in queues)


# Cluster-scoped kinds whose objects steer admission or scheduling: one the plan does not hold
# (a test's own policy, priority class or queue) would change what the next tests see.
_STEERING = (
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    ("scheduling.volcano.sh/v1beta1", "Queue"),
)


def restore_platform(platform: Deployed) -> bool:
    """Bring the control plane back to `platform` as deployed, without a reset: for tests that
    share one deployment (tests/e2e/conftest.py `prod`). A reset waits for every namespace to
    be finalised (most of a deployment's time); this keeps the namespaces and the platform's
    objects, and removes or restores what tests change: every Volcano Job and Command, the
    team namespaces' pods and claims, the nodes (made again as simulated: labels, taints,
    cordons and added nodes all go), the default scheduler, then the plan applied again (what a test
    changed or deleted of it comes back) and the scheduler restarted with the stack's
    configuration.

    False, and nothing changed, when that is not enough: the control plane was reset since
    (another stack deployed), a namespace the tests made is there, a queue is not Open, or a
    steering object the plan does not hold exists. Then deploy anew."""
    kube = platform.kube
    if not platform.marker or _marker(kube) != platform.marker:
        return False
    if kube.list("v1", "Namespace", labels="e2e.trainstack.io/scratch") or not _queues_open(kube):
        return False
    planned = {
        (obj["kind"], obj["metadata"]["name"]) for _, obj in platform.plan.kubernetes_objects()
    }
    for api_version, kind in _STEERING:
        for obj in kube.list(api_version, kind):
            name = obj["metadata"]["name"]
            if (
                (kind, name) not in planned
                and not (kind == "Queue" and name in deploy.KEEP_QUEUES)
                and not name.startswith("system-")
            ):
                return False
    deploy.delete_jobs(kube)
    teams = {team.namespace for team in platform.cfg.registry.teams}

    # Removed at once, as a force deletion does: some linger Terminating on purpose
    # (kwok-stages.yaml, e2e.trainstack.io/linger), and their jobs are gone already.
    wait_for(
        "the team namespaces' pods to be gone",
        lambda: deploy.delete_pods_now(kube, teams),
        timeout=60,
        interval=0.5,
    )
    for claim in kube.list("v1", "PersistentVolumeClaim"):
        meta = claim["metadata"]
        if meta["namespace"] in teams and ("PersistentVolumeClaim", meta["name"]) not in planned:
            kube.delete("v1", "PersistentVolumeClaim", meta["name"], meta["namespace"])
    platform.plane.stop_default_scheduler()
    deploy.delete_nodes(kube)
    outcome = deploy.converge(kube, platform.plan)
    if outcome.errors:
        raise RuntimeError(f"{platform.stack}: objects never accepted again: {outcome.errors}")
    _bring_up(platform)
    return True


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
