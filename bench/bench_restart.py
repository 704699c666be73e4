"""How long a restart takes to re-arm every thread's alarm, and at what memory.

docs/design.md ("Performance targets"): 100k threads with 1M pending runs re-armed after a
restart in <= 2 s at <= 300 MiB. At startup the runtime reads the alarm rows of
``runtime.sqlite`` (one per thread with pending work) and arms one in-process timer job per
thread; thread files are not opened until a thread's alarm is due, so this benchmark writes
the registry and the alarm rows directly (all due in a day) and does not build the thread
files. The baseline is a raw ``SELECT`` of the same rows in the same process.

Run: ``.venv/bin/python bench/bench_restart.py [--threads 100000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from _args import positive_int  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime import Runtime  # noqa: E402
from runtime.storage.schema import RUNTIME_MIGRATIONS  # noqa: E402


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def build(data_dir: Path, threads: int) -> None:
    """A data directory whose runtime.sqlite registers ``threads`` threads with alarms."""
    (data_dir / "threads").mkdir(parents=True)
    conn = sqlite3.connect(data_dir / "runtime.sqlite", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for version in sorted(RUNTIME_MIGRATIONS):
        for statement in RUNTIME_MIGRATIONS[version]:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version={max(RUNTIME_MIGRATIONS) + 1}")
    now = time.time()
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO threads (id, created_at, agent_id, user_id, tags) "
        "VALUES (?, ?, NULL, NULL, ?)",
        ((f"t{i:06d}", now, json.dumps([])) for i in range(threads)),
    )
    conn.executemany(
        "INSERT INTO alarms (thread_id, due_at) VALUES (?, ?)",
        ((f"t{i:06d}", now + 86_400 + i * 0.01) for i in range(threads)),
    )
    conn.execute("COMMIT")
    conn.close()


async def restart(data_dir: Path) -> tuple[float, float]:
    start = time.perf_counter()
    rt = Runtime(data_dir=data_dir, load_packages=False)
    await rt.start()
    elapsed = time.perf_counter() - start
    rss = _rss_mib()
    await rt.close()
    return elapsed, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=positive_int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT / "bench") as tmp:
        data_dir = Path(tmp) / "data"
        build(data_dir, args.threads)
        start = time.perf_counter()
        conn = sqlite3.connect(data_dir / "runtime.sqlite")
        rows = conn.execute("SELECT thread_id, due_at FROM alarms").fetchall()
        conn.close()
        raw = time.perf_counter() - start
        before = _rss_mib()
        elapsed, rss = asyncio.run(restart(data_dir))
    print(f"restart with {args.threads:,} threads with alarms ({len(rows):,} rows)")
    print("| figure | thread-effects | raw SELECT of the rows | target | result |")
    print("|---|--:|--:|---|---|")
    print(f"| start() until every alarm is armed | {elapsed:.2f} s | {raw:.2f} s | <= 2 s | "
          f"{'PASS' if elapsed <= 2 else 'MISS'} |")
    print(f"| RSS after start (process) | {rss:.0f} MiB | {before:.0f} MiB before start | "
          f"<= 300 MiB | {'PASS' if rss <= 300 else 'MISS'} |")


if __name__ == "__main__":
    main()
