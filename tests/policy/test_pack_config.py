"""The pack's --policy-pack-config files are generated from the stack files, never stale, and
leave no policy to a default that differs from the stack (issue 19 #2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import EXAMPLE_STACKS, ROOT
from tests.policy.crossguard import reconcile
from trainstack.cli import app
from trainstack.config.project import Project
from trainstack.policy.objects import Config
from trainstack.policy.pack import CONFIG_SCHEMA, crossguard_policies
from trainstack.policy.settings import levels, pack_config, rule_config
from trainstack.preview import policy_config
from trainstack.preview.engine import Previewer

STALE = "policy pack config out of date; run `make policy-config`"


@pytest.fixture(scope="module")
def previewer() -> Previewer:
    return Previewer(Project.find(ROOT))


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_the_checked_in_file_is_the_generated_one(stack: str, previewer: Previewer) -> None:
    """Like the goldens: a stack file changed without `make policy-config` fails here."""
    path = policy_config.config_path(previewer, stack)
    assert path.is_file(), f"{path} is missing: run `make policy-config`"
    assert path.read_text() == policy_config.generate(previewer, stack), (
        f"{path} is stale: run `make policy-config`"
    )


def test_no_file_outlives_its_stack(previewer: Previewer) -> None:
    assert policy_config.orphans(previewer) == []


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_no_policy_falls_back_to_a_default(stack: str, previewer: Previewer) -> None:
    """As the CLI applies the file (schema defaults, then `all`, then each policy), every
    policy that reads config gets the stack's settings, and every policy the stack's level."""
    cfg = policy_config.platform_config(previewer, stack)
    assert set(pack_config(cfg)) == set(CONFIG_SCHEMA.properties)
    document = json.loads(policy_config.config_path(previewer, stack).read_text())
    configured = reconcile(document)
    wanted = json.loads(json.dumps(pack_config(cfg)))
    for policy in crossguard_policies():
        setting = configured[policy.name]
        assert setting.level == levels(cfg)[policy.name], policy.name
        if policy.config_schema is not None:
            assert setting.properties == wanted, policy.name
            assert Config.from_mapping(setting.properties) == rule_config(cfg), policy.name


def test_team_stacks_get_their_platforms_file(previewer: Previewer) -> None:
    assert policy_config.generate(previewer, "vision") == policy_config.generate(previewer, "prod")


def test_a_setting_missing_from_the_schema_stops_the_generator(
    previewer: Previewer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One list of properties, the pack's schema: a setting added to one side only fails."""
    cfg = policy_config.platform_config(previewer, "prod")
    extra = {**pack_config(cfg), "maxGpusPerJob": 8}
    monkeypatch.setattr(policy_config, "pack_config", lambda _: extra)
    with pytest.raises(ValueError, match="maxGpusPerJob"):
        policy_config.config_document(cfg)
    fewer = {k: v for k, v in pack_config(cfg).items() if k != "allowedRegistries"}
    monkeypatch.setattr(policy_config, "pack_config", lambda _: fewer)
    with pytest.raises(ValueError, match="allowedRegistries"):
        policy_config.config_document(cfg)


def _project(tmp_path: Path) -> Path:
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    shutil.copytree(ROOT / "policies", tmp_path / "policies", ignore=shutil.ignore_patterns("venv"))
    return tmp_path


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, ["policy-config", *args])


def test_the_command_checks_and_writes(tmp_path: Path) -> None:
    project = _project(tmp_path)
    assert _run("--check", "--project-dir", str(project)).exit_code == 0
    prod = project / "stacks" / "Pulumi.prod.yaml"
    text = prod.read_text()
    allowed = (
        "      allowedRegistries:\n        - 111122223333.dkr.ecr.us-east-1.amazonaws.com/\n"
        "        - registry.example.com/\n"
    )
    assert allowed in text
    prod.write_text(text.replace(allowed, "      allowedRegistries: [trusted.example.com/]\n"))
    (project / "policies" / "config" / "gone.json").write_text("{}\n")
    checked = _run("--check", "--project-dir", str(project))
    assert checked.exit_code == 1
    assert "prod.json: missing or stale" in checked.output
    assert "vision.json: missing or stale" in checked.output  # a team stack of prod
    assert "dev.json" not in checked.output
    assert "gone.json: no stack file" in checked.output
    assert STALE in checked.output
    wrote = _run("--project-dir", str(project))
    assert wrote.exit_code == 0, wrote.output
    # Paths as usable from here: the project is not below the working directory.
    assert f"wrote {project / 'policies' / 'config' / 'prod.json'}\n" in wrote.output
    assert f"removed {project / 'policies' / 'config' / 'gone.json'} (no" in wrote.output
    document = json.loads((project / "policies" / "config" / "prod.json").read_text())
    assert document["pinned-images"]["allowedRegistries"] == ["trusted.example.com/"]
    assert _run("--check", "--project-dir", str(project)).exit_code == 0


def test_a_broken_stack_file_is_a_config_error(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "stacks" / "Pulumi.dev.yaml").write_text("config:\n  trainstack:platform: {}\n")
    result = _run("dev", "--project-dir", str(project))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
