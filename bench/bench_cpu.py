"""CPU time per run of the runtime in a source tree: an A/B check of two trees on a busy machine.

    .venv/bin/python bench/bench_cpu.py [SOURCE_ROOT]      # default: this repository

Schedules 5,000 no-op runs across 50 threads due in an hour (``sched``), then schedules
5,000 due now and waits until all ran (``exec``, both steps), with ``synchronous=NORMAL``
(so fsync does not dominate), and prints one JSON line: process CPU time and wall time per
run, in µs.
Process CPU time (every thread of the process, the storage pool included) moves far less
with other processes' load than wall time does, so running two trees alternately a few
times (e.g. a checkout of an older commit and this one) compares their per-run cost when
`bench_effects.py`'s wall-clock figures are swamped by the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime import Runtime, ThreadState  # noqa: E402

THREADS = 50
RUNS = 5000


async def _schedule(thread: ThreadState, count: int, due: float, delay: float) -> None:
    for _ in range(count):
        await thread.schedule_effect("noop", {"due": due}, delay=delay)


async def main() -> None:
    """Measure and print the JSON line."""
    with tempfile.TemporaryDirectory() as data_dir:
        async with Runtime(
            app_dir=ROOT / "bench" / "app", data_dir=data_dir, synchronous="NORMAL",
            load_packages=False,
        ) as rt:
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
        "exec_cpu_us": round((cpu2 - cpu1) * per_run, 1),
        "exec_wall_us": round((wall2 - wall1) * per_run, 1),
    }))


if __name__ == "__main__":
    asyncio.run(main())
