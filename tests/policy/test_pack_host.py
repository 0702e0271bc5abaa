"""The pack starts as the Pulumi CLI starts it, and judges as `trainstack preview` does
(issue 19 #1).

tests/policy/language_host.py performs the CLI's and the Python language host's steps, cited
there: the virtualenv from PulumiPolicy.yaml resolved against the pack folder, then
`<virtualenv>/bin/python -u -m pulumi.policy <engine address> <pack folder>` in the pack folder
(not the repository root). The test then speaks the Analyzer protocol to the pack as the
engine does (pkg/v3@v3.274.0 resource/plugin/analyzer_plugin.go NewPolicyAnalyzer: Handshake,
ConfigureStack; host/host.go: GetPluginInfo; engine/update.go LoadLocalPolicyPackAnalyzers:
GetAnalyzerInfo, then Configure with the --policy-pack-config file reconciled with the pack's
schema; then Analyze per resource and AnalyzeStack) and requires the violations the preview
reported for each stack's plan: rule, resource, level and message.

The pack never dials the engine address (pulumi_policy serves; it logs nothing), so a closed
port stands for it. PYTHONPATH is left out of the CLI's environment: the pack must import
trainstack from its virtualenv alone, as it would for someone whose shell has none.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf import empty_pb2, struct_pb2  # type: ignore[import-untyped]
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from tests.conftest import EXAMPLE_STACKS, ROOT
from tests.policy import language_host, stacks
from tests.policy.crossguard import reconcile
from tests.policy.test_equivalence import CASES
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.pack import CONFIG_SCHEMA, PACK_NAME, crossguard_policies, evaluate
from trainstack.policy.rules import RULES
from trainstack.policy.settings import levels, pack_config
from trainstack.policy.stack_rules import STACK_RULES
from trainstack.preview.engine import Previewer
from trainstack.preview.policy_config import CONFIG_DIR, config_document, platform_config

PACK = ROOT / "policies"
ENGINE = "127.0.0.1:1"  # see the module docstring
PROJECT = "trainstack"
LEVEL_NAMES = {
    analyzer_pb2.ADVISORY: "advisory",
    analyzer_pb2.MANDATORY: "mandatory",
    analyzer_pb2.REMEDIATE: "remediate",
    analyzer_pb2.DISABLED: "disabled",
}
LEVEL_VALUES = {name: value for value, name in LEVEL_NAMES.items()}
# Examples, and variants with mandatory findings (prod-open, vision-strict) and advisory
# ones (lab, dev-advisory).
JUDGED = [*EXAMPLE_STACKS, "lab", "prod-open", "vision-strict", "prod-strict", "dev-advisory"]


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# -- the pack folder, as a fresh clone has it ---------------------------------------------------


def test_the_virtualenv_is_the_one_the_setup_creates() -> None:
    """PulumiPolicy.yaml names `../.venv`, which is the Makefile's VENV (`make setup`, run by
    `make preview` and `make test`), and it holds a python as pip's IsVirtualEnv wants."""
    toolchain = language_host.resolve(PACK)
    venv = re.search(r"^VENV\s*\?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert venv is not None
    assert toolchain == language_host.Toolchain("pip", ROOT / venv.group(1))
    assert (ROOT / venv.group(1) / "bin" / "python").is_file(), "run `make setup`"


def test_a_lock_file_above_the_pack_does_not_change_its_python(tmp_path: Path) -> None:
    """`toolchain: pip` is why: left at auto, a poetry.lock anywhere above the pack folder
    (toolchain.go ResolveToolchain, searchup) would make the host use Poetry's environment."""
    pack = tmp_path / "checkout" / "policies"
    pack.mkdir(parents=True)
    shutil.copy(PACK / "PulumiPolicy.yaml", pack)
    (tmp_path / "poetry.lock").write_text("")
    assert language_host.resolve(pack) == language_host.Toolchain(
        "pip", tmp_path / "checkout" / ".venv"
    )
    auto = (pack / "PulumiPolicy.yaml").read_text().replace("toolchain: pip", "")
    (pack / "PulumiPolicy.yaml").write_text(auto)
    assert language_host.resolve(pack).name == "poetry"


def test_requirements_install_nothing_by_path_and_not_trainstack() -> None:
    """No `-e ..` (pip resolves it from its working directory), and no bare `trainstack`,
    which would come from PyPI, where the name is not ours (docs/policies.md, Publishing)."""
    lines = [
        line.split("#", 1)[0].strip()
        for line in (PACK / "requirements.txt").read_text().splitlines()
    ]
    requirements = [line for line in lines if line]
    assert requirements, "the pack's public dependencies are listed"
    for line in requirements:
        assert not line.startswith(("-e", "--editable", ".", "/", "file:")), line
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", line), line
        assert not line.lower().startswith("trainstack"), line


def test_git_ignores_a_virtualenv_inside_the_pack() -> None:
    """One there (the old setup's `venv`) must not make `changed-stacks` report every stack:
    it lists untracked files that are not ignored (diff/changed.py changed_files)."""
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "policies/venv/bin/python"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0


def test_a_clone_has_the_pack_and_a_config_per_stack() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "policies"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    wanted = {"policies/PulumiPolicy.yaml", "policies/__main__.py", "policies/requirements.txt"}
    wanted |= {f"{CONFIG_DIR.as_posix()}/{stack}.json" for stack in EXAMPLE_STACKS}
    assert wanted <= set(tracked), sorted(wanted - set(tracked))


def test_the_command_is_the_hosts() -> None:
    cmd = language_host.command(PACK, [ENGINE], _environ())
    python = str(ROOT / ".venv" / "bin" / "python")
    assert cmd.argv == [python, "-u", "-m", "pulumi.policy", ENGINE, str(PACK)]
    assert cmd.cwd == PACK  # RunPlugin: cmd.Dir = the pack folder, never the CLI's
    assert cmd.env["VIRTUAL_ENV"] == str(ROOT / ".venv")


# -- the running pack, over gRPC ---------------------------------------------------------------


@dataclass
class Running:
    stub: analyzer_pb2_grpc.AnalyzerStub
    process: Any


@pytest.fixture(scope="module")
def pack() -> Iterator[Running]:
    configuration = {
        "organization": "organization",
        "project": PROJECT,
        "stack": "prod",
        "dry_run": True,
        "config": {},
    }
    cmd = language_host.command(PACK, [ENGINE], _environ(), configuration)
    process, port = language_host.start(cmd)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Running(analyzer_pb2_grpc.AnalyzerStub(channel), process)
    finally:
        process.kill()
        process.communicate(timeout=30)


def test_the_engines_first_calls(pack: Running) -> None:
    """Handshake is optional (Unimplemented is the old behaviour), ConfigureStack is not."""
    code = grpc.StatusCode.OK
    try:
        pack.stub.Handshake(
            analyzer_pb2.AnalyzerHandshakeRequest(
                engine_address=ENGINE, root_directory=str(PACK), program_directory=str(PACK)
            ),
            timeout=30,
        )
    except grpc.RpcError as error:
        code = error.code()
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED)
    pack.stub.ConfigureStack(
        analyzer_pb2.AnalyzerStackConfigureRequest(stack="prod", project=PROJECT, dry_run=True),
        timeout=30,
    )
    assert pack.stub.GetPluginInfo(empty_pb2.Empty(), timeout=30).version


