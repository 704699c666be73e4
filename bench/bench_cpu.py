"""CPU time per run of the runtime in a source tree: an A/B check of two trees on a busy machine.

    .venv/bin/python bench/bench_cpu.py [SOURCE_ROOT] [--threads 50] [--runs 5000]
                                         [--synchronous NORMAL]

SOURCE_ROOT defaults to this repository. Schedules the runs (no-op effect) across the
threads, due in an hour (``sched``), then schedules as many due now and waits until all
ran (``exec``, both steps), and prints one JSON line: process CPU time and wall time per
run in µs, and the scheduling rate. ``synchronous=NORMAL`` by default, so fsync does not
dominate; ``gc.freeze()`` is called after start in either tree (the server's setting).
Process CPU time (every thread of the process, the storage pool included) moves far less
with other processes' load than wall time does, so running two trees alternately a few
times (e.g. a checkout of an older commit and this one) compares their per-run cost when
`bench_effects.py`'s wall-clock figures are swamped by the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

_parser = argparse.ArgumentParser(description="CPU time per run of a source tree")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
_parser.add_argument("--threads", type=positive_int, default=50)
_parser.add_argument("--runs", type=positive_int, default=5000)
_parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="NORMAL")
OPTS = _parser.parse_args()
ROOT = OPTS.root.resolve()
sys.path.insert(0, str(ROOT))

from runtime import Runtime, ThreadState  # noqa: E402

THREADS = OPTS.threads
RUNS = OPTS.runs // THREADS * THREADS


async def _schedule(thread: ThreadState, count: int, due: float, delay: float) -> None:
    for _ in range(count):
        await thread.schedule_effect("noop", {"due": due}, delay=delay)


async def main() -> None:
    """Measure and print the JSON line."""
    with tempfile.TemporaryDirectory() as data_dir:
        async with Runtime(
            app_dir=ROOT / "bench" / "app", data_dir=data_dir, synchronous=OPTS.synchronous,
            load_packages=False,
        ) as rt:
            gc.freeze()
            threads = [await rt.create_thread() for _ in range(THREADS)]
            due = time.time() + 3600
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(_schedule(t, RUNS // THREADS, due, 3600) for t in threads))
            cpu1, wall1 = time.process_time(), time.perf_counter()
            now = time.time()
            await asyncio.gather(*(_schedule(t, RUNS // THREADS, now, 0) for t in threads))
            await rt.wait_idle(300)
            cpu2, wall2 = time.process_time(), time.perf_counter()
    per_run = 1e6 / RUNS
    print(json.dumps({
        "sched_cpu_us": round((cpu1 - cpu0) * per_run, 1),
        "sched_wall_us": round((wall1 - wall0) * per_run, 1),
        "sched_per_second": round(RUNS / (wall1 - wall0)),
        "exec_cpu_us": round((cpu2 - cpu1) * per_run, 1),
        "exec_wall_us": round((wall2 - wall1) * per_run, 1),
    }))


if __name__ == "__main__":
    asyncio.run(main())
