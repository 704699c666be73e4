"""The cross-thread run index: listing runs across many threads (GET /api/runs).

Fills the SQLite runtime store's run index for --threads threads with --runs runs each
(mixed statuses, users and tags, as `RunIndexer` writes them: batches of 1,000), then
times the listings the API serves: the first page, a status filter, a user filter, a tag
filter, a thread filter, a time window, the counts, and walking every page of a filter
through its cursors; then the thread listings by last activity (GET /api/threads: first
page, user / agent / tag filters, every page). Prints a Markdown table of milliseconds per
call (median of --repeat).

With --rebuild N it measures instead how fast a start rebuilds the index after a crash:
a real runtime makes N threads with --runs pending runs each (thread files and all), the
index is emptied and marked incomplete (what `kill -9` leaves at worst), and the next
start's background rebuild (`Runtime.wait_run_index`) is timed.

    .venv/bin/python bench/bench_run_index.py [--threads 10000] [--runs 10]
    .venv/bin/python bench/bench_run_index.py --rebuild 2000 --runs 2
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _args import nonnegative_int, positive_int  # bench/_args.py: bench/ is on the path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import Runtime
from runtime.config import RetentionPolicy
from runtime.effects import EffectRun, EffectStatus
from runtime.storage.base import RunQuery, ThreadInfo, ThreadQuery
from runtime.storage.sqlite import SQLiteRuntimeStore

STATUSES = [EffectStatus.COMPLETED] * 6 + [EffectStatus.PENDING] * 2 + [
    EffectStatus.FAILED, EffectStatus.CANCELED,
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=positive_int, default=10_000)
    p.add_argument("--runs", type=positive_int, default=10, help="runs per thread")
    p.add_argument("--repeat", type=positive_int, default=7)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--rebuild", type=nonnegative_int, default=0, metavar="N",
                   help="time the rebuild after a crash over N real threads instead")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(dir=args.data_dir))
    try:
        if args.rebuild:
            asyncio.run(rebuild(args.rebuild, args.runs, base / "data"))
        else:
            run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


APP = Path(__file__).resolve().parent / "app"


async def rebuild(threads: int, runs: int, data: Path) -> None:
    def runtime() -> Runtime:
        return Runtime(app_dir=APP, data_dir=data, load_packages=False, extensions=[])

    rt = runtime()
    await rt.start()
    t0 = time.perf_counter()
    for _ in range(threads):
        state = await rt.create_thread()
        for _ in range(runs):
            await state.schedule_effect("noop", {"due": 0.0}, delay=86_400)
    made = time.perf_counter() - t0
    await rt.close()
    # What a crash leaves at worst: nothing of the index written, not marked complete.
    conn = sqlite3.connect(data / "runtime.sqlite")
    with conn:
        conn.execute("DELETE FROM run_index")
        conn.execute("UPDATE runtime_meta SET value = '0'")
    conn.close()
    rt = runtime()
    t0 = time.perf_counter()
    await rt.start()
    started = time.perf_counter() - t0
    await rt.wait_run_index()
    took = time.perf_counter() - t0
    page = await rt.list_runs(limit=1)
    await rt.close()
    total = sum(page.counts.values())
    assert page.complete and total == threads * runs, (page.complete, total)
    print(f"made {threads} threads x {runs} runs in {made:.1f} s; after a crash the start "
          f"took {started:.2f} s and the rebuild ended {took:.2f} s after it began: "
          f"{threads / took:,.0f} threads/s, {total / took:,.0f} runs/s")


def run(args: argparse.Namespace, base: Path) -> None:
    store = SQLiteRuntimeStore(base / "runtime.sqlite", "NORMAL")
    now = time.time()
    t0 = time.perf_counter()
    batch: list[EffectRun] = []
    for t in range(args.threads):
        tid = f"t{t:06d}"
        store.add_thread(ThreadInfo(id=tid, created_at_ts=now - 1e6, user_id=f"u{t % 500}",
                                    agent_id="helper" if t % 10 == 0 else "assistant",
                                    tags=("vip",) if t % 50 == 0 else ()))
        for r in range(args.runs):
            status = STATUSES[(t + r) % len(STATUSES)]
            at = now - (t * args.runs + r) * 0.01
            batch.append(EffectRun(
                id=f"{t:06d}{r:04d}", thread_id=tid, name="send_reminder" if r % 2 else "sync",
                status=status, args=None, run_at_ts=at, created_at_ts=at,
                started_at_ts=at if status is not EffectStatus.PENDING else None,
                finished_at_ts=at + 0.1 if status.finished else None,
                attempts=0 if status is EffectStatus.PENDING else 1,
                error="ValueError: no" if status is EffectStatus.FAILED else None,
            ))
            if len(batch) >= 1000:
                store.index_runs(batch)
                batch = []
    store.index_runs(batch)
    fill = time.perf_counter() - t0
    total = args.threads * args.runs
    keep = RetentionPolicy(completed_seconds=1e10, failed_seconds=1e10)

    def page(query: RunQuery) -> Callable[[], object]:
        return lambda: store.list_indexed_runs(query, now, keep, 50)

    def walk() -> int:
        seen, cursor = 0, None
        while True:
            runs, cursor = store.list_indexed_runs(
                RunQuery(statuses=(EffectStatus.FAILED,)), now, keep, 500, cursor
            )
            seen += len(runs)
            if cursor is None:
                return seen

    def threads(query: ThreadQuery) -> Callable[[], object]:
        return lambda: store.list_threads(50, None, query)

    def every_thread() -> int:
        seen, cursor = 0, None
        while True:
            infos, cursor = store.list_threads(500, cursor, ThreadQuery(by_activity=True))
            seen += len(infos)
            if cursor is None:
                return seen

    cases: list[tuple[str, Callable[[], object]]] = [
        ("first page (50), no filter", page(RunQuery())),
        ("status=failed", page(RunQuery(statuses=(EffectStatus.FAILED,)))),
        ("name=send_reminder&status=failed",
         page(RunQuery(name="send_reminder", statuses=(EffectStatus.FAILED,)))),
        ("user_id=u42", page(RunQuery(user_id="u42"))),
        ("tag=vip", page(RunQuery(tag="vip"))),
        ("thread_id", page(RunQuery(thread_id="t000042"))),
        ("since/until (5 min window)", page(RunQuery(since=now - 600, until=now - 300))),
        ("counts, no filter", lambda: store.count_indexed_runs(RunQuery(), now, keep)),
        ("counts, user_id=u42", lambda: store.count_indexed_runs(RunQuery(user_id="u42"),
                                                                 now, keep)),
        ("every failed run (pages of 500)", walk),
        ("threads by activity, first page (50)", threads(ThreadQuery(by_activity=True))),
        ("threads by activity, user_id=u42",
         threads(ThreadQuery(user_id="u42", by_activity=True))),
        ("threads by activity, agent_id=helper",
         threads(ThreadQuery(agent_id="helper", by_activity=True))),
        ("threads by activity, tag=vip", threads(ThreadQuery(tag="vip", by_activity=True))),
        ("every thread by activity (pages of 500)", every_thread),
    ]
    print(f"run index: {args.threads} threads x {args.runs} runs = {total} runs; "
          f"filled in {fill:.1f} s ({total / fill:,.0f} runs/s in batches of 1,000)\n")
    print("| listing | ms per call (median) |")
    print("|---|---|")
    for label, fn in cases:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
        print(f"| {label} | {statistics.median(times):.2f} |")
    store.close()


if __name__ == "__main__":
    main()
