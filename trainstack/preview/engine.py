"""`trainstack preview`: stack file -> config check -> in-process synth -> plan on disk."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainstack import outputs
from trainstack.config import (
    ConfigError,
    ConfigIssue,
    PlatformConfig,
    StackConfig,
    TeamStackConfig,
    parse_stack_config,
    read_stack_file,
)
from trainstack.config import loader as config_loader
from trainstack.config.errors import did_you_mean
from trainstack.config.project import Project
from trainstack.jobs import render as render_module
from trainstack.jobs import spec as spec_module
from trainstack.jobs.checks import platform_issues
from trainstack.jobs.files import collect_jobs
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import parse_job
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.pack import evaluate
from trainstack.policy.settings import levels, pack_config
from trainstack.preview.plan import Plan
from trainstack.preview.synth import PROJECT, synth

# The job spec field behind each rule's findings on a rendered Job (what the author changes).
POLICY_FIELDS = {
    "request-limit-ratio": "job.spec.workers.limits",
    "devices-requests-equal-limits": "job.spec.workers",
    "max-duration": "job.spec.maxDurationHours",
    "checkpoint-volume": "job.spec.checkpoint",
    "pinned-images": "job.spec.image",
    "gpu-placement": "job.spec.pool",
    "own-queue": "job.metadata.team",
    "volcano-scheduled": "job.metadata.team",
    "shared-filesystem-subpaths": "job.spec.data",
    "shm-sized": "job.spec.sharedMemory",
    "no-privileged": "job.spec.pool",
}


def forget_parsed() -> None:
    """Drop what this process remembers of files and documents it parsed (stack configs, job
    specs, rendered spec text, decoded team slices): the next preview parses as a new process
    would. For benchmarks that repeat a first preview; a preview itself never needs it (the
    caches are keyed by content or by file version)."""
    config_loader.forget_parsed()
    spec_module.forget_parsed()
    render_module.spec_json.cache_clear()
    outputs.forget_decoded()


# The parts of a preview, in order: the stack file parsed and checked; a team stack's job specs
# parsed and checked against its platform; the program under the mock engine; the plan made
# from what it registered; the policy pack over the plan.
PHASES = ("load", "jobs", "program", "plan", "policy")


@dataclass
class Previewer:
    """Previews stacks of one project; platform previews are cached for team stacks."""

    project: Project
    _plans: dict[str, Plan] = field(default_factory=dict)
    # Parsed stack files: every team stack reads its platform's config, and parsing and
    # checking a large platform once per team stack made previews quadratic in teams.
    _configs: dict[str, tuple[StackConfig, dict[str, Any]]] = field(default_factory=dict)
    # CPU seconds per part of every preview so far (PHASES): where a preview's time goes
    # (`make bench-preview` prints it).
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.process_time()
        try:
            yield
        finally:
            self.phase_s[name] += time.process_time() - started

    def load(self, stack: str) -> tuple[StackConfig, dict[str, Any]]:
        if stack not in self._configs:
            self._configs[stack] = self._load(stack)
        return self._configs[stack]

    def _load(self, stack: str) -> tuple[StackConfig, dict[str, Any]]:
        path = self.project.stack_file(stack)
        if not path.is_file():
            known = self.project.stacks()
            raise ConfigError(
                str(path),
                [
                    ConfigIssue(
                        "stack",
                        f"no stack file for {stack!r}{did_you_mean(stack, known)}; "
                        f"stacks: {', '.join(known) or 'none'}",
                    )
                ],
            )
        values = read_stack_file(path)
        return parse_stack_config(values, stack=stack, source=str(path)), values

    def preview(self, stack: str) -> Plan:
        if stack in self._plans:
            return self._plans[stack]
        with self._phase("load"):
            config, values = self.load(stack)
        stack_outputs: dict[str, tuple[dict[str, Any], list[str]]] = {}
        region = "us-east-1"
        spec_files: dict[str, str] = {}
        if isinstance(config, TeamStackConfig):
            platform_plan = self._platform_for(config)  # its own preview's phases, if not done
            with self._phase("jobs"):
                spec_files = self.check_jobs(config, platform_plan)
            stack_outputs[config.platform_stack] = platform_plan.as_referenced()
        elif isinstance(config, PlatformConfig) and config.aws is not None:
            region = config.aws.region
        with self._phase("program"):
            result = synth(
                self.project.root, stack, values, region=region, stack_outputs=stack_outputs
            )
        with self._phase("plan"):
            kind = "platform" if isinstance(config, PlatformConfig) else "team"
            plan = Plan.from_synth(result, kind)
        with self._phase("policy"):
            plan = replace(plan, violations=self._policy(config, plan, spec_files))
        self._plans[stack] = plan
        return plan

    def _policy(
        self, config: StackConfig, plan: Plan, spec_files: dict[str, str]
    ) -> tuple[dict[str, str], ...]:
        """The policy pack over the plan, configured from the (referenced) platform stack;
        `spec_files` (job name -> spec file) names a job finding's spec."""
        platform = config
        if isinstance(config, TeamStackConfig):
            platform, _ = self.load(config.platform_stack_name)
        assert isinstance(platform, PlatformConfig)
        custom = [r for r in plan.resources if r.custom]
        found = evaluate(
            [(r.type, r.name, r.inputs) for r in custom],
            pack_config(platform),
            levels(platform),
            {r.ref: r.property_dependencies for r in custom if r.property_dependencies},
        )
        violations = [v.to_json() for v in sorted(found, key=lambda v: (v.rule, v.resource))]
        # A job's finding names the spec the user wrote, not its Pulumi resource
        # (`team-vision-vit-fsdp-volcano`, issue 41 #4).
        jobs = {
            r.name: spec_files.get(r.inputs.get("metadata", {}).get("name"))
            for r in custom
            if r.type == VOLCANO_JOB
        }
        for v in violations:  # beside the resource, which the policy host also names
            if source := jobs.get(v["resource"]):
                v["source"] = source
        return tuple(violations)

    def check_jobs(self, config: TeamStackConfig, platform_plan: Plan) -> dict[str, str]:
        """Every job of the team stack against the platform, all problems at once; each
        job's spec file (name -> path relative to the project) when there is none."""
        specs, issues = collect_jobs(self.project.root, config.jobs)
        view = PlatformView(platform_plan.outputs)
        for spec in specs:
            relative = Path(spec.source).relative_to(self.project.root)
            issues += [
                ConfigIssue(f"{relative}: {i.path}", i.message)
                for i in platform_issues(spec, view, config.team)
            ]
        if issues:
            raise ConfigError(f"stack {config.stack}", issues)
        return {s.name: str(Path(s.source).relative_to(self.project.root)) for s in specs}

    def render_job(self, stack: str, spec_path: Path) -> dict[str, Any]:
        """The Volcano Job a team stack would create for one spec (`trainstack render-job`),
        or one ConfigError with every problem: schema, intrinsic, platform and policy."""
        manifest, issues, policy = self.job_issues(stack, spec_path)
        if issues or policy or manifest is None:
            raise ConfigError(str(spec_path), [*issues, *policy])
        return manifest

    def job_issues(
        self, stack: str, spec_path: Path
    ) -> tuple[dict[str, Any] | None, list[ConfigIssue], list[ConfigIssue]]:
        """One spec against a team stack's platform, in one pass: the rendered Job (None if it
        cannot be rendered), every config problem the preview would report for it, and the
        mandatory policy rules it breaks (apart: the preview's exit code for them is 3), so
        `validate` and the preview agree."""
        config, _ = self.load(stack)
        if not isinstance(config, TeamStackConfig):
            raise ConfigError(
                str(self.project.stack_file(stack)),
                [ConfigIssue("stack", f"{stack!r} is a platform stack; name a team stack")],
            )
        platform_plan = self._platform_for(config)
        spec, issues = parse_job(spec_path)
        if spec is None:
            return None, issues, []
        view = PlatformView(platform_plan.outputs)
        found = platform_issues(spec, view, config.team)
        if found:
            return None, [*issues, *found], []
        manifest = render(spec, view, config.team)
        platform, _ = self.load(config.platform_stack_name)
        assert isinstance(platform, PlatformConfig)
        violations = evaluate(
            [(VOLCANO_JOB, spec.name, manifest)], pack_config(platform), levels(platform)
        )
        # Each finding names the spec field it comes from; a field that already has an error
        # (an unpinned image, say) is not reported twice.
        named = {issue.path for issue in issues}
        policy = [
            ConfigIssue(field, f"policy {v.rule}: {v.message}")
            for v in violations
            if v.level == "mandatory"
            and (field := POLICY_FIELDS.get(v.rule, "job.spec")) not in named
        ]
        return manifest, issues, policy

    def _platform_for(self, config: TeamStackConfig) -> Plan:
        org, project, name = config.platform_stack.split("/")
        del org  # any organisation: offline, the stack file is the platform stack
        source = str(self.project.stack_file(config.stack))
        if project != PROJECT:
            raise ConfigError(
                source,
                [
                    ConfigIssue(
                        "trainstack:team.platformStack",
                        f"project {project!r} is not this project ({PROJECT!r}); "
                        f"use <org>/{PROJECT}/<stack>",
                    )
                ],
            )
        if not self.project.stack_file(name).is_file():
            known = self.project.stacks()
            raise ConfigError(
                source,
                [
                    ConfigIssue(
                        "trainstack:team.platformStack",
                        f"{config.platform_stack!r} names stack {name!r}, which has no stack "
                        f"file here{did_you_mean(name, known)} (stacks: "
                        f"{', '.join(known) or 'none'}); point it at the platform stack",
                    )
                ],
            )
        platform_config, _ = self.load(name)
        if not isinstance(platform_config, PlatformConfig):
            raise ConfigError(
                source,
                [
                    ConfigIssue(
                        "trainstack:team.platformStack",
                        f"{config.platform_stack!r} is a team stack; point to a platform stack",
                    )
                ],
            )
        if platform_config.registry.team(config.team) is None:
            names = [t.name for t in platform_config.registry.teams]
            raise ConfigError(
                source,
                [
                    ConfigIssue(
                        "trainstack:team.team",
                        f"team {config.team!r} is not in the registry of platform stack "
                        f"{name!r}{did_you_mean(config.team, names)} (teams: {', '.join(names)}); "
                        "add it there or fix the name",
                    )
                ],
            )
        return self.preview(name)
