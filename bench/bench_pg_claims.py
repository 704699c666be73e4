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
runs/s, the process's CPU per run (`time.process_time`, every thread), the database
server's CPU per run (the user + system time of the server processes serving this
database, read from ``/proc`` when the server runs on this machine; ``-`` otherwise) and
the database's commits per run (`pg_stat_database`).

Then the same for a raw baseline on the same server, in the same run: the product's own
``effect_runs`` table (in a schema of its own, with the product's indexes), the same runs
and threads, the same number of worker threads each with its own psycopg connection, and
per run the two statements a run needs at the least: the claim (``UPDATE ... SET status =
'running' ... WHERE seq = (the thread's earliest due pending run)``, autocommitted) and the
finish (``UPDATE ... SET status = 'completed'``, autocommitted). The ratios say what the
product's claim path costs beyond that, on the client and on the server.
bench/README.md says what was measured.
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


def _server_pids(url: str) -> list[int]:
    """The server processes serving ``url``'s database now (other than this query's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                            "current_database() AND pid <> pg_backend_pid()").fetchall()
    return [int(r[0]) for r in rows]


def _cpu_of(pids: list[int]) -> float | None:
    """User + system seconds of these processes (``/proc``), None when not readable here."""
    total, seen = 0.0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        seen = True
    return total / os.sysconf("SC_CLK_TCK") if seen else None


class _ServerCpu:
    """The CPU the database's server processes use between `start` and `stop`.

    Its pool's connections are opened before `start` (they live through the measure), so
    the processes seen at both ends are the ones that served it.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._pids: list[int] = []
        self._at: float | None = None

    def start(self) -> None:
        self._pids = _server_pids(self._url)
        self._at = _cpu_of(self._pids)

    def stop(self) -> float | None:
        end = _cpu_of(self._pids)
        return None if end is None or self._at is None else end - self._at


def measure(url: str, threads: int, runs: int, workers: int) -> dict[str, float | None]:
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

        # Every pool connection open before the count starts.
        warm = [threading.Thread(target=lambda s=s: s.next_schedule_fire()) for s in stores]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        server = _ServerCpu(url)
        server.start()
        wall, cpu = time.perf_counter(), time.process_time()
        pool = [threading.Thread(target=work) for _ in range(workers)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server_cpu = server.stop()
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
            "server_cpu_per_run": None if server_cpu is None else server_cpu / runs,
            "commits_per_run": commits / runs}


RAW_CLAIM = (
    "UPDATE raw.effect_runs SET status = 'running', attempts = attempts + 1, started_at = %s "
    "WHERE thread_id = %s AND seq = (SELECT seq FROM raw.effect_runs WHERE thread_id = %s "
    "AND status = 'pending' AND run_at <= %s ORDER BY run_at, seq LIMIT 1) RETURNING id"
)
RAW_FINISH = ("UPDATE raw.effect_runs SET status = 'completed', finished_at = %s "
              "WHERE thread_id = %s AND id = %s AND status = 'running'")


def measure_raw(url: str, threads: int, runs: int, workers: int) -> dict[str, float | None]:
    """The least a run needs on the same table: a claim and a finish, each autocommitted."""
    from runtime.storage.pg_schema import MIGRATIONS

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute("SET search_path = raw")
        for ddl in MIGRATIONS[0]:  # the product's own tables and indexes
            conn.execute(ddl)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO effect_runs (thread_id, id, name, status, args, run_at, "
                "created_at, attempts) VALUES (%s, %s, 'noop', 'pending', '{}', %s, 1, 0)",
                [(f"bench-{i % threads}", f"r{i}", 2.0 + i * 1e-6) for i in range(runs)])
    conns = [psycopg.connect(url, autocommit=True) for _ in range(workers)]
    try:
        ready: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        for t in range(threads):
            ready.put(t)
        left = [threads]
        guard = threading.Lock()
        errors: list[BaseException] = []

        def work(conn: psycopg.Connection[tuple[object, ...]]) -> None:
            while (t := ready.get()) is not None:
                thread_id = f"bench-{t}"
                try:
                    row = conn.execute(RAW_CLAIM, (3.0, thread_id, thread_id, 3.0)).fetchone()
                    if row is not None:
                        conn.execute(RAW_FINISH, (3.0, thread_id, row[0]))
                except BaseException as exc:
                    errors.append(exc)
                    row = None
                if row is not None:
                    ready.put(t)
                    continue
                with guard:
                    left[0] -= 1
                    if left[0] == 0:
                        for _ in range(workers):
                            ready.put(None)

        server = _ServerCpu(url)
        server.start()
        wall, cpu = time.perf_counter(), time.process_time()
        pool = [threading.Thread(target=work, args=(c,)) for c in conns]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server_cpu = server.stop()
        if errors:
            raise errors[0]
    finally:
        for conn in conns:
            conn.close()
    return {"runs_per_second": runs / wall, "cpu_per_run": cpu / runs,
            "server_cpu_per_run": None if server_cpu is None else server_cpu / runs}


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.0f} µs"


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
        raw = measure_raw(f"{opts.server_url}/{name}", opts.threads, opts.runs, opts.workers)
    finally:
        with psycopg.connect(f"{opts.server_url}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print(f"{opts.runs} runs over {opts.threads} threads, {opts.workers} workers: "
          f"{figures['runs_per_second']:,.0f} runs/s, CPU {_us(figures['cpu_per_run'])} per "
          f"run, server CPU {_us(figures['server_cpu_per_run'])} per run, "
          f"{figures['commits_per_run']:.2f} commits per run")
    print(f"raw claim + finish, same table and workers: {raw['runs_per_second']:,.0f} runs/s, "
          f"CPU {_us(raw['cpu_per_run'])} per run, server CPU "
          f"{_us(raw['server_cpu_per_run'])} per run")
    if opts.json:
        print(json.dumps({**figures, "raw": raw}))


if __name__ == "__main__":
    main()
