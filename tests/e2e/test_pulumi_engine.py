"""The real Pulumi engine against the real control plane, offline (issue 21 step 1, a smoke test).

The Pulumi CLI and the Kubernetes provider are the ones toolchain.py builds from Go modules;
the program is a tiny Python one in a temp project (Pulumi.yaml, __main__.py) with an explicit
`pulumi_kubernetes.Provider` on the test control plane's kubeconfig. `pulumi up` creates a
Namespace and a ConfigMap, which the API server then holds; a second preview and up change
nothing; `pulumi destroy` removes them. How the program runs without the Python language host,
which the module proxy refuses, is in tests/e2e/pulumi_engine.py and docs/testing.md.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf import empty_pb2  # type: ignore[import-untyped]
from pulumi.runtime.proto import provider_pb2_grpc

from tests.e2e.pulumi_engine import Engine, EngineError, sdk_plugin_version
from trainstack.kube import Kube, wait_for
from trainstack.sandbox import toolchain
from trainstack.sandbox.cluster import ControlPlane

STACK = "e2e"
NAMESPACE = "pulumi-smoke"
PROGRAM = '''\
"""A Namespace and a ConfigMap in it, through an explicit provider (as trainstack's own)."""

import pulumi
import pulumi_kubernetes as k8s

config = pulumi.Config()
provider = k8s.Provider("e2e", kubeconfig=config.require("kubeconfig"))
opts = pulumi.ResourceOptions(provider=provider)
namespace = k8s.core.v1.Namespace(
    "smoke", metadata={"name": config.require("namespace")}, opts=opts
)
settings = k8s.core.v1.ConfigMap(
    "settings",
    metadata={"name": "settings", "namespace": namespace.metadata["name"]},
    data={"answer": "42"},
    opts=opts,
)
pulumi.export("namespace", namespace.metadata["name"])
pulumi.export("uid", settings.metadata["uid"])
'''
# The stack itself, the provider, the Namespace, the ConfigMap.
RESOURCES = 4
MISMATCH = "resource plugin kubernetes is expected to have version >={}, but has {}"


@pytest.fixture(scope="module")
def engine(tools: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """An offline installation with the built provider installed under the version the
    pulumi_kubernetes SDK asks for (4.34.2; the provider built is 4.25.0, see docs)."""
    engine = Engine.create(tmp_path_factory.mktemp("pulumi"), tools)
    binary = tools["pulumi-resource-kubernetes"]
    engine.install_plugin("resource", "kubernetes", sdk_plugin_version(), binary)
    return engine


def test_the_cli_reports_the_version_it_was_built_as(engine: Engine) -> None:
    assert engine.pulumi("version").strip() == toolchain.BY_NAME["pulumi"].version


def test_the_provider_is_installed_where_the_engine_looks(engine: Engine) -> None:
    installed = [(p["kind"], p["name"], p["version"]) for p in engine.plugins()]
    assert installed == [("resource", "kubernetes", sdk_plugin_version())]


def test_the_provider_reports_the_release_it_was_built_from(tools: dict[str, Path]) -> None:
    """GetPluginInfo over the provider's own gRPC port: the version ldflag at work."""
    with subprocess.Popen(
        [str(tools["pulumi-resource-kubernetes"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as provider:
        try:
            assert provider.stdout is not None
            port = int(provider.stdout.readline().strip())
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = provider_pb2_grpc.ResourceProviderStub(channel)
                info = stub.GetPluginInfo(empty_pb2.Empty(), timeout=30)
        finally:
            provider.kill()
    assert info.version == toolchain.kubernetes_provider_release()


def test_up_changes_nothing_the_second_time_and_destroy_removes_everything(
    engine: Engine, control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    config = {"kubeconfig": str(control_plane.kubeconfig()), "namespace": NAMESPACE}
    project = engine.new_project(tmp_path / "smoke", "trainstack-e2e-smoke", PROGRAM, STACK, config)
    try:
        up = engine.run(project, STACK, "up")
        assert up["changes"] == {"create": RESOURCES}, up
        # The engine names the mismatch, which also shows that the binary built here ran.
        assert MISMATCH.format(sdk_plugin_version(), toolchain.kubernetes_provider_release()) in (
            Path(up["log"]).read_text()
        )
        live = kube.get("v1", "ConfigMap", "settings", NAMESPACE)
        assert live["data"] == {"answer": "42"}
        assert live["metadata"]["uid"] == up["outputs"]["uid"]
        assert kube.get("v1", "Namespace", NAMESPACE)["status"]["phase"] == "Active"

        preview = engine.run(project, STACK, "preview", expect_no_changes=True)
        assert preview["changes"] == {"same": RESOURCES}, preview
        again = engine.run(project, STACK, "up", expect_no_changes=True)
        assert again["changes"] == {"same": RESOURCES}, again
        assert (
            kube.get("v1", "ConfigMap", "settings", NAMESPACE)["metadata"]["uid"]
            == live["metadata"]["uid"]
        )

        state = json.loads(engine.pulumi("stack", "export", "--stack", STACK, cwd=project))
        providers = [
            r
            for r in state["deployment"]["resources"]
            if r["type"] == "pulumi:providers:kubernetes"
        ]
        # What the state records is the version asked for, not the binary's (see docs).
        assert [p["inputs"]["version"] for p in providers] == [sdk_plugin_version()]

        down = engine.run(project, STACK, "destroy")
        assert down["changes"] == {"delete": RESOURCES}, down
        wait_for(
            f"namespace {NAMESPACE} gone",
            lambda: kube.get_or_none("v1", "Namespace", NAMESPACE) is None,
            timeout=60,
        )
    finally:
        kube.delete("v1", "Namespace", NAMESPACE)


def test_a_missing_plugin_fails_the_run_at_once(tools: dict[str, Path], tmp_path: Path) -> None:
    """No provider installed, acquisition off: an error naming it, never a download or a hang."""
    bare = Engine.create(tmp_path / "bare", tools)
    config = {"kubeconfig": str(tmp_path / "unused"), "namespace": NAMESPACE}
    project = bare.new_project(tmp_path / "smoke", "trainstack-e2e-smoke", PROGRAM, STACK, config)
    with pytest.raises(EngineError) as failed:
        bare.run(project, STACK, "preview", timeout=120)
    wanted = (
        "no resource plugin 'pulumi-resource-kubernetes' found in the workspace "
        f"at version v{sdk_plugin_version()}"
    )
    assert wanted in str(failed.value)


def test_the_pulumi_wrapper_pins_pkg_and_sdk_at_one_version_with_generated_replaces() -> None:
    go_mod = (toolchain.TOOLS / "pulumi" / "go.mod").read_text()
    version = toolchain.BY_NAME["pulumi"].version
    assert f"github.com/pulumi/pulumi/sdk/v3 {version}" in go_mod
    header = next(line for line in go_mod.splitlines() if line.startswith("// Generated by:"))
    assert f"pkg/v3@{version}" in header
    assert f"sdk/v3@{version}" in header
    # The block itself is regenerated and compared in test_toolchain.py.
