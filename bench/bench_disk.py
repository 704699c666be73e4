"""Where the disk time goes: fsyncs and writes per scheduled and per executed run, per file.

    .venv/bin/python bench/bench_disk.py [SOURCE_ROOT] [--n 2000] [--threads 100]
                                         [--lead 4] [--spread 2] [--synchronous FULL]
                                         [--no-strace]

The peers' workload in small (``../shared/peers_bench``: ``--n`` runs on ``--threads``
threads created first, scheduled one after another from one caller, due evenly over
``--spread`` seconds starting ``--lead`` seconds after scheduling began), once through the
product (`Runtime`, the no-op effect of ``bench/app``) and once through the floor (stdlib
``sqlite3``, WAL, a file per thread, one ``INSERT`` + ``COMMIT`` per run, one ``UPDATE`` +
``COMMIT`` per run done), each in a child process under ``strace -f -y`` (``fsync``,
``fdatasync``, ``pwrite64``). Prints one JSON line per side and phase (``schedule``: from
the first schedule until the last returned; ``execute``: from then until every run
finished) with, per file kind (``thread-wal``, ``thread-db``, ``runtime-wal``,
``runtime-db``, ``other``), syncs and writes per run and KiB written per run.

Then, without strace, the caller's wait per schedule in the product: the whole
``schedule_effect`` call against the thread store's ``insert_run`` (its ``BEGIN`` …
``COMMIT`` on a storage thread) and the ``COMMIT`` alone (the fsync), means and p50 in
µs, and how often each runtime-store write ran in each phase (``lower_alarm``, a commit
the caller waits for; ``move_alarms``; ``index_runs``; ``set_alarm``; ``touch_threads``).
``--no-strace`` skips the strace part (timings only). strace slows the process several
fold: its counts are exact, its rates are not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _args import nonnegative_float, positive_float, positive_int, source_tree

_parser = argparse.ArgumentParser(description="fsyncs and writes per run, per file")
_parser.add_argument("root", nargs="?", type=source_tree,
                     default=Path(__file__).resolve().parent.parent)
_parser.add_argument("--n", type=positive_int, default=2000)
_parser.add_argument("--threads", type=positive_int, default=100)
_parser.add_argument("--lead", type=positive_float, default=4.0)
_parser.add_argument("--spread", type=nonnegative_float, default=2.0)
_parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
_parser.add_argument("--strace-lead", type=positive_float, default=30.0,
                     help="the lead under strace (slower: scheduling must end before runs are due)")
_parser.add_argument("--no-strace", action="store_true")
_parser.add_argument("--child", choices=["product", "floor", "timing"], default=None,
                     help=argparse.SUPPRESS)
_parser.add_argument("--data", type=Path, default=None, help=argparse.SUPPRESS)
OPTS = _parser.parse_args()
ROOT = OPTS.root.resolve()


def _offsets() -> list[float]:
    """Seconds from the start of scheduling to each run's due time (a fixed shuffle)."""
    import random

    perm = list(range(OPTS.n))
    random.Random(42).shuffle(perm)
    return [OPTS.lead + OPTS.spread * p / OPTS.n for p in perm]


# ------------------------------------------------------------------ children


def _floor(data: Path) -> dict[str, float]:
    conns = []
    for k in range(OPTS.threads):
        c = sqlite3.connect(data / f"t{k}.sqlite")
        c.execute("PRAGMA journal_mode=WAL")
        c.execute(f"PRAGMA synchronous={OPTS.synchronous}")
        c.execute("CREATE TABLE alarms(id INTEGER PRIMARY KEY, thread INTEGER NOT NULL, "
                  "due REAL NOT NULL, fn TEXT NOT NULL, args TEXT NOT NULL, done_at REAL)")
        c.execute("CREATE INDEX alarms_pending ON alarms(due) WHERE done_at IS NULL")
        c.commit()
        conns.append(c)
    import heapq

    offsets = _offsets()
    heap: list[tuple[float, int]] = []
    t0 = time.time()
    for i in range(OPTS.n):
        c = conns[i % OPTS.threads]
        due = t0 + offsets[i]
        c.execute("INSERT INTO alarms(id, thread, due, fn, args) VALUES (?,?,?,?,?)",
                  (i, i % OPTS.threads, due, "noop", f"[{i}]"))
        c.commit()
        heapq.heappush(heap, (due, i))
    t1 = time.time()
    while heap:
        due, i = heap[0]
        now = time.time()
        if due > now:
            time.sleep(min(due - now, 0.05))
            continue
        heapq.heappop(heap)
        c = conns[i % OPTS.threads]
        c.execute("UPDATE alarms SET done_at=? WHERE id=?", (time.time(), i))
        c.commit()
    t2 = time.time()
    for c in conns:
        c.close()
    return {"t0": t0, "t1": t1, "t2": t2}


