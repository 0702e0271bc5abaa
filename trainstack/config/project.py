"""A trainstack Pulumi project on disk: where the program and the stack files are.

In the config layer because both the preview (trainstack/preview) and the platform's own
program (image pre-pull reads the team stacks beside it: jobs/prepull.py) find it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainstack import yamlio
from trainstack.config.errors import ConfigError, ConfigIssue


@dataclass(frozen=True)
class Project:
    """A trainstack Pulumi project: where the program and the stack files are."""

    root: Path
    stacks_dir: Path

    @classmethod
    def find(cls, start: Path) -> Project:
        for folder in (start, *start.parents):
            project_file = folder / "Pulumi.yaml"
            if project_file.is_file():
                data = yamlio.read(project_file) or {}
                return cls(folder, folder / str(data.get("stackConfigDir", ".")))
        raise ConfigError(
            str(start), [ConfigIssue("Pulumi.yaml", "no Pulumi project found here or above")]
        )

    def stack_file(self, stack: str) -> Path:
        return self.stacks_dir / f"Pulumi.{stack}.yaml"

    def stacks(self) -> list[str]:
        return sorted(
            p.name[len("Pulumi.") : -len(".yaml")] for p in self.stacks_dir.glob("Pulumi.*.yaml")
        )
