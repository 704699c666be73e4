"""The executing phase of issue 13's workload, alone, in this process: CPU per executed run.

Usage::

    .venv/bin/python bench/bench_pg_exec.py [SOURCE_ROOT] [--runs 4000] [--threads 100]
        [--spread 2] [--schedule-rate 150] [--server-url postgresql://postgres@127.0.0.1:5432]
        [--count] [--spy OUT] [--json]

A `Runtime` of SOURCE_ROOT (default: this tree; give a clean copy of another commit to
compare, alternating) on a fresh database (``te_bench_exec_<pid>_<hex>``, dropped at the
end): ``--runs`` runs of the no-op effect (`bench/app`) over ``--threads`` threads, run i
on thread i mod T, due evenly over ``--spread`` seconds in a fixed shuffled order, the
first due ``runs / schedule-rate + 2`` seconds after scheduling began (so scheduling is
over before the first run comes due; a warning says when it was not). From 0.2 s before
the first due time until every run ran and the runtime is idle it measures the process's
CPU (`time.process_time`, every thread) per run, the executed rate (runs / that wall
time) and the lag due→start p50 / p99 / max (the effect's own clock). ``--spread 2`` with
4,000 runs is issue 13's rate (2,000 due runs/s); ``--spread 5`` with 2,000 runs is one a
single process keeps up with here, where each drain finds about one due run.

``--count`` also prints the statements per run by their first 60 characters (psycopg's
``Cursor.execute`` and the backend's libpq commands wrapped; a ``BEGIN`` sent with a row
lock in one string counts as one). ``--spy OUT`` records the executing phase with py-spy
(``-f raw --threads``, ``--gil`` when ``SPY_GIL=1``; the rate from ``SPY_RATE``, 200).
Figures with py-spy attached are slower: read its shares, not its rates.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _args import positive_int  # bench/_args.py: bench/ is on the path

HERE = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = os.environ.get("THREAD_EFFECTS_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def _counting() -> collections.Counter[str]:
    """Count the statements the backend sends from now on (see the module doc)."""
    import psycopg.cursor

    import runtime.storage.postgres as pg

    counts: collections.Counter[str] = collections.Counter()
    execute = psycopg.cursor.Cursor.execute

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counts[str(query)[:60]] += 1
        return execute(self, query, *args, **kwargs)

    psycopg.cursor.Cursor.execute = counted_execute  # type: ignore[method-assign]
    for name in ("_command", "_command_rows"):
        command = getattr(pg, name, None)
        if command is None:
            continue

        def counted(conn: Any, text: bytes, _command: Any = command) -> Any:
            counts[text.decode()[:60]] += 1
            return _command(conn, text)

        setattr(pg, name, counted)
    return counts


def _spy(out: str) -> subprocess.Popen[bytes]:
    """py-spy recording this process into ``out`` (see the module doc)."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "-r",
         os.environ.get("SPY_RATE", "200"), "-f", "raw", "--threads",
         *(["--gil"] if os.environ.get("SPY_GIL") else []),
         "-p", str(os.getpid()), "-o", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measure(root: Path, url: str, opts: argparse.Namespace) -> dict[str, Any]:
    from runtime import Runtime

    with tempfile.TemporaryDirectory(prefix="te-bench-exec-") as data:
        rt = Runtime(app_dir=root / "bench" / "app", data_dir=data, database_url=url,
                     freeze_gc=True)
        await rt.start()
        try:
            lags: list[float] = rt.registry.resolve("noop").fn.__globals__["LAGS"]
            states = [await rt.create_thread(f"bench-{t}") for t in range(opts.threads)]
            base = time.time() + opts.runs / opts.schedule_rate + 2.0
            dues = [base + opts.spread * i / opts.runs for i in range(opts.runs)]
            random.Random(1).shuffle(dues)
            for i, due in enumerate(dues):
                await states[i % opts.threads].schedule_effect(
                    "noop", {"due": due}, delay=max(0.0, due - time.time()))
            late = time.time() - (base - 0.5)
            if late > 0:
                print(f"warning: scheduling ended {late:.1f} s too late (lower "
                      f"--schedule-rate)", file=sys.stderr)
            await asyncio.sleep(max(0.0, base - 0.2 - time.time()))
            spy = _spy(opts.spy) if opts.spy else None
            if spy is not None:
                await asyncio.sleep(0.1)
            counts = _counting() if opts.count else collections.Counter()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(12_000):  # at most 120 s
                if len(lags) >= opts.runs:
                    break
                await asyncio.sleep(0.01)
            await rt.wait_idle(30)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            if spy is not None:
                spy.send_signal(2)
                spy.wait()
        finally:
            await rt.close()
    ordered = sorted(lags)
    n = len(ordered)
    return {
        "runs": opts.runs, "executed": n, "cpu_us_per_run": cpu / opts.runs * 1e6,
        "runs_per_second": n / wall,
        "lag_p50_ms": statistics.median(ordered) * 1e3 if n else None,
        "lag_p99_ms": ordered[min(n - 1, int(n * 0.99))] * 1e3 if n else None,
        "lag_max_ms": ordered[-1] * 1e3 if n else None,
        "late_scheduling_s": max(0.0, late),
        "statements_per_run": {k: v / opts.runs for k, v in counts.most_common(25)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=HERE)
    parser.add_argument("--runs", type=positive_int, default=4000)
    parser.add_argument("--threads", type=positive_int, default=100)
    parser.add_argument("--spread", type=float, default=2.0)
    parser.add_argument("--schedule-rate", type=float, default=150.0)
    parser.add_argument("--server-url", default=DEFAULT_SERVER)
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--spy", default=None)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    root = opts.root.resolve()
    sys.path.insert(0, str(root))
    import psycopg

    server = opts.server_url.rstrip("/")
    name = f"te_bench_exec_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        figures = asyncio.run(measure(root, f"{server}/{name}", opts))
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    lag = "-" if not figures["executed"] else (
        f"{figures['lag_p50_ms']:,.1f} / {figures['lag_p99_ms']:,.1f} / "
        f"{figures['lag_max_ms']:,.1f} ms")
    print(f"{root}: {figures['executed']:,} of {opts.runs:,} runs over {opts.threads} threads "
          f"due over {opts.spread:g} s: {figures['runs_per_second']:,.0f} runs/s, CPU "
          f"{figures['cpu_us_per_run']:,.0f} µs per run, lag p50 / p99 / max {lag}")
    for query, per_run in figures["statements_per_run"].items():
        print(f"  {per_run:6.3f} per run  {query}")
    if opts.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
