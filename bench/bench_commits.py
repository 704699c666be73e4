"""Commits per second the disk gives to N OS threads, each on a thread file of its own.

    .venv/bin/python bench/bench_commits.py [SOURCE_ROOT] [--threads 1,4,16,32]
                                            [--runs 1600] [--synchronous FULL]

What caps the FULL cases of the peers' benchmark (issue 14, targets 2 and 4) once the
Python around the SQL is left out: for each thread count T, T OS threads each write to a
file of their own, ``--runs`` writes in all, and the line printed gives writes per
second, process CPU µs per write (user and system) and KiB handed to ``write(2)`` per
write (the WAL, and the checkpoints that ran meanwhile) for

- ``floor``: the SQLite floor's statement (one ``INSERT`` + ``COMMIT`` of a two-column row
  into a table with one partial index, `peer_sqlite_floor.py`'s schema);
- ``insert``: the product's `SQLiteThreadStore.insert_run` (a pending run, no key);
- ``drain``: the product's `SQLiteThreadStore.finish_and_claim` on a thread whose runs are
  all due (the finish of one run and the claim of the next in one commit: a burst).

SOURCE_ROOT (default this repository) is the tree whose ``runtime`` is measured, so two
trees can be run alternately. The storage pool of the runtime has 16 OS threads
(``runtime.supervisor._STORAGE_THREADS``); the peers' benchmark has 100 thread files.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

_parser = argparse.ArgumentParser(description="commits per second across thread files")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
_parser.add_argument("--threads", default="1,4,16,32",
                     help="comma-separated OS thread counts (one file each)")
_parser.add_argument("--runs", type=positive_int, default=1600)
_parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
OPTS = _parser.parse_args()
sys.path.insert(0, str(OPTS.root.resolve()))

from runtime.effects import EffectRun, EffectStatus  # noqa: E402
from runtime.ids import new_id  # noqa: E402
from runtime.storage.base import Finish  # noqa: E402
from runtime.storage.sqlite import SQLiteThreadStore, _Checkpointer  # noqa: E402

_FLOOR_SCHEMA = ("CREATE TABLE alarms(id INTEGER PRIMARY KEY, thread INTEGER NOT NULL, "
                 "due REAL NOT NULL, fn TEXT NOT NULL, args TEXT NOT NULL, done_at REAL)")


def _parallel(workers: list[Callable[[], None]], data: Path, count: int) -> dict[str, float]:
    def wal_bytes() -> int:  # bytes handed to write(2) by this process (WAL, checkpoints)
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))

    threads = [threading.Thread(target=w) for w in workers]
    before, times, wall = wal_bytes(), os.times(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, after = time.perf_counter() - wall, os.times()
    return {
        "per_second": round(count / wall),
        "user_us": round((after.user - times.user) / count * 1e6),
        "system_us": round((after.system - times.system) / count * 1e6),
        "written_kib": round((wal_bytes() - before) / count / 1024, 1),
    }


def floor(count: int, data: Path) -> dict[str, float]:
    """The floor's INSERT + COMMIT, ``runs`` in all over ``count`` files."""
    per = OPTS.runs // count
    conns = []
    for k in range(count):
        conn = sqlite3.connect(data / f"f{k}.sqlite", isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={OPTS.synchronous}")
        conn.execute(_FLOOR_SCHEMA)
        conn.execute("CREATE INDEX alarms_pending ON alarms(due) WHERE done_at IS NULL")
        conns.append(conn)

    def work(conn: sqlite3.Connection) -> Callable[[], None]:
        def run() -> None:
            for i in range(per):
                conn.execute("BEGIN")
                conn.execute("INSERT INTO alarms(thread, due, fn, args) VALUES (?,?,?,?)",
                             (0, time.time(), "noop", f"[{i}]"))
                conn.execute("COMMIT")
        return run

    try:
        return _parallel([work(c) for c in conns], data, per * count)
    finally:
        for conn in conns:
            conn.close()


def product(count: int, data: Path) -> tuple[dict[str, float], dict[str, float]]:
    """``insert_run`` then ``finish_and_claim`` until drained, over ``count`` files."""
    per = OPTS.runs // count
    checkpointer = _Checkpointer()
    stores = [SQLiteThreadStore(f"t{k}", data / f"t{k}.sqlite", OPTS.synchronous, create=True,
                                checkpointer=checkpointer) for k in range(count)]
    now = time.time()

    def insert(store: SQLiteThreadStore) -> Callable[[], None]:
        def run() -> None:
            for i in range(per):
                store.insert_run(EffectRun(
                    id=new_id(), thread_id=store.thread_id, name="noop",
                    status=EffectStatus.PENDING, args={"i": i}, run_at_ts=now,
                    created_at_ts=now))
        return run

    def drain(store: SQLiteThreadStore) -> Callable[[], None]:
        def run() -> None:
            finish = None
            while True:
                _, claimed, _ = store.finish_and_claim(finish, time.time())
                if claimed is None:
                    return
                finish = Finish(claimed.id, EffectStatus.COMPLETED, None, time.time(),
                                attempt=claimed.attempts)
        return run

    try:
        inserted = _parallel([insert(s) for s in stores], data, per * count)
        drained = _parallel([drain(s) for s in stores], data, per * count)
    finally:
        for store in stores:
            store.close()
        checkpointer.close()
    return inserted, drained


def main() -> None:
    """Print one JSON line per thread count."""
    for count in (int(x) for x in OPTS.threads.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "floor").mkdir()
            (Path(tmp) / "product").mkdir()
            line = {"threads": count, "synchronous": OPTS.synchronous,
                    "floor": floor(count, Path(tmp) / "floor")}
            line["insert"], line["drain"] = product(count, Path(tmp) / "product")
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
