"""Where the PostgreSQL server's time goes per executed run: `pg_stat_statements`.

Usage::

    .venv/bin/python bench/bench_pg_statements.py [--runs 4000] [--threads 100]
        [--server-url postgresql://postgres@127.0.0.1:55433] [--private] [--top 15] [--json]
        [--phase execute|schedule]

Issue 13's lag target needs one process to execute 2,000 runs/s with the server on the same
machine, so the server's work per run counts as much as the client's. This runs the
product in this process on a fresh database (``te_bench_stmts_<pid>_<hex>``, dropped at
the end): ``--threads`` threads, ``--runs`` runs of the no-op effect (`bench/app`) all due
a moment after the last is scheduled; the statistics are reset once scheduling ended,
so they cover the execution alone. ``--phase schedule`` measures the scheduling instead:
one caller schedules the runs (due in an hour) one after another, each committed before
the next, the statistics reset just before. It prints the runs/s, the client's CPU per run
(`time.process_time`, every thread), the CPU of the server processes serving the
database (``/proc``) per run, and the statements by total execution time: calls per run,
µs per call, execution µs per run and WAL bytes per run (a statement's time includes its
waits for row locks; ``COMMIT``'s, the WAL flush).

It needs a server with ``pg_stat_statements`` loaded (``shared_preload_libraries``), which
the default test server is not. ``--private`` makes one under
``/tmp/te_bench_pgss`` on port 55433 (``initdb``, then ``pg_ctl start`` with the library,
as ``postgres`` when run as root; left running for the next call: stop it with
``pg_ctl -D /tmp/te_bench_pgss/data stop``). About 20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _args import positive_int  # bench/_args.py: bench/ is on the path
from bench_pg_claims import _cpu_of, _server_pids  # the same reading of /proc

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

APP_DIR = ROOT / "bench" / "app"
PRIVATE_ROOT = Path("/tmp/te_bench_pgss")
PRIVATE_PORT = 55433


def start_private_server() -> str:
    """Start (or find running) a server with ``pg_stat_statements`` loaded; its URL.

    Raises:
        SystemExit: PostgreSQL's programs are not installed, or the server did not start.
    """
    url = f"postgresql://postgres@127.0.0.1:{PRIVATE_PORT}"
    try:
        with psycopg.connect(f"{url}/postgres", connect_timeout=2):
            return url
    except psycopg.OperationalError:
        pass
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not bins:
        raise SystemExit("PostgreSQL's programs are not in /usr/lib/postgresql/*/bin")
    pgbin = bins[-1]
    data = PRIVATE_ROOT / "data"
    PRIVATE_ROOT.mkdir(parents=True, exist_ok=True)
    as_root = os.geteuid() == 0
    if as_root:
        shutil.chown(PRIVATE_ROOT, "postgres", "postgres")

    def run(cmd: str) -> None:
        argv = ["su", "postgres", "-s", "/bin/bash", "-c", cmd] if as_root else ["bash", "-c", cmd]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{cmd!r} failed: {done.stderr[-2000:]}")

    if not (data / "PG_VERSION").exists():
        run(f"{pgbin}/initdb -D {data} -A trust -U postgres")
    run(f"{pgbin}/pg_ctl -D {data} -l {PRIVATE_ROOT}/server.log -w -o '-c "
        f"listen_addresses=127.0.0.1 -p {PRIVATE_PORT} -c unix_socket_directories={PRIVATE_ROOT} "
        f"-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
        f"-c pg_stat_statements.track_planning=on "
        f"-c max_connections=200' start")
    return url


def _server_cpu(url: str) -> float:
    """User + system seconds of the server processes serving ``url``'s database now."""
    return _cpu_of(_server_pids(url)) or 0.0