async def _product(data: Path, timing: bool) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from runtime import Runtime
    from runtime.storage import sqlite as _sqlite

    counts: dict[str, int] = defaultdict(int)
    store_s: list[float] = []
    store_at: list[tuple[float, float]] = []  # perf_counter at insert_run's start and end
    commit_s: list[float] = []
    if timing:
        for name in ("lower_alarm", "move_alarms", "index_runs", "set_alarm", "touch_threads"):
            original = getattr(_sqlite.SQLiteRuntimeStore, name)

            def counted(self: Any, *args: Any, _o: Any = original, _n: str = name) -> Any:
                counts[_n] += 1
                return _o(self, *args)

            setattr(_sqlite.SQLiteRuntimeStore, name, counted)
        insert_run = _sqlite.SQLiteThreadStore.insert_run

        def timed_insert(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return insert_run(self, *args, **kwargs)
            finally:
                end = time.perf_counter()
                store_s.append(end - start)
                store_at.append((start, end))

        _sqlite.SQLiteThreadStore.insert_run = timed_insert  # type: ignore[method-assign]
        transaction = _sqlite._transaction

        def timed_transaction(conn: sqlite3.Connection, fn: Any, write: bool) -> Any:
            if not write:
                return fn(conn)

            def body(c: sqlite3.Connection) -> Any:
                result = fn(c)
                # The COMMIT follows; time it by committing here and leaving an empty
                # transaction for the caller's COMMIT.
                start = time.perf_counter()
                c.execute("COMMIT")
                commit_s.append(time.perf_counter() - start)
                c.execute("BEGIN")
                return result

            return transaction(conn, body, write)

        _sqlite._transaction = timed_transaction
        stores = ((_sqlite.SQLiteThreadStore, "thread"), (_sqlite.SQLiteRuntimeStore, "runtime"))
        for cls, kind in stores:
            tx = cls._tx

            def counted_tx(self: Any, fn: Any, *, write: bool = True, _tx: Any = tx,
                           _kind: str = kind) -> Any:
                if write:
                    counts[f"{_kind}_commits"] += 1
                return _tx(self, fn, write=write)

            cls._tx = counted_tx  # type: ignore[method-assign]

    offsets = _offsets()
    async with Runtime(app_dir=ROOT / "bench" / "app", data_dir=data,
                       synchronous=OPTS.synchronous, freeze_gc=True) as rt:
        starts: list[float] = rt.registry.resolve("noop").fn.__globals__["STARTS"]
        threads = [await rt.create_thread(f"t{k}") for k in range(OPTS.threads)]
        await asyncio.sleep(0.3)
        hops: list[float] = []
        for _ in range(500):
            start = time.perf_counter()
            await rt.run_sync(int)
            hops.append(time.perf_counter() - start)
        before = dict(counts)
        cpu0, loop_cpu0 = time.process_time(), time.thread_time()
        waits: list[float] = []
        calls: list[tuple[float, float]] = []
        t0 = time.time()
        commits_before_sched = len(commit_s)
        for i in range(OPTS.n):
            start = time.perf_counter()
            await threads[i % OPTS.threads].schedule_effect(
                "noop", {"due": t0 + offsets[i]}, delay=max(0.0, t0 + offsets[i] - time.time()))
            end = time.perf_counter()
            waits.append(end - start)
            calls.append((start, end))
        t1 = time.time()
        cpu1, loop_cpu1 = time.process_time(), time.thread_time()
        sched_counts = {k: counts[k] - before.get(k, 0) for k in counts}
        sched_commits = commit_s[commits_before_sched:]
        sched_store = list(store_s)
        while len(starts) < OPTS.n:  # noqa: ASYNC110 - the no-op only appends to a list
            await asyncio.sleep(0.01)
        await rt.wait_idle()
        t2 = time.time()
        exec_counts = {k: counts[k] - before.get(k, 0) - sched_counts.get(k, 0) for k in counts}
    out: dict[str, Any] = {"t0": t0, "t1": t1, "t2": t2}
    if timing:
        def stats(xs: list[float]) -> dict[str, float]:
            xs = sorted(xs)
            return {"mean_us": round(sum(xs) / len(xs) * 1e6),
                    "p50_us": round(xs[len(xs) // 2] * 1e6)}

        out.update({
            "schedule_effect": stats(waits), "insert_run": stats(sched_store),
            "commit": stats(sched_commits) if sched_commits else None,
            # before the store call started (validation, the actor lock, the alarm, the
            # hand-off to a storage thread) and after it ended (the hop back, the frame)
            "before_store": stats([s - c for (c, _), (s, _) in zip(calls, store_at, strict=True)]),
            "after_store": stats([c - e for (_, c), (_, e) in zip(calls, store_at, strict=True)]),
            "other_commits_while_scheduling": len(sched_commits) - len(sched_store),
            "runtime_store_calls_schedule": sched_counts,
            "runtime_store_calls_execute": exec_counts,
            "sched_per_s": round(OPTS.n / (t1 - t0)),
            "hop_no_op": stats(hops),
            "cpu_per_schedule_us": {"process": round((cpu1 - cpu0) / OPTS.n * 1e6),
                                    "loop_thread": round((loop_cpu1 - loop_cpu0) / OPTS.n * 1e6)},
        })
    return out


def _child() -> None:
    assert OPTS.data is not None
    if OPTS.child == "floor":
        out: dict[str, Any] = _floor(OPTS.data)
    else:
        out = asyncio.run(_product(OPTS.data, OPTS.child == "timing"))
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------ parent

_LINE = re.compile(r"^\d+\s+(\d+\.\d+)\s+(fsync|fdatasync|pwrite64)\((\d+)<([^>]*)>(.*)$")


def _kind(path: str) -> str:
    name = os.path.basename(path)
    if "/threads/" in path or re.fullmatch(r"t\d+\.sqlite(-wal)?", name):
        return "thread-wal" if name.endswith("-wal") else "thread-db"
    if name.startswith("runtime.sqlite"):
        return "runtime-wal" if name.endswith("-wal") else "runtime-db"
    return "other"


def _run_child(side: str, strace: bool) -> tuple[dict[str, Any], Path | None]:
    data = Path(tempfile.mkdtemp(prefix=f"bench_disk_{side}_"))
    log = data.parent / (data.name + ".strace")
    cmd = [sys.executable, __file__, str(ROOT), "--child", side, "--data", str(data),
           "--n", str(OPTS.n), "--threads", str(OPTS.threads),
           "--lead", str(OPTS.strace_lead if strace else OPTS.lead),
           "--spread", str(OPTS.spread), "--synchronous", OPTS.synchronous]
    if strace:
        cmd = ["strace", "-f", "--seccomp-bpf", "-ttt", "-y", "-s", "0", "-e",
               "trace=fsync,fdatasync,pwrite64", "-o", str(log), *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{side} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    shutil.rmtree(data, ignore_errors=True)
    return json.loads(lines[-1][7:]), (log if strace else None)


def _account(side: str, phases: dict[str, Any], log: Path) -> None:
    acc: dict[str, dict[str, dict[str, float]]] = {
        phase: defaultdict(lambda: defaultdict(float)) for phase in ("schedule", "execute")}
    with log.open() as f:
        for line in f:
            m = _LINE.match(line)
            if m is None:
                continue
            ts, call, _fd, path, rest = float(m[1]), m[2], m[3], m[4], m[5]
            phase = ("schedule" if phases["t0"] <= ts < phases["t1"]
                     else "execute" if phases["t1"] <= ts <= phases["t2"] else None)
            if phase is None:
                continue
            kind = acc[phase][_kind(path)]
            if call == "pwrite64":
                kind["writes"] += 1
                size = re.match(r", \"\"\.*, (\d+),", rest)
                if size:
                    kind["bytes"] += int(size[1])
            else:
                kind["syncs"] += 1
    log.unlink()
    for phase, kinds in acc.items():
        seconds = (phases["t1"] - phases["t0"] if phase == "schedule"
                   else phases["t2"] - phases["t1"])
        row: dict[str, Any] = {"side": side, "phase": phase, "runs": OPTS.n,
                               "seconds_under_strace": round(seconds, 2),
                               "overlap": phases["t1"] > phases["t0"] + OPTS.strace_lead}
        for kind, v in sorted(kinds.items()):
            row[kind] = {"syncs_per_run": round(v["syncs"] / OPTS.n, 3),
                         "writes_per_run": round(v["writes"] / OPTS.n, 2),
                         "kib_per_run": round(v["bytes"] / OPTS.n / 1024, 2)}
        row["syncs_per_run"] = round(sum(v["syncs"] for v in kinds.values()) / OPTS.n, 3)
        print(json.dumps(row), flush=True)


def main() -> None:
    """Count per side under strace, then time the product's schedule path."""
    if OPTS.child:
        _child()
        return
    load = os.getloadavg()[0]
    print(json.dumps({"source": str(ROOT), "n": OPTS.n, "threads": OPTS.threads,
                      "synchronous": OPTS.synchronous, "load_average": round(load, 1)}))
    if not OPTS.no_strace:
        if shutil.which("strace") is None:
            raise SystemExit("strace is not installed (apt-get install strace); "
                             "or pass --no-strace")
        for side in ("floor", "product"):
            phases, log = _run_child(side, strace=True)
            assert log is not None
            _account(side, phases, log)
    floor, _ = _run_child("floor", strace=False)
    print(json.dumps({"side": "floor", "sched_per_s": round(OPTS.n / (floor["t1"] - floor["t0"]))}))
    timing, _ = _run_child("timing", strace=False)
    print(json.dumps({"side": "product", "timing": {k: v for k, v in timing.items()
                                                    if k not in ("t0", "t1", "t2")}}))
    print(json.dumps({"load_average_after": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
    main()
