"""CheckpointManager in one process: round trip, staging semantics, manifest verification."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import random
import threading
import time
import zipfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.harness import HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from trainstack_runtime import checkpoint, ckptfiles, ckptwrite
    from trainstack_runtime.checkpoint import (
        MANIFEST,
        CheckpointConfig,
        CheckpointManager,
        TrainState,
        buffer_keys,
        committed_steps,
        select_checkpoint,
        step_dir_name,
        verify,
    )
    from trainstack_runtime.ckptmemory import staging_memory_issue
    from trainstack_runtime.ckptpickle import SafeReader, safe_loads
    from trainstack_runtime.data import ResumableLoader, SyntheticRegression
    from trainstack_runtime.exitcodes import ConfigError, StorageError


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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_buffers_are_the_ones_of_the_saved_step_even_when_staging_runs_late(
    tmp_path: Path, compiled: bool
) -> None:
    """A forward after save() changes BatchNorm's statistics in place while the background
    staging may not have copied them yet; save() snapshots buffers first. For a
    torch.compile'd model the buffer names carried `_orig_mod.` where DCP's keys do not,
    none was snapshotted, and a checkpoint of step 2 held step 3's statistics (issue 40 #3).
    The stager is held back here until after the forward, so the race is certain."""
    state = _state()
    if compiled:
        state.model = torch.compile(state.model, backend="eager")  # no C++ toolchain needed
    _train(state, 2)
    assert buffer_keys(state.model) <= set(get_state_dict(state.model, [])[0])
    before = {k: v.clone() for k, v in get_state_dict(state.model, [])[0].items()}
    mgr = _manager(tmp_path)
    release = threading.Event()
    stage = mgr._stager.stage

    def late(tree: object) -> Future[object]:
        done: Future[object] = Future()

        def run() -> None:
            release.wait(30)
            staged = stage(tree)
            done.set_result(staged.result() if isinstance(staged, Future) else staged)

        threading.Thread(target=run, daemon=True).start()
        return done

    mgr._stager.stage = late  # type: ignore[method-assign]
    mgr.save(2, state)
    state.model.train()
    with torch.no_grad():
        state.model(torch.randn(16, 4) * 10)  # new running statistics, in place
    release.set()
    mgr.wait()
    check = _state(seed=5)
    _manager(tmp_path).restore(check)
    for key, value in check.model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_staging_waits_for_the_training_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 40 #4: with an accelerator, DefaultStager copies on its own stream and never
    waited for the training stream, so the copies could read tensors optimizer.step() had
    not finished writing. No GPU here: the stager runs against a stream and an event that
    follow torch's contract (Event.record on the current stream at stage(), the staging
    stream's wait_event before its copies), as test_comm_timer.py does for its events. On a
    GPU, docs/testing.md says how to run the real one."""
    log: list[str] = []

    class Event:
        def __init__(self, *_: object, **__: object) -> None:
            log.append("event")

        def record(self, stream: object = None) -> None:
            log.append("record on the current stream" if stream is None else "record")

    class Stream:
        def wait_event(self, event: object) -> None:
            assert isinstance(event, Event)
            log.append("staging stream waits")

        def __enter__(self) -> Stream:
            log.append("enter staging stream")
            return self

        def __exit__(self, *_: object) -> None:
            log.append("leave staging stream")

        def synchronize(self) -> None:
            log.append("synchronize")

    monkeypatch.setattr(torch, "Event", Event)
    stager = checkpoint._new_stager()
    stager._staging_stream = Stream()  # type: ignore[assignment]
    stager._config = dataclasses.replace(stager._config, use_non_blocking_copy=True)
    copy = stager._state_dict_stager.stage

    def staged(tree: Any, **kw: Any) -> Any:
        log.append("copies")
        return copy(tree, **kw)

    stager._state_dict_stager.stage = staged  # type: ignore[method-assign]
    result = stager.stage({"w": torch.ones(2)})
    assert isinstance(result, Future)
    assert torch.equal(result.result()["w"], torch.ones(2))
    stager.close()
    assert log == [
        "event",
        "record on the current stream",
        "staging stream waits",
        "enter staging stream",
        "copies",
        "leave staging stream",
        "synchronize",
    ]


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
    assert manifest["format"] == "trainstack-checkpoint/2"
    assert manifest["step"] == 3
    assert manifest["world_size"] == 1
    assert set(manifest["files"]) == {
        ".metadata",
        "__0_0.distcp",
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
        (lambda d: _flip(d / "__0_0.distcp"), "__0_0.distcp: xxh3_128 mismatch"),
        (lambda d: _flip(d / ".metadata"), ".metadata: xxh3_128 mismatch"),
        (lambda d: _flip(d / "rank-00000.pkl"), "rank-00000.pkl: xxh3_128 mismatch"),
        (
            lambda d: (d / "__0_0.distcp").write_bytes((d / "__0_0.distcp").read_bytes()[:-3]),
            "__0_0.distcp: size",
        ),
        (lambda d: (d / "rank-00000.pkl").unlink(), "missing file rank-00000.pkl"),
        (lambda d: (d / MANIFEST).unlink(), "no manifest.json"),
        (lambda d: (d / MANIFEST).write_text('{"format": "trainstack-che'), "unreadable manifest"),
        (lambda d: (d / MANIFEST).write_text('{"format": "other"}'), "not a trainstack"),
    ],
    ids=[
        "bitflip-data",
        "bitflip-index",
        "bitflip-private",
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


def test_manifest_checksums_are_of_the_bytes_on_disk(tmp_path: Path) -> None:
    """Taken while DCP writes (no read-back): each one must equal the file's own checksum,
    the index's included (written as .metadata.tmp, then renamed)."""
    newest = _committed(tmp_path)
    files = json.loads((newest / MANIFEST).read_text())["files"]
    for name, meta in files.items():
        assert meta == {"size": (newest / name).stat().st_size, **_sum(newest / name)}, name


def _sum(path: Path) -> dict[str, str]:
    return {"xxh3_128": ckptfiles.file_checksum(path)}


def test_save_does_not_read_its_data_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a file back right after fsync reads the page cache: it costs a pass over the
    checkpoint and proves nothing the checksum taken while writing does not."""
    real = ckptfiles.file_checksum

    def no_data_reads(path: Path, algorithm: str = "xxh3_128") -> str:
        assert path.suffix != ".distcp", path
        assert path.name != ".metadata", path
        return real(path, algorithm)

    monkeypatch.setattr(ckptfiles, "file_checksum", no_data_reads)
    newest = _committed(tmp_path)
    monkeypatch.undo()
    assert verify(newest).ok


def _record_crcs(raw: bytes) -> list[int]:
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return [i.CRC for i in archive.infolist()]


def test_checkpoint_records_skip_torch_crc_but_other_saves_keep_it(tmp_path: Path) -> None:
    """The writer thread turns off torch.save's per-record CRC-32 (the file checksum covers
    those bytes); the switch must reach torch (it fails here if torch stops reading
    ``get_crc32_options``) and must not leak into torch.save calls of other threads."""
    newest = _committed(tmp_path)
    infos = SafeReader(newest).read_metadata().storage_data.values()
    assert infos
    for info in infos:
        raw = (newest / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
        assert set(_record_crcs(raw)) == {0}, info

    inside, release = threading.Event(), threading.Event()

    def writer() -> None:
        with ckptwrite.without_record_crc32():
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert inside.wait(30)
        buf = io.BytesIO()
        torch.save(torch.ones(1000), buf)
        assert 0 not in _record_crcs(buf.getvalue())
    finally:
        release.set()
        thread.join()


def test_checkpoints_with_sha256_checksums_still_verify(tmp_path: Path) -> None:
    """Checkpoints of this format written before the switch to xxh3_128 list sha256."""
    newest = _committed(tmp_path)
    manifest = json.loads((newest / MANIFEST).read_text())
    for name, meta in manifest["files"].items():
        del meta["xxh3_128"]
        meta["sha256"] = ckptfiles.file_checksum(newest / name, "sha256")
    (newest / MANIFEST).write_text(json.dumps(manifest))
    assert verify(newest).ok
    _flip(newest / "__0_0.distcp")
    assert verify(newest).reason == "__0_0.distcp: sha256 mismatch"
    del manifest["files"]["rank-00000.done.json"]["sha256"]
    (newest / MANIFEST).write_text(json.dumps(manifest))
    # Files 0 and 2 by name (.metadata, rank-00000.done.json): the flipped one is not in it.
    reason = verify(newest, share=(0, 2)).reason
    assert reason == "rank-00000.done.json: no checksum in the manifest"


def test_local_tier_upload_fails_on_bytes_that_changed_on_the_node(tmp_path: Path) -> None:
    src = tmp_path / "local.distcp"
    src.write_bytes(b"x" * 1000)
    written = {"size": 1000, **_sum(src)}
    assert ckptfiles.copy_verified(src, tmp_path / "a", written) == written
    _flip(src)
    with pytest.raises(StorageError, match="the node's disk returned different bytes"):
        ckptfiles.copy_verified(src, tmp_path / "b", written)


def test_select_falls_back_and_quarantines(tmp_path: Path) -> None:
    newest = _committed(tmp_path, (1, 2, 3))
    _flip(newest / "__0_0.distcp")
    (tmp_path / step_dir_name(2) / MANIFEST).unlink()
    assert select_checkpoint(tmp_path) == 1
    assert committed_steps(tmp_path) == [1]
    assert (tmp_path / (step_dir_name(3) + ".corrupt")).is_dir()
    assert (tmp_path / (step_dir_name(2) + ".corrupt")).is_dir()


def test_checkpoint_of_the_first_format_is_refused_not_quarantined(tmp_path: Path) -> None:
    old = tmp_path / step_dir_name(4)
    old.mkdir()
    (old / MANIFEST).write_text(json.dumps({"format": "trainstack-checkpoint/1", "files": {}}))
    with pytest.raises(ConfigError, match=r"format 'trainstack-checkpoint/1' of an earlier"):
        _manager(tmp_path).restore(_state())
    assert committed_steps(tmp_path) == [4]  # left as it is


def test_restore_starts_fresh_and_cleans_partial_writes(tmp_path: Path) -> None:
    (tmp_path / (step_dir_name(9) + ".tmp")).mkdir(parents=True)
    assert _manager(tmp_path).restore(_state()) == 0
    assert list(tmp_path.iterdir()) == []


def test_a_value_restore_would_refuse_is_refused_at_the_first_save(tmp_path: Path) -> None:
    """issue 40 #2: a module whose get_extra_state() returns an io.BytesIO (older Transformer
    Engine) saved and committed, then every resume failed under weights_only. The first save
    refuses it, naming the key; plain extra state saves and restores."""

    class Opaque(torch.nn.Module):
        def get_extra_state(self) -> object:
            return io.BytesIO(b"fp8 meta")

        def set_extra_state(self, state: object) -> None:
            self.restored = state

    state = _state()
    state.model.add_module("te", Opaque())
    mgr = _manager(tmp_path)
    with pytest.raises(ConfigError, match=r"model\.te\._extra_state: a BytesIO that no checkpoint"):
        mgr.save(1, state, blocking=True)
    assert not any(p.name.startswith("step-") for p in tmp_path.iterdir())

    class Plain(Opaque):
        def get_extra_state(self) -> object:
            return {"scale": torch.ones(2), "format": "e4m3", "history": [1, 2]}

    state = _state()
    state.model.add_module("te", Plain())
    _manager(tmp_path).save(1, state, blocking=True)
    fresh = _state()
    fresh.model.add_module("te", Plain())
    assert _manager(tmp_path).restore(fresh) == 1
    restored = fresh.model.te.restored
    assert restored["format"] == "e4m3"
    assert restored["history"] == [1, 2]
    assert torch.equal(restored["scale"], torch.ones(2))


def test_checkpoint_pickles_refuse_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("owned",))

    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.print"):
        safe_loads(pickle.dumps(Evil()))


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
    with pytest.raises(ConfigError, match="seed"):
        ResumableLoader(data, 3, rank=1, world_size=2, seed=2).load_state_dict(a.state_dict())


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


@pytest.mark.parametrize("scaler", [False, True], ids=["optimizer.step", "GradScaler.step"])
def test_optimizer_step_waits_for_staging_without_the_loop_calling_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scaler: bool
) -> None:
    """Issue 22 #2: loops that never call wait_for_staging (Hugging Face, Lightning, a
    GradScaler) must not commit the next step's tensors under this step's label. A global
    optimizer step pre-hook (torch/optim/optimizer.py, register_optimizer_step_pre_hook)
    makes optimizer.step() wait; GradScaler.step calls optimizer.step (torch/amp/grad_scaler.py)."""
    state = _state()
    _train(state, 2)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    mgr = _manager(tmp_path)
    stage = mgr._stager._state_dict_stager.stage

    def slow_stage(*args: object, **kwargs: object) -> object:
        time.sleep(0.5)  # staging still running when the loop reaches optimizer.step()
        return stage(*args, **kwargs)

    monkeypatch.setattr(mgr._stager._state_dict_stager, "stage", slow_stage)
    mgr.save(2, state)
    assert state.optimizer is not None
    x, y = next(state.loader)  # type: ignore[call-overload]
    loss = torch.nn.functional.mse_loss(state.model(x), y)
    state.optimizer.zero_grad()
    if scaler:
        grad_scaler = torch.amp.GradScaler("cpu")
        grad_scaler.scale(loss).backward()
        grad_scaler.step(state.optimizer)
        grad_scaler.update()
    else:
        loss.backward()
        state.optimizer.step()
    mgr.wait()
    assert mgr.take_hook_stall() > 0  # the step did wait
    check = _state(seed=5)
    assert _manager(tmp_path).restore(check) == 2
    for key, value in check.model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_verification_is_shared_between_ranks(tmp_path: Path) -> None:
    """Issue 22 #12: rank r hashes files r, r+W, ... (sorted by name); sizes are checked by all."""
    newest = _committed(tmp_path)
    names = sorted(json.loads((newest / MANIFEST).read_text())["files"])
    _flip(newest / names[0])
    assert verify(newest, share=(1, 2)).ok
    assert not verify(newest, share=(0, 2)).ok


