"""The c10d rendezvous store of an elastic job, in a pod of its own (issue 43).

``python -m trainstack_runtime.rendezvous --port 23456`` hosts the TCPStore that torch's c10d
rendezvous backend keeps its state in (torch/distributed/elastic/rendezvous/
c10d_rendezvous_backend.py: every node's agent connects as a client when told
``is_host=False``, and the state lives under ``torch.rendezvous.<run id>``), and does nothing
else. The platform runs it as the elastic job's `rendezvous` task: one CPU-only pod that
Volcano never picks as a preempt or reclaim victim (docs/jobs.md, "Elastic jobs"), so that
losing any GPU worker, rank 0's included, leaves the rendezvous and the surviving workers'
round alone. A store hosted by a worker goes with that worker, and every other worker with
it.

The workers' own store (gloo and NCCL bootstrap) is not this one: with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the supervisor sets it) each round's rank 0 hosts a
fresh one (dynamic_rendezvous.py ``RendezvousStoreInfo.build``).

It exits 0 on SIGTERM, which Volcano sends when the job completes or restarts: the store's
state belongs to one run of the job, and the next run's pod starts with an empty one.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from datetime import timedelta
from types import FrameType

log = logging.getLogger("trainstack.rendezvous")
# torch's c10d backend timeout for a client's reads; the server's own does not matter here.
STORE_TIMEOUT = timedelta(seconds=60)


def serve(port: int, stop: threading.Event) -> int:
    """Host the store on ``port`` (every interface) until ``stop`` is set; the port it got
    (``port`` 0 picks a free one)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # noqa: PLC0415

    # multi_tenant as the c10d backend's own clients and servers are built (_create_tcp_store).
    store = TCPStore(
        "0.0.0.0",
        port,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=STORE_TIMEOUT,
    )
    bound = int(store.port)
    log.info("rendezvous store listening on port %d", bound)
    print(f"rendezvous store listening on port {bound}", flush=True)
    stop.wait()
    log.info("rendezvous store stopping")
    return bound


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m trainstack_runtime.rendezvous")
    parser.add_argument("--port", type=int, required=True, help="the port PET_RDZV_ENDPOINT names")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    serve(args.port, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
