"""Which stacks a change touches: stack files, job specs, or shared code (then every stack)."""

from __future__ import annotations

import difflib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from trainstack import yamlio
from trainstack.config import ConfigError, ConfigIssue
from trainstack.config.errors import did_you_mean
from trainstack.config.loader import PLATFORM_KEY as PLATFORM
from trainstack.config.loader import TEAM_KEY as TEAM
from trainstack.config.project import Project

# Paths that never change what a preview produces.
IGNORED_PREFIXES = ("docs/", "tests/", ".github/")
IGNORED_NAMES = (".gitignore", "LICENSE")
IGNORED_SUFFIXES = (".md",)
POLICY_CONFIG_DIR = "policies/config"  # preview/policy_config.CONFIG_DIR (no import: it previews)
# What a preview reads, besides the stack files and local charts: the project file and the
# program, the package (components/ and the job schema are links into it), job specs and the
# policy pack, and what decides the installed dependencies. An untracked file anywhere else
# (a virtualenv or its link, build output, a scratch file) changes no plan; before, each one
# selected every stack without a word (issue 41 #6). Tracked changes outside these still
# select every stack: a tracked file is part of the project, and a missed preview is worse
# than one too many.
PROGRAM_FILES = ("Pulumi.yaml", "__main__.py", "pyproject.toml", "requirements.txt")
PROGRAM_DIRS = ("trainstack/", "components/", "job_specs/", "policies/")


@dataclass
class Selection:
    stacks: list[str]
    reasons: dict[str, list[str]] = field(default_factory=dict)  # stack -> why
    removed: list[str] = field(default_factory=list)  # stack files deleted by the change
    # Files that select every stack, each with why (said once, not once per stack).
    everywhere: list[tuple[str, str]] = field(default_factory=list)
    untracked: set[str] = field(default_factory=set)  # the changed files git does not track

    def add(self, stack: str, reason: str) -> None:
        self.reasons.setdefault(stack, [])
        if reason not in self.reasons[stack]:
            self.reasons[stack].append(reason)