def test_it_describes_the_pack(pack: Running) -> None:
    info = pack.stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    assert info.name == PACK_NAME
    assert info.supportsConfig
    policies = {p.name: p for p in info.policies}
    assert list(policies) == [p.name for p in crossguard_policies()]
    rules: dict[str, str] = {r.name: r.level for r in RULES}
    rules |= {r.name: r.level for r in STACK_RULES}
    for name, policy in policies.items():
        assert LEVEL_NAMES[policy.enforcementLevel] == rules[name]
        assert set(policy.configSchema.properties) == set(CONFIG_SCHEMA.properties)


def _struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    """propertyrpc.Marshal of plain JSON values: a Struct (numbers become doubles)."""
    struct = struct_pb2.Struct()
    struct.update(json.loads(json.dumps(props)))
    return struct


def _configure(pack: Running, document: Mapping[str, Any]) -> None:
    request = analyzer_pb2.ConfigureAnalyzerRequest()
    for name, setting in reconcile(document).items():
        request.policyConfig[name].CopyFrom(
            analyzer_pb2.PolicyConfig(
                enforcementLevel=LEVEL_VALUES[setting.level],
                properties=_struct(setting.properties),
            )
        )
    pack.stub.Configure(request, timeout=30)


def _urn(stack: str, rtype: str, name: str) -> str:
    return f"urn:pulumi:{stack}::{PROJECT}::{rtype}::{name}"


