"""The stacks the three enforcers are held to one verdict on.

A copy of the project (program, stack files, job specs) with, beside the example stacks:

- variants whose settings the examples leave at their defaults: `dev-advisory` (a looser CPU
  ratio, an allowed registry, rules lowered to advisory), `prod-strict` (an allowed registry
  the demo image is not from), `prod-open` (prod's API endpoint open to the internet, a
  mandatory finding of a platform stack) and `lab` (onprem with a second team: onprem's
  advisory finding, over Kubernetes objects only). Until issue 37 `lab`'s two teams' Lustre
  PVs shared one handle, a mandatory finding; the loader now refuses an operator's handle
  without `{path}`, so no configuration reaches that rule any more;
- a team stack per platform with the demo job on one of its pools (`vision-dev`,
  `vision-dev-advisory`, `speech`, `vision-strict`): rendered by the platform's own renderer,
  that job is the base object of a stack's table.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from trainstack.config import PlatformConfig, TeamStackConfig
from trainstack.config.project import Project
from trainstack.policy.admission import POLICY_PREFIX
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan
from trainstack.preview.policy_config import platform_config

Settings = dict[str, Any]


def _policy(**values: Any) -> Callable[[Settings], None]:
    def change(platform: Settings) -> None:
        platform.setdefault("policy", {}).update(values)

    return change


def _second_team(platform: Settings) -> None:
    platform["registry"]["teams"].append(
        {"name": "asr", "owners": ["asr-lead@example.com"], "quota": {"gpus": 8}}
    )


def _open_endpoint(platform: Settings) -> None:
    platform["aws"]["cluster"]["endpoint"]["publicAccessCidrs"] = ["0.0.0.0/0"]


# variant -> (example it copies, change to its trainstack:platform settings)
PLATFORM_VARIANTS: dict[str, tuple[str, Callable[[Settings], None]]] = {
    "dev-advisory": (
        "dev",
        _policy(
            maxCpuLimitRequestRatio=4,
            allowedRegistries=["registry.example.com/"],
            advisory=["pinned-images", "shm-sized", "request-limit-ratio"],
        ),
    ),
    "prod-strict": ("prod", _policy(allowedRegistries=["trusted.example.com/"])),
    "lab": ("onprem", _second_team),
    "prod-open": ("prod", _open_endpoint),
}
# team stack -> (team, platform stack, job spec folder under job_specs/)
TEAM_STACKS: dict[str, tuple[str, str, str]] = {
    "vision-dev": ("vision", "dev", "vision-dev"),
    "vision-dev-advisory": ("vision", "dev-advisory", "vision-dev"),
    "speech": ("speech", "onprem", "speech"),
    "vision-strict": ("vision", "prod-strict", "vision"),
}
# job spec folder -> (team, pool) of the demo job copied into it
DEMO_COPIES = {"vision-dev": ("vision", "l40s-dev"), "speech": ("speech", "a100-roce")}
# stack whose table it is -> the team stack whose demo job is the table's base object
TABLE_BASES = {
    "dev": "vision-dev",
    "onprem": "speech",
    "prod": "vision",
    "vision": "vision",
    "dev-advisory": "vision-dev-advisory",
}
TABLE_STACKS = list(TABLE_BASES)


def make_project(dest: Path) -> Path:
    """The project copy with the variants, team stacks and job specs above."""
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "stacks", dest / "stacks")
    shutil.copytree(ROOT / "job_specs", dest / "job_specs")
    for variant, (source, change) in PLATFORM_VARIANTS.items():
        document = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{source}.yaml").read_text())
        change(document["config"]["trainstack:platform"])
        (dest / "stacks" / f"Pulumi.{variant}.yaml").write_text(yaml.safe_dump(document))
    demo = yaml.safe_load((ROOT / "job_specs" / "vision" / "demo-train.yaml").read_text())
    for folder, (team, pool) in DEMO_COPIES.items():
        spec = copy.deepcopy(demo)
        spec["metadata"]["team"] = team
        spec["spec"]["pool"] = pool
        spec["spec"]["image"] = spec["spec"]["image"].replace("/vision/", f"/{team}/")
        (dest / "job_specs" / folder).mkdir()
        (dest / "job_specs" / folder / "demo-train.yaml").write_text(yaml.safe_dump(spec))
    for stack, (team, platform, folder) in TEAM_STACKS.items():
        team_stack = {
            "team": team,
            "platformStack": f"organization/trainstack/{platform}",
            "jobs": [f"job_specs/{folder}/*.yaml"],
        }
        (dest / "stacks" / f"Pulumi.{stack}.yaml").write_text(
            yaml.safe_dump({"config": {"trainstack:team": team_stack}})
        )
    return dest


@dataclass(frozen=True)
class Judged:
    """What each enforcer judges a stack's objects by."""

    stack: str
    cfg: PlatformConfig  # the platform's settings (a team stack's: its platform's)
    platform: Plan  # the platform stack's plan: its admission policies and namespaces
    team: str
    job: dict[str, Any]  # the table's base object, a rendered Volcano Job of that team

    def namespace(self) -> dict[str, Any]:
        """The team's Namespace as the platform creates it (CEL's namespaceObject)."""
        return next(
            obj
            for _, obj in self.platform.kubernetes_objects()
            if obj["kind"] == "Namespace" and obj["metadata"]["name"] == self.team
        )

    def admission(self) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """rule -> (ValidatingAdmissionPolicy, its binding), as the platform installs them."""
        objects = [obj for _, obj in self.platform.kubernetes_objects()]
        policies = {
            o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
        }
        bindings = {
            o["spec"]["policyName"]: o
            for o in objects
            if o["kind"] == "ValidatingAdmissionPolicyBinding"
        }
        return {
            name.removeprefix(POLICY_PREFIX): (policy, bindings[name])
            for name, policy in policies.items()
            if name.startswith(POLICY_PREFIX)
        }


def demo_job(plan: Plan) -> dict[str, Any]:
    job = next(r for r in plan.resources if r.type.endswith(":Job") and r.name.endswith("-volcano"))
    return copy.deepcopy(job.inputs)


def judged(previewer: Previewer, stack: str) -> Judged:
    cfg = platform_config(previewer, stack)
    team_plan = previewer.preview(TABLE_BASES[stack])
    config, _ = previewer.load(TABLE_BASES[stack])
    assert isinstance(config, TeamStackConfig)
    return Judged(stack, cfg, previewer.preview(cfg.stack), config.team, demo_job(team_plan))


def previewer(dest: Path) -> Previewer:
    return Previewer(Project.find(make_project(dest)))