async def measure(url: str, runs: int, threads: int, top: int,
                  phase: str = "execute") -> dict[str, Any]:
    from runtime import Runtime

    with tempfile.TemporaryDirectory(prefix="te-bench-stmts-") as data:
        rt = Runtime(app_dir=APP_DIR, data_dir=data, database_url=url, freeze_gc=True)
        await rt.start()
        try:
            lags: list[float] = rt.registry.resolve("noop").fn.__globals__["LAGS"]
            states = [await rt.create_thread(f"bench-{t}") for t in range(threads)]
            due = time.time() + 3600.0
            if phase == "schedule":
                # One caller, one run after another, each committed before the next.
                await asyncio.to_thread(_reset, url)
                server0, cpu0, wall0 = await asyncio.to_thread(_server_cpu, url), \
                    time.process_time(), time.perf_counter()
            for i in range(runs):
                await states[i % threads].schedule_effect("noop", {"due": due}, delay=3600)
            if phase == "schedule":
                wall = time.perf_counter() - wall0
            await rt.wait_idle(60)  # the schedules' frames and index batches are written
            if phase == "schedule":
                cpu = time.process_time() - cpu0
                server = await asyncio.to_thread(_server_cpu, url) - server0
                return _figures(url, runs, threads, top, wall, cpu, server)
            # Make every run due now, in one statement, then wake the threads.
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("UPDATE effect_runs SET run_at = %s WHERE status = 'pending'",
                             (time.time(),))
                conn.execute("UPDATE alarms SET due_at = %s", (time.time(),))
                conn.execute("SELECT pg_stat_statements_reset()")
            server0, cpu0, wall0 = await asyncio.to_thread(_server_cpu, url), \
                time.process_time(), time.perf_counter()
            for t in range(threads):
                rt.dispatcher.wake(f"bench-{t}")
            while len(lags) < runs:
                await asyncio.sleep(0.01)
                if time.perf_counter() - wall0 > 120:
                    raise SystemExit(f"only {len(lags)} of {runs} runs ran in 120 s")
            await rt.wait_idle(60)
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
            server = await asyncio.to_thread(_server_cpu, url) - server0
        finally:
            await rt.close()
    return _figures(url, runs, threads, top, wall, cpu, server)


def _reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _figures(url: str, runs: int, threads: int, top: int, wall: float, cpu: float,
             server: float) -> dict[str, Any]:
    """The figures of a measured phase, from ``pg_stat_statements`` and the clocks."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time, "
            "wal_bytes, total_plan_time FROM pg_stat_statements WHERE dbid = (SELECT oid "
            "FROM pg_database WHERE datname = current_database()) "
            "AND query NOT LIKE '%%pg_stat_statements%%' "
            "ORDER BY total_exec_time DESC").fetchall()
    total_ms = sum(float(r[2]) for r in rows)
    return {
        "runs": runs, "threads": threads, "runs_per_second": runs / wall,
        "client_cpu_us_per_run": cpu / runs * 1e6,
        "server_cpu_us_per_run": server / runs * 1e6,
        "statement_us_per_run": total_ms * 1e3 / runs,
        "planning_us_per_run": sum(float(r[4] or 0) for r in rows) * 1e3 / runs,
        "statements": [
            {"query": r[0][:100], "calls_per_run": r[1] / runs,
             "us_per_call": float(r[2]) * 1e3 / r[1] if r[1] else 0.0,
             "us_per_run": float(r[2]) * 1e3 / runs,
             "wal_bytes_per_run": float(r[3] or 0) / runs,
             "plan_us_per_run": float(r[4] or 0) * 1e3 / runs}
            for r in rows[:top]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=4000)
    parser.add_argument("--threads", type=positive_int, default=100)
    parser.add_argument("--server-url", default=f"postgresql://postgres@127.0.0.1:{PRIVATE_PORT}")
    parser.add_argument("--private", action="store_true",
                        help="start a private server with pg_stat_statements if none answers")
    parser.add_argument("--top", type=positive_int, default=15)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--phase", choices=("execute", "schedule"), default="execute",
                        help="measure the runs' execution (all due at once), or their "
                             "scheduling by one caller (due in an hour)")
    opts = parser.parse_args()
    server = start_private_server() if opts.private else opts.server_url.rstrip("/")
    name = f"te_bench_stmts_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(f"{server}/{name}", autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        figures = asyncio.run(measure(f"{server}/{name}", opts.runs, opts.threads, opts.top,
                                       opts.phase))
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    what = "all due at once" if opts.phase == "execute" else "scheduled by one caller"
    print(f"{opts.runs:,} runs over {opts.threads} threads, {what}: "
          f"{figures['runs_per_second']:,.0f} runs/s; per run: client CPU "
          f"{figures['client_cpu_us_per_run']:,.0f} µs, server CPU "
          f"{figures['server_cpu_us_per_run']:,.0f} µs, statements' execution "
          f"{figures['statement_us_per_run']:,.0f} µs, their planning "
          f"{figures['planning_us_per_run']:,.0f} µs")
    print("| statement | calls/run | µs/call | µs/run | planning µs/run | WAL bytes/run |")
    print("|---|--:|--:|--:|--:|--:|")
    for s in figures["statements"]:
        query = s["query"].replace("|", "\\|")
        print(f"| `{query}` | {s['calls_per_run']:.2f} | {s['us_per_call']:,.0f} | "
              f"{s['us_per_run']:,.0f} | {s['plan_us_per_run']:,.0f} | "
              f"{s['wal_bytes_per_run']:,.0f} |")
    if opts.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
