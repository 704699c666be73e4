"""One caller's run inserts and run index batches on PostgreSQL, source trees alternated.

Usage::

    .venv/bin/python bench/bench_pg_writes.py [ROOT ...] [--rounds 4] [--runs 3000]
        [--threads 100] [--server-url postgresql://postgres@127.0.0.1:5432] [--json]

The storage calls alone, no runtime around them: in a fresh database
(``te_bench_writes_<pid>_<hex>``, dropped at the end), each case registers ``threads``
threads, then one caller makes ``runs`` runs (`PostgresThreadStore.insert_run`, run i on
thread i mod T, each its own committed statement) and writes their run index entries in
batches of 100 (`PostgresRuntimeStore.index_runs`, what a node's index writer sends). Each
ROOT (a thread-effects checkout; default this one) is measured in a child process that
imports its ``runtime``, in a schema of its own, once per round, the roots alternated within
each round (the machine's load moves between minutes; alternation keeps the comparison
fair). It prints, per root, inserts/s and index rows/s: each round's figure, the range and
the median. bench/README.md says what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432"


def child(url: str, runs: int, threads: int) -> dict[str, float]:
    """Measure one case in this process (its ``runtime`` is the root's)."""
    from runtime.config import RetentionPolicy
    from runtime.effects import EffectRun, EffectStatus
    from runtime.storage.base import RunQuery, ThreadInfo
    from runtime.storage.postgres import PostgresBackend

    backend = PostgresBackend(url)
    rtdb = backend.open()
    stores = []
    for i in range(threads):
        info = ThreadInfo(id=f"t{i}", created_at_ts=1.0)
        assert rtdb.add_thread(info)
        stores.append(backend.create_thread_store(info))
    made = [EffectRun(id=f"r{i:07d}", thread_id=f"t{i % threads}", name="note",
                      status=EffectStatus.PENDING, args={"x": 1}, run_at_ts=1e10,
                      created_at_ts=2.0) for i in range(runs)]
    started = time.perf_counter()
    for i, run in enumerate(made):
        stores[i % threads].insert_run(run)
    inserts = runs / (time.perf_counter() - started)
    started = time.perf_counter()
    for k in range(0, runs, 100):
        rtdb.index_runs(made[k:k + 100])
    indexed = runs / (time.perf_counter() - started)
    listed = sum(rtdb.count_indexed_runs(RunQuery(), 3.0, RetentionPolicy()).values())
    for store in stores:
        store.close()
    rtdb.close()
    backend.close()
    return {"inserts_per_s": inserts, "index_rows_per_s": indexed, "indexed": listed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("roots", nargs="*", type=source_tree)
    parser.add_argument("--rounds", type=positive_int, default=4)
    parser.add_argument("--runs", type=positive_int, default=3000)
    parser.add_argument("--threads", type=positive_int, default=100)
    parser.add_argument("--server-url", default=DEFAULT_SERVER)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts.runs, opts.threads)))
        return
    import psycopg

    roots = [r.resolve() for r in opts.roots] or [Path(__file__).resolve().parent.parent]
    name = f"te_bench_writes_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(opts.server_url + "/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    figures: dict[str, list[dict[str, float]]] = {str(r): [] for r in roots}
    try:
        for n in range(opts.rounds):
            for k, root in enumerate(roots):
                url = f"{opts.server_url}/{name}?schema=w{n}_{k}"
                env = {**os.environ, "PYTHONPATH": str(root)}
                out = subprocess.run(
                    [sys.executable, __file__, "--child", url, "--runs", str(opts.runs),
                     "--threads", str(opts.threads)],
                    env=env, capture_output=True, text=True, check=True, cwd=root)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                if row["indexed"] != opts.runs:
                    raise SystemExit(f"{root}: {row['indexed']} of {opts.runs} runs indexed")
                figures[str(root)].append(row)
    finally:
        with psycopg.connect(opts.server_url + "/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print(f"{opts.runs:,} runs over {opts.threads} threads, one caller, {opts.rounds} rounds "
          f"(roots alternated in each); load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| root | figure | per round | range | median |")
    print("|---|---|---|---|--:|")
    for root, rows in figures.items():
        for key, label in (("inserts_per_s", "inserts/s"), ("index_rows_per_s", "index rows/s")):
            values = [r[key] for r in rows]
            print(f"| {root} | {label} | {' · '.join(f'{v:,.0f}' for v in values)} | "
                  f"{min(values):,.0f}-{max(values):,.0f} | {statistics.median(values):,.0f} |")
    if opts.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