def _git(project: Project, *args: str) -> list[str]:
    try:
        done = subprocess.run(
            ["git", *args], cwd=project.root, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise ConfigError(
            "--changed-since", [ConfigIssue("git", "git is not installed; install it")]
        ) from None
    if done.returncode != 0:
        raise ConfigError(
            "--changed-since",
            [ConfigIssue(" ".join(["git", *args]), done.stderr.strip() or "failed")],
        )
    return [line for line in done.stdout.splitlines() if line]


def _git_lines(project: Project, *args: str) -> list[str]:
    done = subprocess.run(
        ["git", *args], cwd=project.root, capture_output=True, text=True, check=False
    )
    return done.stdout.split() if done.returncode == 0 else []


def ref_problem(project: Project, ref: str) -> str:
    """Why `ref` is no commit, with a ref that exists when one is close, and the git command
    that makes `ref` exist: `origin/main` is branch `main` of remote `origin`, so
    `git fetch origin main` (not `git fetch origin origin/main`, which git refuses)."""
    refs = _git_lines(
        project,
        "for-each-ref",
        "--format=%(refname:short)",
        "refs/heads",
        "refs/remotes",
        "refs/tags",
    )
    remotes = _git_lines(project, "remote")
    close = did_you_mean(ref, [r for r in refs if r not in remotes and r != ref])
    remote, _, branch = ref.partition("/")
    if "~" in ref or "^" in ref:
        action = "if this clone is shallow, fetch the older commits: git fetch --unshallow"
    elif not remotes:
        action = "this repository has no remote to fetch it from; pass a branch, tag or commit SHA"
    elif remote in remotes and branch:
        action = f"to fetch it: git fetch {remote} {branch}"
    elif branch:
        # `upstream/main` names remote `upstream`: `git fetch origin upstream/main` asked
        # origin for a branch called upstream/main (issue 41 #6).
        close_remote = difflib.get_close_matches(remote, remotes, n=1, cutoff=0.6)
        action = f"this repository has no remote {remote!r} (remotes: {', '.join(remotes)}); "
        if close_remote:
            action += (
                f"did you mean {close_remote[0]}/{branch}? to fetch it: "
                f"git fetch {close_remote[0]} {branch}"
            )
        else:
            action += (
                f"to fetch from it, add it first: git remote add {remote} URL, then "
                f"git fetch {remote} {branch}"
            )
    else:
        action = f"to fetch it: git fetch {remotes[0]} {ref}"
    return f"{ref!r} is not a commit in this repository{close}; {action}"


def _read_by_program(project: Project, name: str, charts: list[str]) -> bool:
    """Whether a preview can read this project-relative path (PROGRAM_FILES, PROGRAM_DIRS,
    the stack files' folder and the stacks' local charts), or, for a folder (`name/`),
    something in it."""
    stacks_dir = project.stacks_dir.resolve().relative_to(project.root.resolve()).as_posix()
    folders = (*PROGRAM_DIRS, *(f"{d.rstrip('/')}/" for d in (stacks_dir, *charts) if d != "."))
    return (
        name in PROGRAM_FILES
        or name.startswith(folders)
        or (name.endswith("/") and any(f.startswith(name) for f in folders))
        or (stacks_dir == "." and PurePosixPath(name).name.startswith("Pulumi."))
    )


def untracked_files(project: Project) -> list[str]:
    """Untracked files a preview reads: not ignored by git, under what the program reads
    (PROGRAM_FILES, PROGRAM_DIRS, stack files, local charts), not in a link to a folder."""
    charts = [c for paths in _chart_paths(project).values() for c in paths]
    files: list[str] = []
    for entry in _git(project, "ls-files", "--others", "--exclude-standard", "--directory"):
        path = project.root / entry.rstrip("/")
        if not _read_by_program(project, entry, charts):
            continue  # nothing in it is read: not walked (a virtualenv, build output)
        if path.is_symlink() and path.is_dir():
            continue  # a link to another tree (a virtualenv as policies/venv), not a source
        if entry.endswith("/") and (path / ".git").exists():
            continue  # another checkout inside this one (CI's base checkout), not a change
        found = (
            [p.relative_to(project.root).as_posix() for p in path.rglob("*") if p.is_file()]
            if entry.endswith("/")
            else [entry]
        )
        files += [f for f in found if _read_by_program(project, f, charts)]
    return sorted(files)


def changed_files(project: Project, ref: str) -> list[str]:
    """Files that differ from REF (committed or not, untracked included), project-relative."""
    return sorted({*tracked_changes(project, ref), *untracked_files(project)})


def tracked_changes(project: Project, ref: str) -> list[str]:
    """Tracked files that differ from REF, committed or not, project-relative."""
    verify = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        cwd=project.root,
        capture_output=True,
        check=False,
    )
    if verify.returncode != 0:
        raise ConfigError(
            "--changed-since",
            [ConfigIssue("ref", ref_problem(project, ref))],
        )
    return _git(project, "diff", "--name-only", "--relative", ref, "--")


Configs = dict[str, dict[str, Any]]  # stack -> its file's `config` map, as written


def _stack_configs(project: Project) -> Configs:
    """Every stack file's `config` map, each file read once ({} when it is unreadable or not
    YAML: the preview reports it)."""
    found: Configs = {}
    for stack in project.stacks():
        try:
            doc = yamlio.read(project.stack_file(stack)) or {}
        except ConfigError:
            doc = {}
        config = doc.get("config") if isinstance(doc, dict) else None
        found[stack] = config if isinstance(config, dict) else {}
    return found


def _section(configs: Configs, key: str) -> Configs:
    """Stack -> its `key` section, for the stacks that have one as a map."""
    return {s: c[key] for s, c in configs.items() if isinstance(c.get(key), dict)}


def _chart_paths(project: Project, configs: Configs | None = None) -> dict[str, list[str]]:
    """Platform stack -> the project-relative folders of its local charts
    (`addons.<key>.path`, read by the preview: builders/addons.py)."""
    found: dict[str, list[str]] = {}
    root = project.root.resolve()
    platforms = _section(_stack_configs(project) if configs is None else configs, PLATFORM)
    for stack, platform in platforms.items():
        addons = platform.get("addons")
        for source in addons.values() if isinstance(addons, dict) else ():
            path = source.get("path") if isinstance(source, dict) else None
            if not isinstance(path, str):
                continue
            folder = (root / Path(path).expanduser()).resolve()
            if folder.is_relative_to(root):
                found.setdefault(stack, []).append(folder.relative_to(root).as_posix())
    return found


