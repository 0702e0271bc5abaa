"""Issue 39 #1: the cache keeps a share of its volume free for the kubelet and containerd.

On AWS the cache directory lies on the instance-store array with `/var/lib/kubelet`,
`/var/lib/containerd` and pod logs. The kubelet's defaults (k8s.io/kubernetes v1.37.2,
pkg/kubelet/eviction/defaults_linux.go: nodefs.available 10 %, imagefs.available 15 %;
pkg/kubelet/apis/config/v1beta1/defaults.go: image GC from 85 % used down to 80 %) evict
training pods and delete images when it fills, so a fill is admitted only with the reserve left
over, and the agent gives the reserve back when the volume's other tenants grow.

The volume here is simulated (``shutil.disk_usage`` answers for a volume of ``TOTAL`` bytes
whose used space is the cache's real bytes plus what the other tenants take), so the tests do
not depend on how full this machine's disk is.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from trainstack_prewarm import cache
from trainstack_prewarm.agent import CacheAgent
from trainstack_prewarm.cli import main

from tests.prewarm.conftest import LogCapture, make_files, write_tree
from tests.prewarm.test_evict import _version

TOTAL = 200_000  # bytes in the simulated volume
VERSION = 4 * 4096  # one version from _version(): four 4 KiB files


class Volume:
    """A volume of TOTAL bytes: the cache's files plus ``others`` bytes of other tenants."""

    def __init__(self, root: Path, others: int) -> None:
        self.root, self.others = root, others

    def cache_bytes(self) -> int:
        return sum(
            os.lstat(os.path.join(d, f)).st_size
            for d, _, names in os.walk(self.root)
            for f in names
            if cache.STATE_DIR not in Path(d).parts  # state files are a few bytes
        )

    def usage(self, _path: str | os.PathLike[str]) -> object:
        used = self.others + self.cache_bytes()
        return shutil._ntuple_diskusage(TOTAL, used, TOTAL - used)  # type: ignore[attr-defined]


@pytest.fixture
def volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Volume:
    vol = Volume(tmp_path / "cache", others=0)
    monkeypatch.setattr(shutil, "disk_usage", vol.usage)
    return vol


def _agent(volume: Volume, logs: LogCapture, reserve: float | None) -> CacheAgent:
    """An agent that only keeps the reserve (no fills, no mounts in these tests)."""
    return CacheAgent(
        volume.root,
        fill=lambda _r: None,
        mounter=None,  # type: ignore[arg-type]
        log=logs,
        reserve_percent=reserve,
    )


def _fetch(tmp_path: Path, logs: LogCapture, *extra: str) -> int:
    source = tmp_path / "fsx" / "new"
    write_tree(source, make_files(4, size=4096, salt="new"))
    return main(
        [
            "fetch", "--source", str(source), "--cache", str(tmp_path / "cache"),
            "--dataset", "fresh", "--version", "v1", "--start-jitter", "0", *extra,
        ],
        log=logs,
    )  # fmt: skip


def test_a_fill_evicts_until_the_reserve_stays_free_after_it(
    tmp_path: Path, volume: Volume, logs: LogCapture
) -> None:
    """Before the fill: 200,000 bytes, 110,000 taken by other tenants, two old versions of
    16,384 and the fill's own state: about 55,500 free, room for the new 16,384 — but not with
    20 % (40,000) left over. Without the reserve the fill started without evicting, leaving
    the volume about 80 % used."""
    volume.others = 110_000
    oldest, _ = _version(volume.root, "ds", "v1", used_at=1_000)
    newer, _ = _version(volume.root, "ds", "v2", used_at=2_000)
    assert _fetch(tmp_path, logs, "--reserve", "20") == 0
    assert [e["cache"] for e in logs.events("evicted")] == [str(oldest)]
    assert newer.exists()
    assert TOTAL - volume.others - volume.cache_bytes() >= TOTAL * 20 // 100


