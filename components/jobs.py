"""A training job in a team stack: its job spec rendered against the platform's outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainstack.config.errors import ConfigError
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import JobSpec


def render_or_fail(spec: JobSpec, view: PlatformView, team: str) -> dict[str, Any]:
    try:
        return render(spec, view, team)
    except ConfigError as err:
        # Inside an apply: RunError keeps Pulumi's report to the message itself.
        raise pulumi.RunError(str(err)) from None


@dataclass(frozen=True)
class TrainingJobArgs:
    spec: JobSpec
    team: str
    platform: pulumi.Output[PlatformView]
    k8s_provider: pulumi.ProviderResource


class TrainingJob(pulumi.ComponentResource):
    """One Volcano Job, exactly what `trainstack render-job` prints for the same spec."""

    def __init__(
        self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:team:TrainingJob", name, None, opts)
        manifest = args.platform.apply(lambda view: render_or_fail(args.spec, view, args.team))
        self.job = k8s.apiextensions.CustomResource(
            f"{name}-volcano",
            api_version="batch.volcano.sh/v1alpha1",
            kind="Job",
            metadata=manifest.apply(lambda m: m["metadata"]),
            spec=manifest.apply(lambda m: m["spec"]),
            opts=pulumi.ResourceOptions(parent=self, provider=args.k8s_provider),
        )
        self.register_outputs({"name": args.spec.name})
