"""Run the real Pulumi program in-process under the mock engine (no CLI, no cloud)."""

from __future__ import annotations

import contextvars
import json
import os
import runpy
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime.resource as sdk_resource
from pulumi.runtime import settings
from pulumi.runtime.proto import source_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from trainstack.preview.mocks import RecordingMocks, RecordingMonitor, ResourceRecord

PROJECT = "trainstack"
SECRET_PLACEHOLDER = "[secret]"


@dataclass
class SynthResult:
    stack: str
    records: list[ResourceRecord]
    outputs: dict[str, Any]
    secret_outputs: set[str] = field(default_factory=set)


def config_strings(config: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Stack-file values as the Pulumi language host passes them: namespaced key -> string.

    `secure:` values cannot be decrypted offline; they become placeholders marked secret.
    """
    strings: dict[str, str] = {}
    secrets: list[str] = []
    for key, value in config.items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            strings[full] = SECRET_PLACEHOLDER
            secrets.append(full)
        elif isinstance(value, bool):
            strings[full] = "true" if value else "false"
        elif isinstance(value, str):
            strings[full] = value
        else:
            strings[full] = json.dumps(value)
    return strings, secrets


@contextmanager
def _no_source_positions() -> Iterator[None]:
    """Skip the Python stack the SDK captures for every registration.

    It only feeds source positions to the CLI's display; the mock engine drops them. Its
    cost grows with the call depth above each resource (a platform's resources sit ~20
    frames deep): a sixth of a platform preview. Real `pulumi` runs keep it.
    """
    saved = sdk_resource._get_stack_trace
    sdk_resource._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        sdk_resource._get_stack_trace = saved


def run_mocked(
    program: Callable[[], object],
    stack: str,
    config: Mapping[str, Any],
    *,
    region: str = "us-east-1",
    stack_outputs: Mapping[str, tuple[dict[str, Any], list[str]]] | None = None,
    mocks: RecordingMocks | None = None,
) -> SynthResult:
    """Run `program` under the recording mocks and return everything it registered.

    A fresh contextvars.Context per run keeps Pulumi's settings, config and root stack
    apart, so several stacks synthesise in one process. Exceptions from the program
    (pulumi.RunError for config errors) propagate to the caller.
    """
    strings, secret_keys = config_strings(config)
    mocks = mocks or RecordingMocks(region=region, stack_outputs=stack_outputs)

    def run() -> SynthResult:
        pulumi.runtime.set_all_config(strings, secret_keys)
        pulumi.runtime.set_mocks(
            mocks, project=PROJECT, stack=stack, preview=False, monitor=RecordingMonitor(mocks)
        )

        def body() -> None:
            program()

        # Pulumi keeps pending RPCs and outputs on a settings object that can outlive a
        # failed run; a previous program's error must not surface in this one.
        settings.SETTINGS.rpc_manager.clear()
        settings.SETTINGS.outputs.clear()
        _sync_await(run_pulumi_func(body))
        root = pulumi.runtime.get_root_resource()
        outputs: dict[str, Any] = {}
        secrets: set[str] = set()
        for key, value in (root.outputs if root is not None else {}).items():  # type: ignore[attr-defined]
            output = pulumi.Output.from_input(value)
            outputs[key] = _sync_await(output.future())
            if _sync_await(output.is_secret()):
                secrets.add(key)
        return SynthResult(stack, mocks.records, outputs, secrets)

    with _no_source_positions():
        return contextvars.Context().run(run)


def synth(
    program_dir: Path,
    stack: str,
    config: Mapping[str, Any],
    *,
    region: str = "us-east-1",
    stack_outputs: Mapping[str, tuple[dict[str, Any], list[str]]] | None = None,
    mocks: RecordingMocks | None = None,
) -> SynthResult:
    """Run the project's real `__main__.py` for `stack`, as `pulumi preview` would."""
    main = str(program_dir / "__main__.py")
    saved_cwd, saved_path, saved_argv = os.getcwd(), list(sys.path), list(sys.argv)
    try:
        # What the Pulumi exec shim does: program dir as cwd and first on sys.path.
        os.chdir(program_dir)
        sys.path.insert(0, str(program_dir))
        sys.argv = [str(program_dir)]
        return run_mocked(
            lambda: runpy.run_path(main, run_name="__main__"),
            stack,
            config,
            region=region,
            stack_outputs=stack_outputs,
            mocks=mocks,
        )
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        sys.argv = saved_argv
