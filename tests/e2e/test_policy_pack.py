"""The real Pulumi CLI runs the CrossGuard pack and reports what `trainstack preview` reported
(issue 19 #1, "done when").

The CLI is the one toolchain.py builds (v3.274.0); the pack is policies/ as checked in, with
the --policy-pack-config file `trainstack policy-config` generates, started by a launcher
that performs the Python language host's command (tests/e2e/policy_cli.py says why and what
it leaves out). The stacks are variants with findings (tests/policy/stacks.py): `lab`, onprem
with a second team, whose NetworkPolicies need a CNI nobody checks (advisory, a stack rule:
`AnalyzeStack`); and `vision-strict`, the vision team's jobs on a platform that trusts only
another registry (mandatory, a resource rule: `Analyze`). Every resource of their plans that
a rule reads is a Kubernetes one, so the program registers all of them and the CLI must report
exactly the preview's report: rule, resource, level and message, and fail the preview when,
and only when, a finding is mandatory. (Until issue 37 `lab` also had a mandatory stack
finding, two teams' Lustre PVs sharing a handle; no configuration reaches it now.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e import policy_cli
from tests.e2e.pulumi_engine import Engine, sdk_plugin_version
from tests.policy import stacks
from trainstack.policy.pack import evaluate
from trainstack.policy.rules import RULES
from trainstack.policy.settings import levels, pack_config
from trainstack.policy.stack_rules import STACK_RULES
from trainstack.preview import policy_config
from trainstack.preview.engine import Previewer

PACK = ROOT / "policies"
READ = {t for rule in RULES for t in rule.resource_types}
READ |= {t for stack_rule in STACK_RULES for t in stack_rule.resource_types}


@pytest.fixture(scope="module")
def engine(tools: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """An offline installation with the built Kubernetes provider (see test_pulumi_engine)."""
    engine = Engine.create(tmp_path_factory.mktemp("pulumi"), tools)
    binary = tools["pulumi-resource-kubernetes"]
    engine.install_plugin("resource", "kubernetes", sdk_plugin_version(), binary)
    return engine


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> Previewer:
    return stacks.previewer(tmp_path_factory.mktemp("stacks"))


def _resources(variants: Previewer, stack: str) -> list[tuple[str, str, dict[str, object]]]:
    plan = variants.preview(stack)
    resources = [(r.type, r.name, r.inputs) for r in plan.resources if r.custom and r.type in READ]
    assert resources
    assert all(rtype.startswith("kubernetes:") for rtype, _, _ in resources)
    return resources


@pytest.mark.parametrize("stack", ["lab", "vision-strict"])
def test_the_cli_reports_what_the_preview_reported(
    stack: str, engine: Engine, variants: Previewer, tmp_path: Path
) -> None:
    plan = variants.preview(stack)
    reported = sorted((v["rule"], v["resource"], v["level"], v["message"]) for v in plan.violations)
    mandatory = any(level == "mandatory" for _, _, level, _ in reported)
    assert reported
    assert mandatory is (stack == "vision-strict")
    resources = _resources(variants, stack)
    cfg = policy_config.platform_config(variants, stack)
    # The program's resources are all the plan's resources a rule reads: the same report.
    same = evaluate(resources, pack_config(cfg), levels(cfg))
    assert sorted((v.rule, v.resource, v.level, v.message) for v in same) == reported

    config = tmp_path / f"{stack}.json"
    config.write_text(policy_config.generate(variants, stack))
    launcher = policy_cli.launcher(tmp_path / "pack", PACK)
    project = policy_cli.new_project(engine, tmp_path / "project", stack, resources)
    result = policy_cli.preview(engine, project, stack, launcher, config)

    events = result["policy"]
    assert {e["pack"] for e in events} == {"trainstack"}, Path(result["log"]).read_text()
    found = sorted((e["policy"], e["urn"].rsplit("::", 1)[-1], e["level"]) for e in events)
    assert found == [(rule, resource, level) for rule, resource, level, _ in reported], Path(
        result["log"]
    ).read_text()
    for event in events:  # the CLI prints the policy's description, then the rule's message
        name = event["urn"].rsplit("::", 1)[-1]
        messages = [m for r, res, _, m in reported if (r, res) == (event["policy"], name)]
        assert any(m in event["message"] for m in messages), event
    if not mandatory:
        assert not result["failed"], result["error"]
        return
    assert result["failed"], "a mandatory finding fails the preview"
    assert "preview failed" in result["error"] or "mandatory" in result["error"], result["error"]


def test_the_folder_needs_the_language_host_not_built_here(
    engine: Engine, variants: Previewer, tmp_path: Path
) -> None:
    """Why the launcher: given the folder, the CLI asks for the Python language host
    (plugin.go ExecPlugin, Host.LanguageRuntime), which no module here provides; with
    automatic plugin acquisition off it stops at once (engine/update.go loadPolicyAnalyzer,
    policyAnalyzerMissingError)."""
    config = tmp_path / "lab.json"
    config.write_text(policy_config.generate(variants, "lab"))
    resources = _resources(variants, "lab")[:1]
    project = policy_cli.new_project(engine, tmp_path / "project", "folder", resources)
    result = policy_cli.preview(engine, project, "folder", PACK, config, timeout=120)
    assert result["failed"]
    assert result["policy"] == []
    assert "no language plugin 'pulumi-language-python' found" in result["error"], result["error"]
