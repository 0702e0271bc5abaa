"""Checks of the checkpoint path that need a CUDA device (not collected by pytest: no test may
need a GPU; docs/testing.md, "GPU checks"). Run on a machine with one:

    PYTHONPATH=images/runtime python3 -m tests.runtime.gpu_check

1. **Staging waits for the training stream** (issue 40 #4). A parameter's new value is queued
   behind slow work on the current stream and ``stage()`` is called at once, as ``save()``
   runs right after ``optimizer.step()``. DCP's own ``DefaultStager`` (the control) copies on
   its staging stream without waiting and should stage the old value in some trials, which
   shows the race is real on this device; trainstack's ``OrderedStager`` must stage the new
   value every time.
2. **The first save's digest on device tensors** (issue 40 #6): chunked device-to-host reads
   give the digest of the same tensors on the CPU, for any chunk size.
3. **A save right after the step restores that step** on the device: an async save started
   right after ``optimizer.step()``, then training goes on; the restored state equals the
   state at the save.

Prints one JSON line per check and exits 1 if any check fails.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from trainstack_runtime import checkpoint
from trainstack_runtime.checkpoint import CheckpointConfig, CheckpointManager, TrainState
from trainstack_runtime.ckptshare import _digest


def _result(staged: Any) -> Any:
    return staged.result() if isinstance(staged, Future) else staged


def staging_order(trials: int = 12, numel: int = 64 << 20) -> dict[str, Any]:
    """How often each stager staged the value queued before ``stage()`` was called."""
    param = torch.zeros(numel, device="cuda")
    work = torch.randn(4096, 4096, device="cuda")
    options = StagingOptions(
        use_pinned_memory=True,
        use_shared_memory=False,
        use_async_staging=True,
        use_non_blocking_copy=True,
    )
    out: dict[str, Any] = {"check": "staging_order", "trials": trials}
    makers = (
        ("control_default_stager", lambda: DefaultStager(options)),
        ("ordered_stager", checkpoint._new_stager),
    )
    for name, make in makers:
        right, queued_ms = 0, []
        for trial in range(1, trials + 1):
            # A stager per trial: torch 2.11's DefaultStager empties its StateDictStager's
            # copy table after a stage (2.13's, which the runtime pins, stages again and
            # again); the race does not need the cached host copies.
            stager = make()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(30):  # ~tens of ms of queued work before the write
                work = torch.tanh(work @ work)
            param.fill_(float(trial))  # the "optimizer step": queued behind the work
            staged = _result(stager.stage({"p": param}))
            queued_ms.append(round((time.perf_counter() - t0) * 1e3, 1))
            right += int(bool((staged["p"] == float(trial)).all()))
            torch.cuda.synchronize()
            stager.close()
        out[name] = {"right": right, "stage_returned_after_ms": queued_ms[:3]}
    out["ok"] = out["ordered_stager"].get("right") == trials
    out["control_raced"] = out["control_default_stager"].get("right", trials) < trials
    return out


def device_digest() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    tree: dict[str, Any] = {
        "model": {
            "w": torch.randn(300, 200, generator=gen).t(),  # not contiguous
            "h": torch.randn(10_001, generator=gen).to(torch.bfloat16),
        },
        "optim": {"state": {0: {"exp_avg": torch.randn(4097, generator=gen), "step": 1}}},
    }
    on_device = copy.deepcopy(tree)
    on_device["model"] = {k: v.cuda() for k, v in tree["model"].items()}
    on_device["optim"]["state"][0]["exp_avg"] = tree["optim"]["state"][0]["exp_avg"].cuda()
    expected = _digest(tree, frozenset(), chunk=1 << 30)
    got = {chunk: _digest(on_device, frozenset(), chunk=chunk) for chunk in (1, 777, 1 << 20)}
    return {"check": "device_digest", "ok": all(v == expected for v in got.values())}


def save_after_step(tmp: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048) for _ in range(8))).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 2048, device="cuda")
    mgr = CheckpointManager(CheckpointConfig(root=tmp / "ckpt"))
    expected: dict[str, torch.Tensor] = {}
    for step in range(1, 6):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if step == 3:
            mgr.save(step, TrainState(model, opt))  # async, right after the step's kernels
            torch.cuda.synchronize()
            expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    mgr.wait()
    mgr.close()
    check = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048) for _ in range(8))).cuda()
    restorer = CheckpointManager(CheckpointConfig(root=tmp / "ckpt"))
    step = restorer.restore(TrainState(check, torch.optim.Adam(check.parameters(), lr=1e-3)))
    restorer.close()
    same = all(torch.equal(v.cpu(), expected[k]) for k, v in check.state_dict().items())
    return {"check": "save_after_step", "restored_step": step, "ok": bool(same and step == 3)}


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for check in (staging_order, device_digest, lambda: save_after_step(Path(tmp))):
            try:
                result = check()
            except Exception as err:  # report it and go on with the other checks
                result = {"check": getattr(check, "__name__", "save_after_step"), "ok": False}
                result["error"] = repr(err)[:500]
            print(json.dumps(result), flush=True)
            results.append(result)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
