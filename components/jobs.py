"""A training job in a team stack: its job spec rendered against the platform's outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from trainstack.components.kube import resource_token
from trainstack.config.errors import ConfigError
from trainstack.jobs.lifecycle import replacement_key
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import API_VERSION, job_metadata, job_spec
from trainstack.jobs.spec import JobSpec


def spec_or_fail(spec: JobSpec, view: PlatformView, team: str) -> dict[str, Any]:
    """The Job's spec for its Output, its tasks handed over as a tuple.

    The SDK walks every dict and list of an apply's result for unknown values, twice: when
    the result resolves and again when the resource's inputs are serialised (pulumi 3.272.0
    output.py `_OutputData.__post_init__` and runtime/rpc.py `serialize_property`, both through
    rpc.contains_unknowns, which descends into dicts and lists only). A rendered spec cannot
    hold one: it is computed from known values. The tasks are nine tenths of it; as a tuple,
    which serialize_property sends as a list like any Sequence, the walk stops at the
    spec's top level, and the engine receives the same document.
    """
    try:
        rendered = job_spec(spec, view, team)
    except ConfigError as err:
        # Inside an apply: RunError keeps Pulumi's report to the message itself.
        raise pulumi.RunError(str(err)) from None
    rendered["tasks"] = tuple(rendered["tasks"])
    return rendered


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
        # The metadata comes from the spec alone; only the spec waits for the platform's
        # outputs. Same document as render() (`trainstack render-job`), without lifting the
        # whole manifest through extra Outputs.
        spec = args.platform.apply(lambda view: spec_or_fail(args.spec, view, args.team))
        # Registered under its token like every platform manifest (components/kube.py): the
        # typed class would only translate these wire names back and forth.
        self.job = pulumi.CustomResource(
            resource_token(API_VERSION, "Job"),
            f"{name}-volcano",
            {
                "apiVersion": API_VERSION,
                "kind": "Job",
                "metadata": job_metadata(args.spec),
                "spec": spec,
            },
            pulumi.ResourceOptions(
                parent=self,
                provider=args.k8s_provider,
                # Volcano refuses most updates of a Job (jobs/lifecycle.fixed_part): replace it
                # when one of those fields changes, update it in place otherwise. Its name is
                # fixed, so the old Job must go before the new one is created.
                replacement_trigger=spec.apply(replacement_key),
                delete_before_replace=True,
            ),
        )
        self.register_outputs({"name": args.spec.name})