def _found(diagnostic: Any, resource: str) -> tuple[str, str, str, str]:
    """(rule, resource, level, message): the message as the rule wrote it (on the wire it is
    the policy's description, a newline and the message: pulumi_policy report_violation)."""
    described = {p.name: p.description for p in crossguard_policies()}
    head, _, message = diagnostic.message.partition("\n")
    assert head == described[diagnostic.policyName]
    level = LEVEL_NAMES[diagnostic.enforcementLevel]
    return diagnostic.policyName, resource, level, message


def analyze(
    pack: Running,
    stack: str,
    resources: Sequence[tuple[str, str, Mapping[str, Any]]],
    depends_on: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
) -> list[tuple[str, str, str, str]]:
    """Every resource through Analyze, then all of them through AnalyzeStack, with the
    property dependencies (`type::name` per input property, per `type::name`) as URNs, as the
    engine sends them (step_generator.go AnalyzeResources). A finding without a URN is the
    analyzed resource's (the engine's analyzeResource); a stack policy's names a URN."""
    names = {_urn(stack, rtype, name): name for rtype, name, _ in resources}

    def dependencies(rtype: str, name: str) -> dict[str, Any]:
        given = (depends_on or {}).get(f"{rtype}::{name}", {})
        return {
            key: analyzer_pb2.AnalyzerPropertyDependencies(
                urns=[_urn(stack, *ref.rsplit("::", 1)) for ref in refs]
            )
            for key, refs in given.items()
        }

    found = []
    for rtype, name, props in resources:
        urn = _urn(stack, rtype, name)
        request = analyzer_pb2.AnalyzeRequest(
            urn=urn, type=rtype, name=name, properties=_struct(props)
        )
        response = pack.stub.Analyze(request, timeout=30)
        found += [_found(d, names[d.urn or urn]) for d in response.diagnostics]
    stack_request = analyzer_pb2.AnalyzeStackRequest(
        resources=[
            analyzer_pb2.AnalyzerResource(
                urn=_urn(stack, rtype, name),
                type=rtype,
                name=name,
                properties=_struct(props),
                propertyDependencies=dependencies(rtype, name),
            )
            for rtype, name, props in resources
        ]
    )
    response = pack.stub.AnalyzeStack(stack_request, timeout=60)
    found += [_found(d, names[d.urn]) for d in response.diagnostics]
    return sorted(found)


def _document(previewer: Previewer, stack: str) -> dict[str, Any]:
    if stack in EXAMPLE_STACKS:  # what the CLI is given: the checked-in file
        document: dict[str, Any] = json.loads((ROOT / CONFIG_DIR / f"{stack}.json").read_text())
        return document
    return config_document(platform_config(previewer, stack))


@pytest.mark.parametrize("stack", JUDGED)
def test_it_reports_what_the_preview_reported(
    stack: str, pack: Running, variants: Previewer
) -> None:
    """The whole plan through the running pack: exactly the preview's policy report."""
    plan = variants.preview(stack)
    _configure(pack, _document(variants, stack))
    resources = [(r.type, r.name, r.inputs) for r in plan.resources if r.custom]
    # The preview links a stack rule's resources by the property dependencies it recorded.
    depends_on = {r.ref: r.property_dependencies for r in plan.resources if r.custom}
    reported = sorted((v["rule"], v["resource"], v["level"], v["message"]) for v in plan.violations)
    assert analyze(pack, stack, resources, depends_on) == reported


def test_the_judged_stacks_have_findings_of_both_levels(variants: Previewer) -> None:
    found = {(stack, v["level"]) for stack in JUDGED for v in variants.preview(stack).violations}
    assert ("prod-open", "mandatory") in found
    assert ("lab", "advisory") in found
    assert ("vision-strict", "mandatory") in found


def test_it_judges_every_table_row_as_the_preview_does(pack: Running, variants: Previewer) -> None:
    """The rule table's jobs (prod's demo job, mutated) over the wire, numbers as doubles."""
    cfg = platform_config(variants, "prod")
    _configure(pack, _document(variants, "prod"))
    base = stacks.demo_job(variants.preview("vision"))
    resources = []
    for index, (_, _, mutate, _) in enumerate(CASES):
        job = copy.deepcopy(base)
        if mutate is not None:
            mutate(job)
        resources.append((VOLCANO_JOB, f"row-{index}", job))
    expected = sorted(
        (v.rule, v.resource, v.level, v.message)
        for v in evaluate(resources, pack_config(cfg), levels(cfg))
    )
    assert expected, "the table has rows that break rules"
    assert analyze(pack, "prod", resources) == expected