def test_the_cli_reserves_twenty_percent_by_default(
    tmp_path: Path, volume: Volume, logs: LogCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, without --reserve: the agent and fetch default to 20 %."""
    monkeypatch.delenv("TRAINSTACK_CACHE_RESERVE")
    volume.others = 110_000
    oldest, _ = _version(volume.root, "ds", "v1", used_at=1_000)
    _version(volume.root, "ds", "v2", used_at=2_000)
    assert _fetch(tmp_path, logs) == 0
    assert [e["cache"] for e in logs.events("evicted")] == [str(oldest)]


def test_a_fill_that_would_eat_into_the_reserve_is_refused(
    tmp_path: Path, volume: Volume, logs: LogCapture
) -> None:
    """Nothing to evict: 200,000 - 150,000 = 50,000 free; the fill's 16,384 fits, the 40,000
    reserve after it does not. The node keeps its headroom and the job sees why."""
    volume.others = 150_000
    assert _fetch(tmp_path, logs, "--reserve", "20") == 7  # ExitCode.LOCAL
    [error] = logs.events("error")
    assert re.search(
        r": needs 164\d\d bytes and keeps 40000 free \(20% of the volume, for the kubelet and "
        r"containerd\); the cache volume has 50000 free",
        error["error"],
    ), error["error"]  # the source's 16,384 bytes and its listing
    assert not (volume.root / "fresh" / "v1" / "a").exists()
    # A volume of its own (hostDir a dedicated file system) reserves nothing.
    assert _fetch(tmp_path, logs, "--reserve", "0") == 0


def test_the_agent_gives_the_reserve_back_when_other_tenants_grow(
    volume: Volume, logs: LogCapture
) -> None:
    """Admitted with the reserve free, the cache then sees images and logs grow past it: the
    agent evicts versions no pod holds, least recently used first, never a held one."""
    held, _ = _version(volume.root, "ds", "held", used_at=500)  # oldest, but a pod has it
    old, _ = _version(volume.root, "ds", "old", used_at=1_000)
    recent, _ = _version(volume.root, "ds", "recent", used_at=2_000)
    agent = _agent(volume, logs, 20)
    volume.others = 100_000  # 200,000 - 100,000 - 3 * 16,384 = 50,848 free: above 40,000
    assert agent.keep_reserve() == []
    volume.others = 115_000  # 35,848 free: below the reserve
    with cache.hold(held):
        assert agent.keep_reserve() == [old]
    assert held.exists()
    assert recent.exists()
    assert [e["reason"] for e in logs.events("evicted")] == ["reserve"]
    # --no-evict: the agent never evicts on its own account.
    volume.others = 150_000
    quiet = _agent(volume, LogCapture(), None)
    assert quiet.keep_reserve() == []
    assert recent.exists()


def test_the_keeper_thread_runs_on_its_timer_and_stops_with_the_agent(
    volume: Volume, logs: LogCapture
) -> None:
    """The agent process runs keep_reserve on a timer (and after each unpublish that released
    a hold); close() ends the thread."""
    old, _ = _version(volume.root, "ds", "old", used_at=1_000)
    volume.others = 150_000
    agent = _agent(volume, logs, 20)
    thread = agent.start_reserve_keeper(0.05)
    assert thread is not None
    deadline = time.monotonic() + 30
    while old.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not old.exists()
    agent.close()
    thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.mark.parametrize("bad", ["91", "-1", "nan", "x"])
def test_a_reserve_outside_0_to_90_percent_is_refused(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["fetch", "--source", "/x/", "--dataset", "d", "--version", "v", "--reserve", bad])
    assert info.value.code == 2
    assert "--reserve" in capsys.readouterr().err


def test_a_bad_reserve_in_the_environment_is_a_usage_error(
    logs: LogCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINSTACK_CACHE_RESERVE", "95")
    assert main(["probe"], log=logs) == 2
    [error] = logs.events("error")
    assert error["error"].startswith("$TRAINSTACK_CACHE_RESERVE='95': must be 0-90")
