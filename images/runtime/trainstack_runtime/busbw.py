"""All-reduce bandwidth across the ranks of a job: ``trainstack healthcheck``'s program.

Run under torchrun, one process per GPU on every node (``torchrun --nnodes N
--nproc-per-node G -m trainstack_runtime.busbw``); NCCL on GPUs, gloo on CPU (the tests run it
that way). For each message size it times ``--iters`` all-reduces after ``--warmup`` untimed
ones and reports, as NVIDIA's nccl-tests do (NVIDIA/nccl-tests at 03a204a, doc/PERFORMANCE.md
"Bus bandwidth / AllReduce", and src/all_reduce.cu ``AllReduceGetBw``, which divides by 1.0E9):

* ``algbw = S / t``: bytes per all-reduce over its time, in GB/s (10^9 bytes per second);
* ``busbw = algbw * 2 (n - 1) / n`` for all-reduce over ``n`` ranks: the speed of the slowest
  link (NVLink, PCIe or network), comparable with the hardware's peak whatever ``n`` is.
  (all_reduce_perf switches to ``(n - 1) / (n + 1)``, in-network reduction, only when the
  environment sets ``NCCL_ALGO=NVLS`` or ``NVLSTREE``; otherwise, whichever algorithm NCCL
  picks, it reports ``2 (n - 1) / n``, and so do this program and the catalog's floors.)

The time of a size is the slowest rank's (the collective ends when its last rank does). Before
the timed loop one all-reduce of known values is checked (``wrong``: elements that differ), so
a fabric that corrupts data cannot pass on speed. The floor is held against the bus bandwidth
of the largest size, where the time is bandwidth and not latency.

Output: rank 0 prints one JSON object as its last line. Exit status, the same on every rank:
0, or ``EXIT_BELOW_FLOOR`` when that bandwidth is below ``--floor`` or an element was wrong;
2 for bad arguments (argparse's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

EXIT_BELOW_FLOOR = 1
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
DEFAULT_SIZES = "8M,64M,256M,1G"


def parse_size(text: str) -> int:
    """``64M`` -> 67108864 (binary units, as nccl-tests' -b/-e)."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    number = text[: len(text) - len(unit)]
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 64M")
    return int(number) * UNITS[unit]


def parse_sizes(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def algorithm_bandwidth(nbytes: int, seconds: float) -> float:
    """GB/s: bytes per second / 10^9."""
    return nbytes / seconds / 1e9


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth: algbw x 2 (n - 1) / n (nccl-tests doc/PERFORMANCE.md)."""
    return algorithm_bandwidth(nbytes, seconds) * 2 * (ranks - 1) / ranks


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainstack_runtime.busbw",
        description="All-reduce algorithm and bus bandwidth across the job's ranks (JSON).",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"message sizes in bytes, K/M/G binary units, comma-separated (default "
        f"{DEFAULT_SIZES})",
    )
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    parser.add_argument(
        "--floor",
        type=float,
        default=None,
        help="GB/s: exit non-zero if the largest size's bus bandwidth is below it",
    )
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or not args.sizes:
        parser.error("--iters must be >= 1, --warmup >= 0, and --sizes must name a size")
    return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every size on every rank; the same result (the slowest rank's times) on each."""
    import torch  # noqa: PLC0415 - the module's pure helpers load without torch
    import torch.distributed as dist  # noqa: PLC0415

    cuda = args.backend == "nccl" or (args.backend == "auto" and torch.cuda.is_available())
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        n = dist.get_world_size()
        rank = dist.get_rank()

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()

        results = []
        for nbytes in args.sizes:
            count = max(1, nbytes // 4)  # float32 elements
            # Every rank contributes rank + 1: the sum is n (n + 1) / 2 everywhere.
            data = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
            dist.all_reduce(data)
            wrong = int((data != n * (n + 1) / 2).sum().item())
            data.zero_()  # zeros stay zeros: no overflow over the timed loop
            for _ in range(args.warmup):
                dist.all_reduce(data)
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(data)
            sync()
            elapsed = torch.tensor(
                [time.perf_counter() - start, float(wrong)], dtype=torch.float64, device=device
            )
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            seconds = float(elapsed[0].item()) / args.iters
            size = count * 4
            results.append(
                {
                    "bytes": size,
                    "timeUs": round(seconds * 1e6, 3),
                    "algbwGBps": round(algorithm_bandwidth(size, seconds), 6),
                    "busbwGBps": round(bus_bandwidth(size, seconds, n), 6),
                    "wrong": int(elapsed[1].item()),
                }
            )
            del data
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(n)))
        return {
            "backend": backend,
            "worldSize": n,
            "nodes": max(1, n // local),
            "iters": args.iters,
            "results": results,
        }
    finally:
        dist.destroy_process_group()


def verdict(result: dict[str, Any], floor: float | None) -> dict[str, Any]:
    """The figure held against the floor (the largest size's bus bandwidth), the average over
    sizes (nccl-tests' "Avg bus bandwidth"), and whether it passes."""
    largest = max(result["results"], key=lambda r: r["bytes"])
    busbw = float(largest["busbwGBps"])
    wrong = sum(int(r["wrong"]) for r in result["results"])
    average = sum(float(r["busbwGBps"]) for r in result["results"]) / len(result["results"])
    return {
        **result,
        "busbwGBps": busbw,
        "avgBusbwGBps": round(average, 6),
        "floorGBps": floor,
        "wrong": wrong,
        "passed": wrong == 0 and (floor is None or busbw >= floor),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    report = verdict(measure(args), args.floor)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(report, sort_keys=True), flush=True)
    return 0 if report["passed"] else EXIT_BELOW_FLOOR


if __name__ == "__main__":
    sys.exit(main())
