"""Which images each GPU pool pre-pulls (issue 48, docs/prepull.md): the images of the jobs of
the team stacks that name a platform stack, each on its job's pool.

The platform stack owns the pre-pull objects (they tolerate the GPU and health-gate taints,
which no team pod may: docs/health.md), but the images are the team stacks' jobs. Both live in
one project (the stack files in `stackConfigDir`, the job specs beside them), so the platform's
program reads them here, at preview as at `pulumi up`, and a team adding a job changes the
platform's plan (trainstack diff selects the platform stack for a job spec that changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainstack.config import ConfigError, PlatformConfig, TeamStackConfig, parse_stack_config
from trainstack.config.images import from_allowed_registry, is_pinned
from trainstack.config.loader import read_stack_file
from trainstack.config.project import Project
from trainstack.jobs.files import collect_jobs
from trainstack.jobs.spec import JobSpec


@dataclass(frozen=True)
class TeamImages:
    """Per pool the images its team stacks' jobs use, and why any team stack was left out."""

    by_pool: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # (stack, problem): a team stack whose file or jobs have problems. It cannot deploy its
    # jobs either; the platform warns and pre-pulls the other stacks' images.
    skipped: tuple[tuple[str, str], ...] = ()


def _refusal(platform: PlatformConfig, team: str, spec: JobSpec) -> str | None:
    """Why the platform would refuse this job of `team`'s stack as far as its pool and image
    go (None: it would not). A job on a pool its team may not use is refused by its own preview
    and by admission (gpu-placement); its image must not reach that pool's nodes either, or one
    team could fill another's nodes with images by writing a job spec. An image the
    pinned-images rule refuses (a moving tag, a registry outside policy.allowedRegistries) is
    not pulled anywhere."""
    entry = platform.registry.team(team)
    if entry is None:
        return f"team {team!r} is not in the platform's registry"
    if spec.team != team:
        return f"job {spec.name}: metadata.team {spec.team!r} is not the stack's team {team!r}"
    if spec.pool not in entry.pools:
        return f"job {spec.name}: pool {spec.pool!r} is not one of team {team!r}'s pools"
    # pinned-images, as the team's preview and admission judge it with this platform's
    # settings: nodes pull nothing a job could not run
    production = platform.environment == "production"
    if not is_pinned(spec.image, production=production):
        return f"job {spec.name}: image {spec.image!r} is not pinned as this platform requires"
    if not from_allowed_registry(spec.image, platform.policy.allowed_registries):
        return f"job {spec.name}: image {spec.image!r} is not from an allowed registry"
    return None


def team_job_images(project: Project, platform: PlatformConfig) -> TeamImages:
    """Every image the jobs of `platform`'s team stacks in `project` use, by the job's pool
    (job file patterns are relative to the project's root). A stack with a job the platform
    would refuse is left out whole: it deploys nothing."""
    images: dict[str, set[str]] = {}
    skipped: list[tuple[str, str]] = []
    for stack in project.stacks():
        path = project.stack_file(stack)
        try:
            values = read_stack_file(path)
            if "trainstack:team" not in values:
                continue
            cfg = parse_stack_config(values, stack=stack, source=str(path))
        except ConfigError as err:
            skipped.append((stack, str(err).splitlines()[0]))
            continue
        if not isinstance(cfg, TeamStackConfig) or cfg.platform_stack_name != platform.stack:
            continue
        specs, issues = collect_jobs(project.root, cfg.jobs)
        if issues:  # its preview fails and it deploys nothing: pull nothing for it either
            skipped.append((stack, f"{issues[0].path}: {issues[0].message}"))
            continue
        refused = next((r for s in specs if (r := _refusal(platform, cfg.team, s))), None)
        if refused is not None:
            skipped.append((stack, refused))
            continue
        for spec in specs:
            images.setdefault(spec.pool, set()).add(spec.image)
    return TeamImages(
        by_pool={pool: tuple(sorted(found)) for pool, found in sorted(images.items())},
        skipped=tuple(skipped),
    )
