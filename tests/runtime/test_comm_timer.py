"""Exposed communication time (issue 22 #13).

On CUDA, ``backward()`` returns once kernels are queued and NCCL collectives run on their own
stream, so CPU timestamps around them measure enqueue time. The runtime records CUDA events on
the compute stream instead and reads them once complete. No GPU here: the CUDA path runs
against events that follow ``torch.cuda.Event``'s contract (``record``, ``query``,
``elapsed_time`` in milliseconds), with completion and GPU time under the test's control.
"""

from __future__ import annotations

import pytest

from tests.runtime.harness import HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch
    from trainstack_runtime.session import CommTimer, Session


class GpuClock:
    """A GPU timeline: events get the GPU time of their record(); the GPU finishes work when
    the test says so."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.finished_ms = -1.0

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, clock: GpuClock) -> None:
        self.clock, self.at_ms = clock, -1.0

    def record(self) -> None:
        self.at_ms = self.clock.now_ms

    def query(self) -> bool:
        return 0 <= self.at_ms <= self.clock.finished_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query(), "elapsed_time on an incomplete event"
        assert end.query(), "elapsed_time on an incomplete event"
        return end.at_ms - self.at_ms


def test_cuda_path_measures_gpu_time_not_enqueue_time() -> None:
    gpu = GpuClock()
    timer = CommTimer(event=gpu.event)
    timer.cuda = True
    timer.start_backward()
    gpu.now_ms = 100.0
    timer.grad_ready()  # first gradient on the GPU timeline at 100 ms
    gpu.now_ms = 350.0  # the all-reduce the compute stream waits for ends at 350 ms
    timer.end_backward()  # the CPU got here long before: only the enqueue happened
    assert timer.take() == 0.0  # not complete yet: nothing counted, nothing waited for
    gpu.finished_ms = 350.0
    assert timer.take() == pytest.approx(0.25)  # counted once complete, a step later
    assert timer.take() == 0.0  # and only once


def test_cpu_path_and_no_gradient_hook() -> None:
    timer = CommTimer()
    timer.start_backward()
    timer.end_backward()  # no gradient became ready (frozen model): nothing measured
    assert timer.take() == 0.0
    timer.start_backward()
    timer.grad_ready()
    timer.end_backward()
    assert timer.take() >= 0.0


def test_session_watches_the_first_trainable_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    session = Session.__new__(Session)
    session._comm = CommTimer()
    session.watch_comm(model)
    assert session._comm.cuda is False  # CPU parameters: CPU clocks
    seen: list[str] = []
    session._comm.grad_ready = lambda: seen.append("ready")  # type: ignore[method-assign]
    with session.timed_backward():
        model(torch.ones(2, 3)).sum().backward()
    assert seen == ["ready"]