def test_loader_resumes_on_another_world_size() -> None:
    """A resharded resume skips nothing of the epoch and re-reads less than a batch per rank."""
    data = SyntheticRegression(48, 2, seed=4)
    old = [ResumableLoader(data, 3, rank=r, world_size=2, seed=4) for r in range(2)]
    consumed: list[torch.Tensor] = []
    for _ in range(3):
        for loader in old:
            consumed.extend(next(loader)[0])
    for world in (1, 3, 4):
        new = [ResumableLoader(data, 3, rank=r, world_size=world, seed=4) for r in range(world)]
        for loader in new:
            loader.load_state_dict(old[0].state_dict())
        rest: list[torch.Tensor] = []
        for loader in new:
            while loader.epoch == 0:
                batch = next(loader)[0]
                if loader.epoch == 0:
                    rest.extend(batch)
        seen = {tuple(t.tolist()) for t in consumed + rest}
        # Each rank uses whole batches of its 48 // W samples: that prefix of the epoch's
        # permutation is what an uninterrupted run on W ranks would have read.
        usable = (48 // world) // 3 * 3 * world
        assert len(seen) == usable, world  # nothing of it skipped
        assert len(consumed) + len(rest) - len(seen) < 3 * world, world


def test_dcp_index_is_read_without_running_code(tmp_path: Path) -> None:
    newest = _committed(tmp_path)
    assert SafeReader(newest).read_metadata().state_dict_metadata

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("owned",))

    (newest / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.print"):
        SafeReader(newest).read_metadata()


def test_retention_deletes_quarantined_checkpoints_older_than_the_kept(tmp_path: Path) -> None:
    (tmp_path / (step_dir_name(1) + ".corrupt")).mkdir(parents=True)
    (tmp_path / (step_dir_name(9) + ".corrupt1")).mkdir()
    state = _state()
    mgr = _manager(tmp_path, keep=2)
    for step in (3, 4, 5):
        _train(state, 1)
        mgr.save(step, state, blocking=True)
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert names == [step_dir_name(4), step_dir_name(5), step_dir_name(9) + ".corrupt1"]


def _cgroup(tmp_path: Path, limit: str, anon: int) -> Path:
    (tmp_path / "memory.max").write_text(limit + "\n")
    (tmp_path / "memory.stat").write_text(f"anon {anon}\nfile 999999999999\n")
    return tmp_path


def test_staging_memory_is_checked_against_the_pod(tmp_path: Path) -> None:
    gib = 1 << 30
    # 2 ranks x 3 GiB on top of 4 GiB in use: fits in 16 GiB, not in 8 (page cache ignored).
    assert staging_memory_issue(3 * gib, 2, _cgroup(tmp_path, str(16 * gib), 4 * gib)) is None
    issue = staging_memory_issue(3 * gib, 2, _cgroup(tmp_path, str(8 * gib), 4 * gib))
    assert issue is not None
    assert "needs 6.0 GiB" in issue
    assert "4.0 GiB left of its 8.0 GiB limit" in issue
    assert staging_memory_issue(3 * gib, 2, _cgroup(tmp_path, "max", 4 * gib)) is None
    assert staging_memory_issue(3 * gib, 2, tmp_path / "absent") is None


def test_first_save_refuses_staging_the_pod_cannot_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cg").mkdir()
    cgroup = _cgroup(tmp_path / "cg", "100", 0)  # 100 bytes: less than the state
    monkeypatch.setattr("trainstack_runtime.ckptmemory.CGROUP", cgroup)
    with pytest.raises(ConfigError, match="raise the job's memory request"):
        _manager(tmp_path / "ckpt").save(1, _state())
