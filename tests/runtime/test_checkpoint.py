"""CheckpointManager in one process: round trip, staging semantics, manifest verification."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import pytest

from tests.runtime.harness import HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch
    from trainstack_runtime.checkpoint import (
        MANIFEST,
        CheckpointConfig,
        CheckpointManager,
        TrainState,
        _safe_loads,
        committed_steps,
        select_checkpoint,
        step_dir_name,
        verify,
    )
    from trainstack_runtime.data import ResumableLoader, SyntheticRegression
    from trainstack_runtime.exitcodes import ConfigError


def _state(seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loader = ResumableLoader(SyntheticRegression(32, 4, seed=3), 4, seed=3)
    return TrainState(model, opt, sched, loader)


def _train(state: TrainState, steps: int) -> list[float]:
    assert state.optimizer is not None
    assert state.scheduler is not None
    assert state.loader is not None
    losses = []
    for _ in range(steps):
        x, y = next(state.loader)  # type: ignore[call-overload]
        loss = torch.nn.functional.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()  # type: ignore[attr-defined]
        losses.append(loss.item())
    return losses


def _manager(root: Path, **kw: object) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(root=root, **kw))  # type: ignore[arg-type]


def test_round_trip_continues_bit_exact(tmp_path: Path) -> None:
    ref = _state()
    _train(ref, 5)
    random.random()  # the Python RNG is part of the state too
    mgr = _manager(tmp_path)
    mgr.save(5, ref, blocking=True)
    expected = _train(ref, 6)
    expected_py = random.random()

    fresh = _state(seed=99)  # different init and RNG: everything must come from the checkpoint
    resumed = _manager(tmp_path)
    assert resumed.restore(fresh) == 5
    assert _train(fresh, 6) == expected
    assert random.random() == expected_py
    for a, b in zip(
        ref.model.state_dict().values(), fresh.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


def test_async_snapshot_is_isolated_from_later_updates(tmp_path: Path) -> None:
    state = _state()
    _train(state, 2)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    mgr = _manager(tmp_path)
    mgr.save(2, state)
    mgr.wait_for_staging()  # what the loop calls before optimizer.step()
    with torch.no_grad():
        for p in state.model.parameters():
            p.add_(1.0)  # an optimizer step racing with the background write
    mgr.wait()
    check = _state(seed=5)
    _manager(tmp_path).restore(check)
    for key, value in check.model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_layout_manifest_latest_and_retention(tmp_path: Path) -> None:
    state = _state()
    mgr = _manager(tmp_path, keep=2)
    for step in (1, 2, 3):
        _train(state, 1)
        mgr.save(step, state)
    mgr.close()
    assert committed_steps(tmp_path) == [2, 3]
    assert (tmp_path / "LATEST").read_text().strip() == "3"
    newest = tmp_path / step_dir_name(3)
    manifest = json.loads((newest / MANIFEST).read_text())
    assert manifest["format"] == "trainstack-checkpoint/1"
    assert manifest["step"] == 3
    assert manifest["world_size"] == 1
    assert set(manifest["files"]) == {
        "shared.pkl",
        "rank-00000.bin",
        "rank-00000.pkl",
        "rank-00000.done.json",
    }
    assert verify(newest).ok
    assert not list(tmp_path.glob("*.tmp"))


def test_local_tier_is_uploaded_and_cleaned(tmp_path: Path) -> None:
    durable, local = tmp_path / "durable", tmp_path / "nvme"
    state = _state()
    mgr = _manager(durable, local_root=local)
    mgr.save(7, state, blocking=True)
    assert verify(durable / step_dir_name(7)).ok
    assert list(local.iterdir()) == []
    assert _manager(durable).restore(_state(seed=1)) == 7


def _committed(tmp_path: Path, steps: tuple[int, ...] = (1, 2)) -> Path:
    state = _state()
    mgr = _manager(tmp_path, keep=5)
    for step in steps:
        _train(state, 1)
        mgr.save(step, state, blocking=True)
    return tmp_path / step_dir_name(steps[-1])


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x80
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: _flip(d / "rank-00000.bin"), "rank-00000.bin: sha256 mismatch"),
        (lambda d: _flip(d / "shared.pkl"), "shared.pkl: sha256 mismatch"),
        (
            lambda d: (d / "rank-00000.bin").write_bytes((d / "rank-00000.bin").read_bytes()[:-3]),
            "rank-00000.bin: size",
        ),
        (lambda d: (d / "rank-00000.pkl").unlink(), "missing file rank-00000.pkl"),
        (lambda d: (d / MANIFEST).unlink(), "no manifest.json"),
        (lambda d: (d / MANIFEST).write_text('{"format": "trainstack-che'), "unreadable manifest"),
        (lambda d: (d / MANIFEST).write_text('{"format": "other"}'), "not a trainstack"),
    ],
    ids=[
        "bitflip-data",
        "bitflip-skeleton",
        "truncated",
        "missing-file",
        "no-manifest",
        "torn-manifest",
        "foreign-manifest",
    ],
)
def test_verify_detects_damage(tmp_path: Path, damage: object, reason: str) -> None:
    newest = _committed(tmp_path)
    assert verify(newest).ok
    damage(newest)  # type: ignore[operator]
    result = verify(newest)
    assert not result.ok
    assert reason in result.reason


def test_select_falls_back_and_quarantines(tmp_path: Path) -> None:
    newest = _committed(tmp_path, (1, 2, 3))
    _flip(newest / "rank-00000.bin")
    (tmp_path / step_dir_name(2) / MANIFEST).unlink()
    assert select_checkpoint(tmp_path, world_size=1) == 1
    assert committed_steps(tmp_path) == [1]
    assert (tmp_path / (step_dir_name(3) + ".corrupt")).is_dir()
    assert (tmp_path / (step_dir_name(2) + ".corrupt")).is_dir()


def test_select_rejects_other_world_size(tmp_path: Path) -> None:
    _committed(tmp_path, (1,))
    with pytest.raises(ConfigError, match="written by 1 ranks but this job has 4"):
        select_checkpoint(tmp_path, world_size=4)


def test_restore_starts_fresh_and_cleans_partial_writes(tmp_path: Path) -> None:
    (tmp_path / (step_dir_name(9) + ".tmp")).mkdir(parents=True)
    assert _manager(tmp_path).restore(_state()) == 0
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_pickles_refuse_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("owned",))

    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.print"):
        _safe_loads(pickle.dumps(Evil()))


def test_unrestorable_state_fails_fast(tmp_path: Path) -> None:
    class Opaque:
        def state_dict(self) -> dict[str, object]:
            return {"fn": Path("x")}

        def load_state_dict(self, _: dict[str, object]) -> None:
            return None

    state = _state()
    state.extra["opaque"] = Opaque()
    with pytest.raises(ConfigError, match="cannot restore"):
        _manager(tmp_path).save(1, state)


def test_config_from_env_validates() -> None:
    cfg = CheckpointConfig.from_env(
        {"TRAINSTACK_CHECKPOINT_DIR": "/ckpt", "TRAINSTACK_CHECKPOINT_EVERY": "50"}
    )
    assert cfg.root == Path("/ckpt")
    assert cfg.every == 50
    assert CheckpointConfig.from_env({}).root == Path("/checkpoints")
    with pytest.raises(ConfigError):
        CheckpointConfig.from_env({"TRAINSTACK_CHECKPOINT_KEEP": "0"})
    with pytest.raises(ConfigError):
        CheckpointConfig.from_env({"TRAINSTACK_CHECKPOINT_EVERY": "often"})


def test_loader_position_round_trip() -> None:
    data = SyntheticRegression(20, 3, seed=1)
    a = ResumableLoader(data, 3, rank=1, world_size=2, seed=1)
    for _ in range(4):  # crosses an epoch boundary (10 samples per rank, 3 per batch)
        next(a)
    b = ResumableLoader(data, 3, rank=1, world_size=2, seed=1)
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        for x, y in zip(next(a), next(b), strict=True):
            assert torch.equal(x, y)
    with pytest.raises(ConfigError):
        ResumableLoader(data, 3, rank=0, world_size=4, seed=1).load_state_dict(a.state_dict())


def test_time_based_interval_is_checked_every_n_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("trainstack_runtime.checkpoint.time.monotonic", lambda: clock[0])
    mgr = _manager(tmp_path, interval_s=600.0, check_every=10)
    clock[0] += 599
    assert not mgr.should_save(10)  # not yet due
    clock[0] += 2
    assert not mgr.should_save(11)  # due, but only checked every 10 steps
    assert mgr.should_save(20)
    mgr._last_save_clock = clock[0]  # what save() records
    assert not mgr.should_save(30)
    clock[0] += 600
    assert mgr.should_save(30)


def test_interval_config_from_env(tmp_path: Path) -> None:
    cfg = CheckpointConfig.from_env(
        {
            "TRAINSTACK_CHECKPOINT_DIR": str(tmp_path),
            "TRAINSTACK_CHECKPOINT_INTERVAL_S": "600",
            "TRAINSTACK_CHECKPOINT_KEEP": "3",
        }
    )
    assert (cfg.interval_s, cfg.check_every, cfg.keep, cfg.every) == (600.0, 10, 3, 0)
    with pytest.raises(ConfigError, match="TRAINSTACK_CHECKPOINT_INTERVAL_S"):
        CheckpointConfig.from_env({"TRAINSTACK_CHECKPOINT_INTERVAL_S": "-1"})
