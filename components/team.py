"""A team stack: binds to the platform stack's cluster and the team's namespace."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.jobs import TrainingJob, TrainingJobArgs
from trainstack import outputs as out
from trainstack.config.model import TeamStackConfig
from trainstack.jobs.spec import JobSpec


class UnknownTeamError(pulumi.RunError):
    """The team stack names a team the platform's registry does not have."""


def check_team(config: TeamStackConfig, registry: Any) -> str:
    """Return the team's namespace from the platform registry, or raise a clean error."""
    teams = {t["name"]: t for t in (registry or {}).get("teams", [])}
    if config.team not in teams:
        known = ", ".join(sorted(teams)) or "none"
        raise UnknownTeamError(
            f"trainstack:team.team: team {config.team!r} is not in the registry of platform "
            f"stack {config.platform_stack} (teams: {known}); add it to that stack's "
            "registry.teams or fix the name"
        )
    return str(teams[config.team]["namespace"])


class TeamStack(pulumi.ComponentResource):
    """Reads the platform's outputs; the team's jobs (later) are created under it."""

    namespace: pulumi.Output[str]
    k8s_provider: k8s.Provider

    def __init__(
        self,
        name: str,
        args: TeamStackConfig,
        opts: pulumi.ResourceOptions | None = None,
        jobs: tuple[JobSpec, ...] = (),
    ) -> None:
        super().__init__("trainstack:team:TeamStack", name, None, opts)
        platform = pulumi.StackReference(
            f"{name}-platform",
            stack_name=args.platform_stack,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.platform = platform
        self.namespace = platform.require_output(out.REGISTRY).apply(
            lambda registry: check_team(args, registry)
        )
        kubeconfig = platform.get_output(out.KUBECONFIG)
        context = platform.get_output(out.KUBE_CONTEXT)
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=kubeconfig,
            context=context,
            namespace=self.namespace,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Only the outputs jobs need: the whole map would be secret (kubeconfig).
        keys = (out.REGISTRY, out.GPU_POOLS, out.SCHEDULING, out.STORAGE)
        platform_outputs = pulumi.Output.all(*(platform.get_output(k) for k in keys)).apply(
            lambda values: dict(zip(keys, values, strict=True))
        )
        self.jobs = [
            TrainingJob(
                f"{name}-{spec.name}",
                TrainingJobArgs(spec, args.team, platform_outputs, self.k8s_provider),
                pulumi.ResourceOptions(parent=self, depends_on=[self.k8s_provider]),
            )
            for spec in jobs
        ]
        self.register_outputs({"namespace": self.namespace})
