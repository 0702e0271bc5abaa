"""Pulumi entry point for every trainstack stack: load config, pick platform or team, export."""

from pathlib import Path

import pulumi

from trainstack import outputs as out
from trainstack.components.platform import Platform
from trainstack.components.team import TeamStack
from trainstack.config import ConfigError, PlatformConfig
from trainstack.config.project import Project
from trainstack.jobs.files import load_jobs
from trainstack.jobs.prepull import team_job_images
from trainstack.program import load_pulumi_config

try:
    config = load_pulumi_config()
except ConfigError as err:
    # RunError: Pulumi prints the message alone, no traceback, and nothing is registered.
    raise pulumi.RunError(str(err)) from None

if isinstance(config, PlatformConfig):
    team_images: dict[str, tuple[str, ...]] = {}
    if config.pre_pull.enabled and config.pre_pull.team_jobs:
        found = team_job_images(Project.find(Path.cwd()), config)
        for stack, problem in found.skipped:
            pulumi.log.warn(f"image pre-pull: team stack {stack} left out: {problem}")
        team_images = dict(found.by_pool)
    platform = Platform(config.cluster_name, config, team_images=team_images)
    for key, value in platform.outputs.exports().items():
        pulumi.export(key, value)
else:
    try:
        jobs = load_jobs(Path.cwd(), config.jobs, f"stack {config.stack}")
    except ConfigError as err:
        raise pulumi.RunError(str(err)) from None
    team = TeamStack(f"team-{config.team}", config, jobs=tuple(jobs))
    pulumi.export(out.JOBS, [job.name for job in jobs])
    pulumi.export(out.TEAM, config.team)
    pulumi.export(out.NAMESPACE, team.namespace)
    pulumi.export(out.PLATFORM_STACK, config.platform_stack)
    pulumi.export(out.LIMITS, team.limits)