def _pre_pulling(configs: Configs) -> set[str]:
    """Platform stacks whose `prePull` holds their team stacks' job images (jobs/prepull.py):
    a job spec that changes changes their plan too."""
    found = set()
    for stack, platform in _section(configs, PLATFORM).items():
        pre = platform.get("prePull")
        if isinstance(pre, dict) and pre.get("enabled") is True and pre.get("teamJobs", True):
            found.add(stack)
    return found


def _stack_kinds(configs: Configs) -> Configs:
    """stack -> its `trainstack:team` section (team stacks) or {} (platform stacks)."""
    teams = _section(configs, TEAM)
    return {stack: teams.get(stack, {}) for stack in configs}


def _stack_file_changed(
    selection: Selection, kinds: dict[str, dict[str, Any]], stack: str, name: str
) -> None:
    if stack not in kinds:
        selection.removed.append(stack)
        return
    _platform_changed(selection, kinds, stack, f"{name} changed")


def _platform_changed(
    selection: Selection, kinds: dict[str, dict[str, Any]], stack: str, why: str
) -> None:
    selection.add(stack, why)
    if not kinds[stack]:  # a platform stack: its team stacks read its outputs
        for other, team in kinds.items():
            if str(team.get("platformStack", "")).rsplit("/", 1)[-1] == stack:
                selection.add(other, f"its platform stack {stack} changed")


def _why_everywhere(project: Project, name: str, untracked: bool) -> str:
    """Why a file selects every stack, as the user reads it."""
    if not _read_by_program(project, name, []):
        return "not a stack file, job spec, policy setting or document: any stack may change"
    where = f"in {name.split('/', 1)[0]}/, which" if "/" in name else "which"
    return f"{'untracked, ' if untracked else ''}{where} every preview reads"


def select_stacks(
    project: Project, files: list[str], untracked: set[str] | None = None
) -> Selection:
    """Map changed files to the stacks whose plans they can change; `untracked` says which
    of them git does not track (for the reasons only: changed_files has filtered them)."""
    configs = _stack_configs(project)  # each stack file read once
    kinds = _stack_kinds(configs)
    pre_pulling = _pre_pulling(configs)
    stacks = sorted(kinds)
    charts = _chart_paths(project, configs)
    selection = Selection([], untracked=set(untracked or ()))
    stacks_dir = project.stacks_dir.resolve().relative_to(project.root.resolve())
    for name in files:
        path = PurePosixPath(name)
        if (
            name.startswith(IGNORED_PREFIXES)
            or path.name in IGNORED_NAMES
            or path.suffix in IGNORED_SUFFIXES
        ):
            continue
        if path.parent == PurePosixPath(stacks_dir.as_posix()) and path.name.startswith("Pulumi."):
            _stack_file_changed(selection, kinds, path.name[len("Pulumi.") : -len(".yaml")], name)
            continue
        if path.parent == PurePosixPath(POLICY_CONFIG_DIR) and path.suffix == ".json":
            # A stack's CrossGuard settings (trainstack policy-config), read by the real
            # `pulumi preview --policy-pack` of that stack only.
            if path.stem in kinds:
                selection.add(path.stem, f"{name} changed")
            continue
        if path.parts[:1] == ("job_specs",) and len(path.parts) > 2:
            team_name = path.parts[1]
            for other, team in kinds.items():
                if team.get("team") == team_name:
                    selection.add(other, f"{name} changed")
                    platform = str(team.get("platformStack", "")).rsplit("/", 1)[-1]
                    if platform in pre_pulling:
                        selection.add(platform, f"{name} changed (it pre-pulls its images)")
            continue
        owners = [s for s, paths in charts.items() for c in paths if name.startswith(f"{c}/")]
        if owners:  # a platform stack's local chart: that stack and its team stacks
            for stack in owners:
                _platform_changed(selection, kinds, stack, f"{name} (its local chart) changed")
            continue
        why = _why_everywhere(project, name, name in selection.untracked)
        selection.everywhere.append((name, why))
        for stack in stacks:  # shared code, schemas, the program: every stack
            selection.add(stack, f"shared file {name} changed")
    selection.stacks = sorted(selection.reasons)
    selection.removed = sorted(set(selection.removed))
    return selection


def stacks_changed_since(project_dir: Path, ref: str) -> Selection:
    project = Project.find(project_dir.resolve())
    tracked, untracked = tracked_changes(project, ref), untracked_files(project)
    return select_stacks(project, sorted({*tracked, *untracked}), set(untracked))
