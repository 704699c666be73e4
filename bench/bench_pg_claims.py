"""The PostgreSQL claim path alone: `finish_and_claim` from many storage threads at once.

Usage::

    .venv/bin/python bench/bench_pg_claims.py [--threads 100] [--runs 3000] [--workers 16]
        [--server-url postgresql://postgres@127.0.0.1:5432] [--json]

What the executor does per run on the PostgreSQL backend, without the rest of the runtime
(the loop, frames, the run index): ``runs`` pending runs over ``threads`` threads, all due,
then ``workers`` OS threads (the runtime's storage threads) take threads from a queue and
call `PostgresThreadStore.finish_and_claim` on them, each call finishing the thread's
previous run and claiming its next, until every run is finished: one call per run plus one
per thread. Each thread is worked by one worker at a time, as the runtime's actor lock
does. In a fresh database (``te_bench_claims_<pid>_<hex>``, dropped at the end). It prints
runs/s, the process's CPU per run (`time.process_time`, every thread) and the database's
commits per run (`pg_stat_database`). bench/README.md says what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import sys
import threading
import time
from pathlib import Path

from _args import positive_int  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

DEFAULT_SERVER = os.environ.get("THREAD_EFFECTS_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def _commits(url: str) -> int:
    """The committed transactions of ``url``'s database so far (`pg_stat_database`)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def measure(url: str, threads: int, runs: int, workers: int) -> dict[str, float]:
    """Schedule ``runs`` due runs over ``threads`` threads, then drain them with ``workers``."""
    from runtime.effects import EffectRun, EffectStatus
    from runtime.storage.base import Finish, ThreadInfo
    from runtime.storage.postgres import PostgresBackend

    backend = PostgresBackend(url, node_id="bench", pool_size=workers + 1)
    rtdb = backend.open()
    try:
        for t in range(threads):
            info = ThreadInfo(id=f"bench-{t}", created_at_ts=1.0)
            rtdb.add_thread(info)
            store = backend.create_thread_store(info)
            for i in range(t, runs, threads):
                store.insert_run(EffectRun(
                    id=f"r{i}", thread_id=info.id, name="noop", status=EffectStatus.PENDING,
                    args={}, run_at_ts=2.0 + i * 1e-6, created_at_ts=1.0))
            store.close()
    finally:
        rtdb.close()
        backend.close()
    # A server process counts its commits in pg_stat_database when it ends (or after
    # 10 s idle): the drain's backend is opened after the count and closed before the next.
    commits = _commits(url)
    backend = PostgresBackend(url, node_id="bench", pool_size=workers + 1)
    rtdb = backend.open()
    try:
        stores = [backend.open_thread_store(f"bench-{t}") for t in range(threads)]
        ready: queue.SimpleQueue[tuple[int, Finish | None] | None] = queue.SimpleQueue()
        for t in range(threads):
            ready.put((t, None))
        left = [threads]
        guard = threading.Lock()
        errors: list[BaseException] = []

        def work() -> None:
            while (item := ready.get()) is not None:
                t, finish = item
                try:
                    _, claimed, _ = stores[t].finish_and_claim(finish, 3.0)
                except BaseException as exc:
                    errors.append(exc)
                    claimed = None
                if claimed is not None:
                    ready.put((t, Finish(claimed.id, EffectStatus.COMPLETED, None, 3.0)))
                    continue
                with guard:
                    left[0] -= 1
                    if left[0] == 0:
                        for _ in range(workers):
                            ready.put(None)

        wall, cpu = time.perf_counter(), time.process_time()
        pool = [threading.Thread(target=work) for _ in range(workers)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if errors:
            raise errors[0]
        for store in stores:
            store.close()
    finally:
        rtdb.close()
        backend.close()
    time.sleep(0.5)  # the closed sessions' counts reach the statistics
    commits = _commits(url) - commits
    return {"runs_per_second": runs / wall, "cpu_per_run": cpu / runs,
            "commits_per_run": commits / runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=positive_int, default=100)
    parser.add_argument("--runs", type=positive_int, default=3000)
    parser.add_argument("--workers", type=positive_int, default=16)
    parser.add_argument("--server-url", default=DEFAULT_SERVER)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    opts = parser.parse_args()
    name = f"te_bench_claims_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(f"{opts.server_url}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        figures = measure(f"{opts.server_url}/{name}", opts.threads, opts.runs, opts.workers)
    finally:
        with psycopg.connect(f"{opts.server_url}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print(f"{opts.runs} runs over {opts.threads} threads, {opts.workers} workers: "
          f"{figures['runs_per_second']:,.0f} runs/s, CPU {figures['cpu_per_run'] * 1e6:,.0f} "
          f"µs per run, {figures['commits_per_run']:.2f} commits per run")
    if opts.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
