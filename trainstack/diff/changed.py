"""Which stacks a change touches: stack files, job specs, or shared code (then every stack)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from trainstack import yamlio
from trainstack.config import ConfigError, ConfigIssue
from trainstack.config.errors import did_you_mean
from trainstack.preview.engine import Project

# Paths that never change what a preview produces.
IGNORED_PREFIXES = ("docs/", "tests/", ".github/")
IGNORED_NAMES = (".gitignore", "LICENSE")
IGNORED_SUFFIXES = (".md",)
POLICY_CONFIG_DIR = "policies/config"  # preview/policy_config.CONFIG_DIR (no import: it previews)


@dataclass
class Selection:
    stacks: list[str]
    reasons: dict[str, list[str]] = field(default_factory=dict)  # stack -> why
    removed: list[str] = field(default_factory=list)  # stack files deleted by the change

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
    else:
        action = f"to fetch it: git fetch {remotes[0]} {ref}"
    return f"{ref!r} is not a commit in this repository{close}; {action}"


def changed_files(project: Project, ref: str) -> list[str]:
    """Files that differ from REF (committed or not, untracked included), project-relative."""
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
    files = _git(project, "diff", "--name-only", "--relative", ref, "--")
    for entry in _git(project, "ls-files", "--others", "--exclude-standard", "--directory"):
        folder = project.root / entry
        if entry.endswith("/") and (folder / ".git").exists():
            continue  # another checkout inside this one (CI's base checkout), not a change
        if entry.endswith("/"):
            files += [
                p.relative_to(project.root).as_posix() for p in folder.rglob("*") if p.is_file()
            ]
        else:
            files.append(entry)
    return sorted(set(files))


def _stack_kinds(project: Project) -> dict[str, dict[str, Any]]:
    """stack -> its `trainstack:team` section (team stacks) or {} (platform stacks)."""
    kinds: dict[str, dict[str, Any]] = {}
    for stack in project.stacks():
        try:
            doc = yamlio.read(project.stack_file(stack)) or {}
        except ConfigError:  # unreadable or not YAML: the preview reports it
            doc = {}
        team = (doc.get("config") or {}).get("trainstack:team") if isinstance(doc, dict) else None
        kinds[stack] = team if isinstance(team, dict) else {}
    return kinds


def _stack_file_changed(
    selection: Selection, kinds: dict[str, dict[str, Any]], stack: str, name: str
) -> None:
    if stack not in kinds:
        selection.removed.append(stack)
        return
    selection.add(stack, f"{name} changed")
    if not kinds[stack]:  # a platform stack: its team stacks read its outputs
        for other, team in kinds.items():
            if str(team.get("platformStack", "")).rsplit("/", 1)[-1] == stack:
                selection.add(other, f"its platform stack {stack} changed")


def select_stacks(project: Project, files: list[str]) -> Selection:
    """Map changed files to the stacks whose plans they can change."""
    kinds = _stack_kinds(project)
    stacks = sorted(kinds)
    selection = Selection([])
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
            continue
        for stack in stacks:  # shared code, schemas, the program: every stack
            selection.add(stack, f"shared file {name} changed")
    selection.stacks = sorted(selection.reasons)
    selection.removed = sorted(set(selection.removed))
    return selection


def stacks_changed_since(project_dir: Path, ref: str) -> Selection:
    project = Project.find(project_dir.resolve())
    return select_stacks(project, changed_files(project, ref))
