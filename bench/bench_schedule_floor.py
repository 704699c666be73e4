"""One caller scheduling one run after another: the floor, an asyncio floor, and the product.

    .venv/bin/python bench/bench_schedule_floor.py [SOURCE_ROOT] [--threads 100]
                                                   [--chunk 500] [--rounds 6]
                                                   [--synchronous FULL] [--json]

Issue 14's target 1 asks a caller that schedules runs one after another (each call returns
once its run is committed, `synchronous=FULL`, one file per thread) for at least 0.8 of the
rate of ``../shared/peers_bench``'s floor: a plain loop doing ``INSERT`` + ``COMMIT`` into
one of ``--threads`` SQLite files. This prints, alternated in chunks of ``--chunk`` calls over
``--rounds`` rounds (the disk and the load move between minutes; alternation keeps the
comparison fair), the rate of four ways to make one durable row per call, from one caller:

- ``floor``: the floor's own loop (``sqlite3`` on this thread: ``INSERT``, ``COMMIT``);
- ``asyncio-inline``: the same statement and commit called from an ``async`` caller on the
  event loop (the loop is blocked for each fsync);
- ``asyncio-hop``: the same from an ``async`` caller through ``loop.run_in_executor`` to one
  worker thread and back (the fsync off the loop: the least any asyncio server that keeps
  disk waits off its loop pays);
- ``product``: ``ThreadState.schedule_effect`` of a no-op effect (``bench/app``) due in an
  hour, on a started `runtime.Runtime` with the same number of threads.

Each rate is calls / wall seconds of its chunks; the ratio to ``floor`` is the figure target
1 reads. Also printed: process CPU µs per call (``time.process_time``, all threads). About
1 to 2 minutes with the defaults.

With ``--postgres SERVER_URL`` (e.g. ``postgresql://postgres@127.0.0.1:5432``) the same is
measured for issue 13 on a fresh database made on that server (dropped at the end): the
floor is one psycopg connection's autocommitted ``INSERT`` into the product's own
``effect_runs`` table (one round trip, one commit: `bench_postgres.py`'s raw baseline),
``asyncio-async`` adds psycopg's ``AsyncConnection`` awaited on the loop, and ``product``
is a `runtime.Runtime` with ``database_url`` on that database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

_parser = argparse.ArgumentParser(description="one caller's schedule rate against the floor")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
_parser.add_argument("--threads", type=positive_int, default=100)
_parser.add_argument("--chunk", type=positive_int, default=500)
_parser.add_argument("--rounds", type=positive_int, default=6)
_parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
_parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
_parser.add_argument("--postgres", metavar="SERVER_URL", default=None,
                     help="measure against a fresh database on this PostgreSQL server")
OPTS = _parser.parse_args()
ROOT = OPTS.root.resolve()
sys.path.insert(0, str(ROOT))

from runtime import Runtime  # noqa: E402

SCHEMA = ("CREATE TABLE IF NOT EXISTS alarms(id INTEGER PRIMARY KEY, thread INTEGER NOT NULL, "
          "due REAL NOT NULL, fn TEXT NOT NULL, args TEXT NOT NULL, done_at REAL)")
WAYS: tuple[str, ...] = ("floor", "asyncio-inline", "asyncio-hop", "product")
if OPTS.postgres:
    WAYS = ("floor", "asyncio-inline", "asyncio-hop", "asyncio-async", "product")
PG_INSERT = ("INSERT INTO raw.effect_runs (thread_id, id, name, status, args, run_at, "
             "created_at, attempts) VALUES (%s, %s, 'noop', 'pending', %s, %s, %s, 0)")


def _floor_files(folder: Path) -> list[sqlite3.Connection]:
    conns = []
    for k in range(OPTS.threads):
        c = sqlite3.connect(folder / f"t{k}.sqlite", check_same_thread=False)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute(f"PRAGMA synchronous={OPTS.synchronous}")
        c.execute(SCHEMA)
        c.commit()
        conns.append(c)
    return conns


def _insert(conns: list[sqlite3.Connection], i: int) -> None:
    th = i % len(conns)
    c = conns[th]
    c.execute("INSERT INTO alarms(id, thread, due, fn, args) VALUES (?,?,?,?,?)",
              (i, th, time.time() + 3600, "noop", f"[{i}]"))
    c.commit()


def _pg_args(i: int) -> tuple[Any, ...]:
    now = time.time()
    return (f"t{i % OPTS.threads}", f"r{i}", json.dumps({"due": now + 3600}), now + 3600, now)


APP_DIR = Path(__file__).resolve().parent / "app"


async def main(database_url: str | None) -> dict[str, Any]:
    rates: dict[str, list[float]] = {w: [] for w in WAYS}
    cpu: dict[str, list[float]] = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="bench-schedule-floor-") as tmp:
        pool = ThreadPoolExecutor(1)
        loop = asyncio.get_running_loop()
        conns: list[sqlite3.Connection] = []
        pg: Any = None
        apg: Any = None
        if database_url is None:
            conns = _floor_files(Path(tmp))
            insert: Any = _insert
            target: Any = conns
        else:
            import psycopg

            from runtime.storage.pg_schema import MIGRATIONS

            pg = psycopg.connect(database_url, autocommit=True)
            pg.execute("CREATE SCHEMA raw")
            pg.execute("SET search_path = raw")
            for ddl in MIGRATIONS[0]:  # the product's own tables and indexes
                pg.execute(ddl)
            apg = await psycopg.AsyncConnection.connect(database_url, autocommit=True)

            def insert(c: Any, i: int) -> None:
                c.execute(PG_INSERT, _pg_args(i))
            target = pg
        rt = Runtime(app_dir=APP_DIR, data_dir=Path(tmp) / "data", synchronous=OPTS.synchronous,
                     database_url=database_url)
        await rt.start()
        try:
            states = [await rt.create_thread(f"t{k}") for k in range(OPTS.threads)]
            n = 0
            for _ in range(OPTS.rounds):
                for way in WAYS:
                    t0, c0 = time.perf_counter(), time.process_time()
                    if way == "floor":
                        for _ in range(OPTS.chunk):
                            insert(target, n)
                            n += 1
                    elif way == "asyncio-inline":
                        for _ in range(OPTS.chunk):
                            insert(target, n)
                            n += 1
                            await asyncio.sleep(0)
                    elif way == "asyncio-hop":
                        for _ in range(OPTS.chunk):
                            await loop.run_in_executor(pool, insert, target, n)
                            n += 1
                    elif way == "asyncio-async":
                        for _ in range(OPTS.chunk):
                            await apg.execute(PG_INSERT, _pg_args(n))
                            n += 1
                    else:
                        for _ in range(OPTS.chunk):
                            await states[n % OPTS.threads].schedule_effect(
                                "noop", {"due": time.time() + 3600}, delay=3600)
                            n += 1
                    wall, used = time.perf_counter() - t0, time.process_time() - c0
                    rates[way].append(OPTS.chunk / wall)
                    cpu[way].append(used / OPTS.chunk * 1e6)
        finally:
            await rt.close()
            pool.shutdown()
            for c in conns:
                c.close()
            if pg is not None:
                pg.close()
                await apg.close()
    ratios = {w: [r / f for r, f in zip(rates[w], rates["floor"], strict=True)] for w in WAYS}
    total = {w: OPTS.chunk * OPTS.rounds / sum(OPTS.chunk / r for r in rates[w]) for w in WAYS}
    return {
        "backend": "postgres" if database_url else "sqlite",
        "synchronous": OPTS.synchronous, "threads": OPTS.threads, "chunk": OPTS.chunk,
        "rounds": OPTS.rounds, "load_average": os.getloadavg()[0],
        "ways": {
            w: {"rate": round(total[w]), "ratio": round(total[w] / total["floor"], 3),
                "ratio_range": [round(min(ratios[w]), 3), round(max(ratios[w]), 3)],
                "cpu_us_per_call": round(statistics.median(cpu[w]))}
            for w in WAYS
        },
    }


def _run() -> dict[str, Any]:
    if not OPTS.postgres:
        return asyncio.run(main(None))
    import secrets

    import psycopg

    server = OPTS.postgres.rstrip("/")
    name = f"te_bench_sf_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        return asyncio.run(main(f"{server}/{name}"))
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    result = _run()
    if OPTS.json:
        print(json.dumps(result))
    else:
        where = ("one PostgreSQL database" if result["backend"] == "postgres"
                 else f"synchronous={result['synchronous']}")
        print(f"{where}, {result['threads']} threads, "
              f"{result['rounds']} rounds of {result['chunk']} calls per way, load average "
              f"{result['load_average']:.1f}")
        print("| way | calls/s | / floor (range over rounds) | CPU µs per call (median) |")
        print("|---|--:|--:|--:|")
        for way, f in result["ways"].items():
            lo, hi = f["ratio_range"]
            print(f"| {way} | {f['rate']:,} | {f['ratio']:.2f} ({lo:.2f}..{hi:.2f}) | "
                  f"{f['cpu_us_per_call']} |")
