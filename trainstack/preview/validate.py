"""`trainstack validate`: the preview's verdict on stack files and job specs, without plans.

A stack file in the project's stack folder is previewed in full, in memory (the real program
under the mock engine, cross-stack references, the job specs a team stack lists, the policy
pack), exactly as `trainstack preview` does; only the plan files and the summary are left
out. A job spec is checked against every team stack that lists it (or the one `--stack`
names): schema, its own rules, the platform (pool shape against the nodes' allocatable
resources, quota, storage) and the mandatory policy rules on the rendered Job. Files outside a
project are checked against their schemas and their own rules only, and say so.

Exit codes are the preview's: 1 for a config error, 3 for mandatory policy violations alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pulumi

from trainstack import yamlio
from trainstack.config import (
    ConfigError,
    ConfigIssue,
    PlatformConfig,
    TeamStackConfig,
    load_stack_file,
)
from trainstack.config.capacity import pool_blind_warnings
from trainstack.config.loader import stack_name_from_path
from trainstack.documents import document_kind
from trainstack.jobs.files import job_files
from trainstack.jobs.spec import JobSpec, advice, load_job, parse_job
from trainstack.preview import policy_config
from trainstack.preview.engine import Previewer

JOB_SPECS = "job_specs"  # job_specs/<team>/<job>.yaml (README, "Training jobs")


@dataclass
class Result:
    """What one file is, and what is wrong with it."""

    path: Path
    what: str = ""
    errors: list[ConfigError] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # mandatory policy findings
    notes: list[str] = field(default_factory=list)  # warnings: valid, but likely unexpected


@dataclass
class Validator:
    """Validates files of one project (None: no project, schemas and own rules only)."""

    previewer: Previewer | None
    stack: str | None = None  # --stack: check job specs against this team stack only
    _names: dict[tuple[str, str], Path] = field(default_factory=dict)

    def file(self, path: Path) -> Result:
        result = Result(path)
        try:
            if document_kind(yamlio.read(path), str(path)) == "job":
                self._job(path, result)
            else:
                self._stack(path, result)
        except (ConfigError, pulumi.RunError) as err:
            result.errors.append(err if isinstance(err, ConfigError) else _run_error(path, err))
        return result

    # --- stack files ---------------------------------------------------------------------
    def _stack(self, path: Path, result: Result) -> None:
        config = load_stack_file(path)  # schema and cross-field rules: a ConfigError here
        kind = "team" if isinstance(config, TeamStackConfig) else "platform"
        if isinstance(config, PlatformConfig):
            # Valid, but a confined team's guarantee may wait (issue 46 #5): a warning.
            result.notes += [str(issue) for issue in pool_blind_warnings(config)]
        name = self._stack_name(path)
        if name is None:
            result.what = f"{kind} stack; outside a project's stack folder: schema and rules only"
            return
        assert self.previewer is not None
        plan = self.previewer.preview(name)  # cross-stack, jobs, policies: as the preview
        if policy_config.stale(self.previewer, [name]):
            # A warning, not an error: the edit being validated is what made it stale, and
            # the preview that comes next rewrites it (issue 41 #2: it went stale silently).
            generated = policy_config.config_path(self.previewer, name)
            relative = generated.relative_to(self.previewer.project.root)
            result.notes.append(
                f"{relative} is missing or stale: the policy pack (`pulumi preview "
                "--policy-pack policies`) would judge by other settings than this stack "
                f"file's; `trainstack preview {name}` rewrites it (or `trainstack "
                f"policy-config {name}`): commit it with the stack file"
            )
        result.violations += [
            f"policy {v['rule']}: {v['resource']}: {v['message']}"
            for v in plan.mandatory_violations
        ]
        result.what = f"{kind} stack {name}, previewed: {len(plan.resources)} resources"

    def _stack_name(self, path: Path) -> str | None:
        """The stack a file in the project's stack folder is; None for any other file."""
        if self.previewer is None:
            return None
        project = self.previewer.project
        name = stack_name_from_path(path)
        if name and path.resolve().parent == project.stacks_dir.resolve():
            return name
        return None

    # --- job specs -----------------------------------------------------------------------
    def _job(self, path: Path, result: Result) -> None:
        spec, issues = parse_job(path)
        if spec is None:
            raise ConfigError(str(path), issues)
        issues += self._where(path, spec)
        stacks = [self.stack] if self.stack is not None else self._stacks_listing(path)
        fits = []
        policy: list[ConfigIssue] = []
        for stack in stacks:
            assert self.previewer is not None
            _, found, broken = self.previewer.job_issues(stack, path)
            issues += [i for i in found if i not in issues]
            policy += [i for i in broken if i not in policy]
            fits.append(stack)
        if issues:
            raise ConfigError(str(path), issues)
        result.violations += [str(issue) for issue in policy]
        result.notes += advice(load_job(path))
        if fits:
            result.what = f"job {spec.name}, fits stack {', '.join(fits)}"
        else:
            result.what = (
                f"job {spec.name}; no team stack lists it: schema and its own rules only "
                "(name one with --stack)"
            )

    def _where(self, path: Path, spec: JobSpec) -> list[ConfigIssue]:
        """What only the file's place says: its folder's team, and a name given twice."""
        issues = []
        folder = path.resolve().parent
        root = self.previewer.project.root.resolve() if self.previewer else None
        if root is not None and folder.parent == root / JOB_SPECS and folder.name != spec.team:
            issues.append(
                ConfigIssue(
                    "job.metadata.team",
                    f"{spec.team!r}, but the file is in {JOB_SPECS}/{folder.name}/, where team "
                    f"{folder.name}'s specs live; move it to {JOB_SPECS}/{spec.team}/ or set "
                    f"team: {folder.name}",
                )
            )
        key = (spec.team, spec.name)
        first = self._names.setdefault(key, path)
        if first != path:
            issues.append(
                ConfigIssue(
                    "job.metadata.name",
                    f"job {spec.name!r} of team {spec.team} is also defined in {first}; "
                    "one of them would replace the other: rename one",
                )
            )
        return issues

    def _stacks_listing(self, path: Path) -> list[str]:
        """The team stacks whose `jobs` globs match `path`."""
        if self.previewer is None:
            return []
        project, target = self.previewer.project, path.resolve()
        found = []
        for name in project.stacks():
            try:
                config, _ = self.previewer.load(name)
            except ConfigError:
                continue  # reported when that stack file is validated itself
            if isinstance(config, TeamStackConfig) and target in (
                p.resolve() for p in job_files(project.root, config.jobs)
            ):
                found.append(name)
        return found


def _run_error(path: Path, err: pulumi.RunError) -> ConfigError:
    return ConfigError(str(path), [ConfigIssue("program", str(err))])
