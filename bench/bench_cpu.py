"""CPU time per run of the runtime in a source tree: an A/B check of two trees on a busy machine.

    .venv/bin/python bench/bench_cpu.py [SOURCE_ROOT] [--threads 50] [--runs 5000]
                                         [--synchronous NORMAL] [--no-floor]

SOURCE_ROOT defaults to this repository. Schedules the runs (no-op effect) across the
threads, due in an hour (``sched``), then schedules as many due now and waits until all
ran (``exec``, both steps), and prints one JSON line: process CPU time and wall time per
run in µs (the execute phase's also split into user and system time), and the scheduling
rate. ``synchronous=NORMAL`` by default, so fsync does not
dominate; ``gc.freeze()`` is called after start in either tree (the server's setting).
Process CPU time (every thread of the process, the storage pool included) moves far less
with other processes' load than wall time does, so running two trees alternately a few
times (e.g. a checkout of an older commit and this one) compares their per-run cost when
`bench_effects.py`'s wall-clock figures are swamped by the machine's load.

The floor (unless ``--no-floor``): in the same process, after the runtime, the same rows
through plain ``sqlite3`` and nothing else: as many thread files (the tree's
`runtime.storage.schema.THREAD_DDL`, its page size, WAL, the same ``synchronous``, a WAL
checkpointed at the runtime's size), the same statements the SQLite backend runs. Per run
``floor_sched_cpu_us`` is an insert and its commit (a run due in an hour), and
``floor_exec_cpu_us`` an insert, a claim (the run ``running``, its attempt row) and a finish
(the run ``completed``, its attempt ended), each in its own ``BEGIN IMMEDIATE`` … ``COMMIT``:
three commits, where the runtime makes two; ``floor_exec_grouped_cpu_us`` the same rows in
the runtime's two (a run's finish commits with the claim of its thread's next run). Ids
and args are made before the clock starts. ``exec_over_floor`` is ``exec_cpu_us /
floor_exec_cpu_us`` (``exec_over_floor_grouped`` over the grouped floor). The run index
(``runtime.sqlite``) is not in the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

_parser = argparse.ArgumentParser(description="CPU time per run of a source tree")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
_parser.add_argument("--threads", type=positive_int, default=50)
_parser.add_argument("--runs", type=positive_int, default=5000)
_parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="NORMAL")
_parser.add_argument("--no-floor", action="store_true",
                     help="skip the same rows through plain sqlite3")
OPTS = _parser.parse_args()
ROOT = OPTS.root.resolve()
sys.path.insert(0, str(ROOT))

from runtime import Runtime, ThreadState  # noqa: E402
from runtime.ids import new_id  # noqa: E402
from runtime.storage import sqlite as _backend  # noqa: E402
from runtime.storage.schema import THREAD_DDL  # noqa: E402

THREADS = OPTS.threads
RUNS = OPTS.runs // THREADS * THREADS


async def _schedule(thread: ThreadState, count: int, due: float, delay: float) -> None:
    for _ in range(count):
        await thread.schedule_effect("noop", {"due": due}, delay=delay)


# The statements of runtime.storage.sqlite (thread schema 10) for an insert, a claim and a
# finish, written out: the floor of a tree measures the same SQL whatever that tree's code.
_COLUMNS = (
    "seq, id, name, status, args, run_at, created_at, started_at, finished_at, "
    "attempts, error, replay_of, \"key\", canceled_by, schedule_id"
)
_INSERT = (
    "INSERT INTO effect_runs (id, name, status, args, run_at, created_at, "
    "attempts, replay_of, \"key\", schedule_id) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)"
)
_CLAIM = (
    "UPDATE effect_runs SET status = 'running', attempts = attempts + 1, "
    "started_at = ? WHERE seq = (SELECT seq FROM effect_runs "
    "WHERE status = 'pending' AND run_at <= ? ORDER BY run_at, seq LIMIT 1) "
    f"RETURNING {_COLUMNS}"
)
_ATTEMPT = (
    "INSERT OR REPLACE INTO run_attempts (run_id, attempt, started_at, "
    "outcome, node_id) VALUES (?, ?, ?, 'running', ?)"
)
_FINISH = (
    "UPDATE effect_runs SET status = ?, error = ?, finished_at = ?, "
    "canceled_by = ? WHERE id = ? AND status = 'running' "
    f"AND attempts = coalesce(?, attempts) RETURNING {_COLUMNS}"
)
_END_ATTEMPT = (
    "UPDATE run_attempts SET ended_at = ?, outcome = ?, error = ? "
    "WHERE run_id = ? AND attempt = ?"
)


def _floor_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size={getattr(_backend, 'PAGE_SIZE_BYTES', 4096)}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={OPTS.synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    # The runtime checkpoints a WAL aside once it holds CHECKPOINT_WAL_BYTES; here SQLite
    # does, in the committing call, at about the same size (its CPU counts either way).
    pages = _backend.CHECKPOINT_WAL_BYTES // int(conn.execute("PRAGMA page_size").fetchone()[0])
    conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
    conn.execute("BEGIN IMMEDIATE")
    for statement in THREAD_DDL:
        conn.execute(statement)
    conn.execute("COMMIT")
    return conn


def _floor_insert(conn: sqlite3.Connection, run_id: str, args: str, run_at: float) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(_INSERT, (run_id, "noop", "pending", args, run_at, time.time(),
                           None, None, None))
    conn.execute("COMMIT")


def _floor_claim(conn: sqlite3.Connection, now: float) -> tuple[str, int]:
    row = conn.execute(_CLAIM, (now, now)).fetchone()
    conn.execute(_ATTEMPT, (row[1], row[9], now, None))
    return row[1], row[9]


def _floor_finish(conn: sqlite3.Connection, run: tuple[str, int]) -> None:
    done = time.time()
    row = conn.execute(_FINISH, ("completed", None, done, None, *run)).fetchone()
    conn.execute(_END_ATTEMPT, (done, "completed", None, row[1], row[9]))


def _floor(grouped: bool) -> tuple[float, float]:
    """Process CPU µs per run of the floor: (insert, insert + claim + finish).

    ``grouped``: a run's finish commits with the claim of its thread's next run, as the
    runtime's drain does (two commits per run); else each in a commit of its own (three).
    """
    with tempfile.TemporaryDirectory() as data_dir:
        conns = [_floor_connect(Path(data_dir) / f"t{i}.sqlite") for i in range(THREADS)]
        try:
            order = [conns[i % THREADS] for i in range(RUNS)]
            later = time.time() + 3600
            ids = [new_id() for _ in range(2 * RUNS)]
            args = [json.dumps({"due": later}, separators=(",", ":"))] * RUNS
            running: dict[int, tuple[str, int]] = {}
            cpu0 = time.process_time()
            for conn, run_id, arg in zip(order, ids[:RUNS], args, strict=True):
                _floor_insert(conn, run_id, arg, later)
            cpu1 = time.process_time()
            for conn, run_id, arg in zip(order, ids[RUNS:], args, strict=True):
                now = time.time()
                _floor_insert(conn, run_id, arg, now)
                conn.execute("BEGIN IMMEDIATE")
                if grouped:
                    if id(conn) in running:
                        _floor_finish(conn, running[id(conn)])
                    running[id(conn)] = _floor_claim(conn, now)
                else:
                    run = _floor_claim(conn, now)
                    conn.execute("COMMIT")
                    conn.execute("BEGIN IMMEDIATE")
                    _floor_finish(conn, run)
                conn.execute("COMMIT")
            for conn in conns:  # the last run of each thread (grouped)
                if id(conn) in running:
                    conn.execute("BEGIN IMMEDIATE")
                    _floor_finish(conn, running[id(conn)])
                    conn.execute("COMMIT")
            cpu2 = time.process_time()
        finally:
            for conn in conns:
                conn.close()
    return (cpu1 - cpu0) * 1e6 / RUNS, (cpu2 - cpu1) * 1e6 / RUNS


async def main() -> None:
    """Measure and print the JSON line."""
    with tempfile.TemporaryDirectory() as data_dir:
        async with Runtime(
            app_dir=ROOT / "bench" / "app", data_dir=data_dir, synchronous=OPTS.synchronous,
            load_packages=False,
        ) as rt:
            gc.freeze()
            threads = [await rt.create_thread() for _ in range(THREADS)]
            due = time.time() + 3600
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(_schedule(t, RUNS // THREADS, due, 3600) for t in threads))
            cpu1, wall1, times1 = time.process_time(), time.perf_counter(), os.times()
            now = time.time()
            await asyncio.gather(*(_schedule(t, RUNS // THREADS, now, 0) for t in threads))
            await rt.wait_idle(300)
            cpu2, wall2, times2 = time.process_time(), time.perf_counter(), os.times()
    per_run = 1e6 / RUNS
    line: dict[str, float] = {
        "sched_cpu_us": round((cpu1 - cpu0) * per_run, 1),
        "sched_wall_us": round((wall1 - wall0) * per_run, 1),
        "sched_per_second": round(RUNS / (wall1 - wall0)),
        "exec_cpu_us": round((cpu2 - cpu1) * per_run, 1),
        "exec_wall_us": round((wall2 - wall1) * per_run, 1),
        # The execute phase's CPU split: user space (Python, SQLite's own code) and the
        # kernel (SQLite's writes and locks); 10 ms ticks, so a few runs' worth of noise.
        "exec_user_us": round((times2.user - times1.user) * per_run, 1),
        "exec_sys_us": round((times2.system - times1.system) * per_run, 1),
    }
    if not OPTS.no_floor:
        floor_sched, floor_exec = _floor(grouped=False)
        _, floor_grouped = _floor(grouped=True)
        line["floor_sched_cpu_us"] = round(floor_sched, 1)
        line["floor_exec_cpu_us"] = round(floor_exec, 1)
        line["floor_exec_grouped_cpu_us"] = round(floor_grouped, 1)
        line["exec_over_floor"] = round(line["exec_cpu_us"] / floor_exec, 2)
        line["exec_over_floor_grouped"] = round(line["exec_cpu_us"] / floor_grouped, 2)
    print(json.dumps(line))


if __name__ == "__main__":
    asyncio.run(main())
