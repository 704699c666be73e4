"""The in-process alarm timer of a source tree, alone: µs to arm, to disarm, and CPU to fire.

    .venv/bin/python bench/bench_timer.py [SOURCE_ROOT]

SOURCE_ROOT defaults to this repository; the timer is the one `SystemClock.create_timer`
makes there. On one event loop: 10,000 `arm` calls on 100 thread ids due 1-6 s out (each
replaces the thread's alarm), then 100 `disarm`; then 2,000 alarms on distinct ids due
within 0.5 s, and the process CPU time from arming them until all fired, per alarm (the
loop's own work included). Prints one JSON line. Alternate two trees a few times to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from _args import source_tree  # bench/_args.py: bench/ is on the path

_parser = argparse.ArgumentParser(description="the alarm timer of a source tree, alone")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
OPTS = _parser.parse_args()
sys.path.insert(0, str(OPTS.root.resolve()))

from runtime.alarms import SystemClock  # noqa: E402


async def main() -> None:
    """Measure and print the JSON line."""
    fired: list[str] = []
    count = 2000
    done = asyncio.Event()

    def on_alarm(thread_id: str) -> None:
        fired.append(thread_id)
        if len(fired) >= count:
            done.set()

    timer = SystemClock().create_timer(on_alarm)
    timer.start()
    n = 10_000
    now = time.time()
    start = time.perf_counter()
    for i in range(n):
        timer.arm(f"t{i % 100}", now + 1 + (i % 500) * 0.01)
    arm_us = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for i in range(100):
        timer.disarm(f"t{i}")
    disarm_us = (time.perf_counter() - start) / 100 * 1e6
    base = time.time()
    cpu = time.process_time()
    for i in range(count):
        timer.arm(f"f{i}", base + 0.2 + i * 0.00015)
    await done.wait()
    fire_us = (time.process_time() - cpu) / count * 1e6
    timer.shutdown()
    print(json.dumps({"timer": type(timer).__name__, "arm_us": round(arm_us, 1),
                      "disarm_us": round(disarm_us, 1), "arm_fire_cpu_us": round(fire_us, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
