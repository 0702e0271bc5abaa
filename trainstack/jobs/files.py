"""Finding a team stack's job specs and loading them all, every error at once."""

from __future__ import annotations

from pathlib import Path

from trainstack.config.errors import ConfigError, ConfigIssue
from trainstack.jobs.spec import JobSpec, parse_job
from trainstack.yamlio import YamlSyntaxError


def job_files(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Spec files matched by the stack's globs, sorted and de-duplicated."""
    return _matched(root, patterns)[0]


def _matched(root: Path, patterns: tuple[str, ...]) -> tuple[list[Path], list[str]]:
    """`job_files`, and the patterns that match no file: one walk of the folders."""
    found: dict[Path, None] = {}
    unmatched: list[str] = []
    for pattern in patterns:
        paths = sorted(root.glob(pattern))
        if not paths:
            unmatched.append(pattern)
        for path in paths:
            found.setdefault(path, None)
    return list(found), unmatched


def load_jobs(root: Path, patterns: tuple[str, ...], source: str) -> list[JobSpec]:
    """Every spec, or one ConfigError listing the problems of all of them."""
    specs, issues = collect_jobs(root, patterns)
    if issues:
        raise ConfigError(source, issues)
    return specs


def collect_jobs(root: Path, patterns: tuple[str, ...]) -> tuple[list[JobSpec], list[ConfigIssue]]:
    """The specs that could be built (even with intrinsic problems, so platform checks run on
    them too), and every problem found (paths prefixed by file)."""
    specs: list[JobSpec] = []
    issues: list[ConfigIssue] = []
    names: dict[str, Path] = {}
    paths, unmatched = _matched(root, patterns)
    for pattern in unmatched:
        issues.append(ConfigIssue("trainstack:team.jobs", f"{pattern!r} matches no file"))
    for path in paths:
        relative = path.relative_to(root)
        try:
            spec, found = parse_job(path)
        except YamlSyntaxError as err:  # not YAML: file, line and column
            issues.append(ConfigIssue(err.at(str(relative)), err.problem))
            continue
        except ConfigError as err:  # unreadable
            spec, found = None, list(err.issues)
        issues += [ConfigIssue(f"{relative}: {i.path}", i.message) for i in found]
        if spec is None:
            continue
        if spec.name in names:
            issues.append(
                ConfigIssue(
                    f"{relative}: job.metadata.name",
                    f"job {spec.name!r} is also defined in {names[spec.name]}; "
                    "names must be unique",
                )
            )
        names.setdefault(spec.name, relative)
        specs.append(spec)
    return specs, issues
