"""How long one caller waits for a schedule, and how many commits of alarm rows it takes.

    .venv/bin/python bench/bench_schedule_wait.py [SOURCE_ROOT] [--synchronous FULL]
                                                  [--threads 10] [--runs 100]

SOURCE_ROOT defaults to this repository (pass a copy of another commit to compare; put
both copies in the same kind of place, e.g. both under /tmp: the same tree measured from
the repository and from a copy differed by ≈ 20 µs of CPU per run). Two workloads, each
in this process, with the no-op effect of ``bench/app``:

- ``idle``: one caller schedules a run due now on one of ``--threads`` threads in turn,
  waits until it ran, waits 20 ms more (a thread that ran a run a moment ago, as with a
  request now and then), and times each ``schedule_effect`` call (each thread's first
  schedule left out);
- ``stream``: one caller schedules 20 times ``--runs`` runs one after another over 20
  threads, each due 20 ms after it is scheduled, so each thread drains between its
  schedules (the peers' benchmark when scheduling falls behind).

For each it prints one JSON line: the schedule wait (ms: p50, mean, p90) and how many
times the runtime store's ``lower_alarm`` (a commit the caller waits for) and
``move_alarms`` (the flusher's batched commit) were called, counted by wrapping the
SQLite runtime store's methods in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

_parser = argparse.ArgumentParser(description="schedule wait and alarm-row commits")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
_parser.add_argument("--threads", type=positive_int, default=10)
_parser.add_argument("--runs", type=positive_int, default=100)
_parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
OPTS = _parser.parse_args()
ROOT = OPTS.root.resolve()
sys.path.insert(0, str(ROOT))

from runtime import Runtime  # noqa: E402
from runtime.storage import sqlite as _sqlite  # noqa: E402

COUNTS = {"lower_alarm": 0, "move_alarms": 0}


def _count(name: str) -> None:
    original = getattr(_sqlite.SQLiteRuntimeStore, name)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS[name] += 1
        return original(self, *args, **kwargs)

    setattr(_sqlite.SQLiteRuntimeStore, name, counted)


for _name in COUNTS:
    _count(_name)


def _summary(case: str, waits: list[float], schedules: int) -> dict[str, Any]:
    waits = sorted(waits)
    n = len(waits)
    return {
        "case": case, "synchronous": OPTS.synchronous, "schedules": schedules,
        "wait_p50_ms": round(waits[n // 2] * 1e3, 3),
        "wait_mean_ms": round(sum(waits) / n * 1e3, 3),
        "wait_p90_ms": round(waits[int(n * 0.9)] * 1e3, 3),
        **COUNTS,
    }


async def _idle(rt: Runtime) -> dict[str, Any]:
    threads = [await rt.create_thread() for _ in range(OPTS.threads)]
    waits = []
    for i in range(OPTS.runs):
        thread = threads[i % len(threads)]
        start = time.perf_counter()
        await thread.schedule_effect("noop", {"due": time.time()})
        waits.append(time.perf_counter() - start)
        await rt.wait_idle()
        await asyncio.sleep(0.02)
    return _summary("idle", waits[len(threads):], OPTS.runs)


async def _stream(rt: Runtime) -> dict[str, Any]:
    threads = [await rt.create_thread() for _ in range(20)]
    waits = []
    total = OPTS.runs * 20
    for i in range(total):
        start = time.perf_counter()
        await threads[i % 20].schedule_effect("noop", {"due": time.time() + 0.02}, delay=0.02)
        waits.append(time.perf_counter() - start)
    await rt.wait_idle()
    return _summary("stream", waits, total)


async def main() -> None:
    for case in (_idle, _stream):
        for key in COUNTS:
            COUNTS[key] = 0
        with tempfile.TemporaryDirectory() as data_dir:
            async with Runtime(app_dir=ROOT / "bench" / "app", data_dir=data_dir,
                               synchronous=OPTS.synchronous, freeze_gc=True) as rt:
                print(json.dumps({"source": str(ROOT), **await case(rt)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
