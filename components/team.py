"""A team stack: binds to the platform stack's cluster and the team's namespace."""

from __future__ import annotations

import asyncio
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainstack import outputs as out
from trainstack.components.jobs import TrainingJob, TrainingJobArgs
from trainstack.config.model import TeamStackConfig
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.spec import JobSpec


class UnknownTeamError(pulumi.RunError):
    """The team stack names a team the platform's registry does not have."""


def check_team(config: TeamStackConfig, view: PlatformView) -> str:
    """Return the team's namespace from the platform outputs, or raise a clean error."""
    team = view.team(config.team)
    namespaces = view.outputs.get(out.TEAM_NAMESPACES) or {}
    if team is None and config.team in namespaces:
        raise UnknownTeamError(
            f"trainstack:team.team: platform stack {config.platform_stack} has team "
            f"{config.team!r} but no {out.team_output(config.team)!r} output: an older "
            "trainstack deployed it; run `pulumi up` on the platform stack first"
        )
    if team is None:
        known = ", ".join(sorted(namespaces)) or "none"
        raise UnknownTeamError(
            f"trainstack:team.team: team {config.team!r} is not in the registry of platform "
            f"stack {config.platform_stack} (teams: {known}); add it to that stack's "
            "registry.teams or fix the name"
        )
    return str(team["namespace"])


async def _output_is_secret(ref: pulumi.StackReference, key: str) -> bool:
    names = ref.secret_output_names
    if await names.is_known():
        return key in (await names.future() or [])
    return await ref.outputs.is_secret()


def stack_output(ref: pulumi.StackReference, key: str) -> pulumi.Output[Any]:
    """`ref.get_output(key)` without lifting every platform output into nested Outputs.

    StackReference.get_output runs Output.all over the whole outputs map, which wraps every
    nested value of every output in its own Output: O(size of all outputs) per call, so
    O(teams) per team stack and O(teams^2) for an organisation's previews.
    """
    value = ref.outputs.apply(lambda outputs: (outputs or {}).get(key))
    secret = asyncio.ensure_future(_output_is_secret(ref, key))
    return pulumi.Output(value.resources(), value.future(), value.is_known(), secret)


class TeamStack(pulumi.ComponentResource):
    """Reads the platform's outputs; the team's jobs (later) are created under it."""

    namespace: pulumi.Output[str]
    limits: pulumi.Output[dict[str, Any]]
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
        # One typed view of the outputs jobs need: the shared ones and this team's slice.
        # It is not a dict, so Pulumi does not lift every nested value into its own Output.
        # Those outputs are not secret by contract (only the kubeconfig is, read below).
        keys = (
            out.GPU_POOLS,
            out.STORAGE,
            out.MONITORING,  # gpuEvidencePort: where jobs read their node's GPU evidence
            out.TEAM_NAMESPACES,
            out.team_output(args.team),
        )
        # Unsecret the view, not the outputs map: every Output made from a map is walked
        # whole for unknowns (pulumi output.py `_OutputData.__post_init__`), and the map
        # grows with the organisation's teams; the view is one object.
        view = pulumi.Output.unsecret(
            platform.outputs.apply(
                lambda outputs: PlatformView({k: (outputs or {}).get(k) for k in keys})
            )
        )
        self.namespace = view.apply(lambda v: check_team(args, v))
        self.limits = view.apply(lambda v: out.team_limits(v.team(args.team) or {}))
        kubeconfig = stack_output(platform, out.KUBECONFIG)
        context = stack_output(platform, out.KUBE_CONTEXT)
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=kubeconfig,
            context=context,
            namespace=self.namespace,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.jobs = [
            TrainingJob(
                f"{name}-{spec.name}",
                TrainingJobArgs(spec, args.team, view, self.k8s_provider),
                pulumi.ResourceOptions(parent=self, depends_on=[self.k8s_provider]),
            )
            for spec in jobs
        ]
        self.register_outputs({"namespace": self.namespace})
