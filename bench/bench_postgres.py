"""Scheduling and execution on the PostgreSQL backend, 1 and 3 processes, beside raw psycopg.

Usage::

    .venv/bin/python bench/bench_postgres.py [--runs 10000] [--threads 100] [--spread 5]
        [--processes 1,3] [--server-url postgresql://postgres@127.0.0.1:5432] [--quick]
        [--peers procrastinate,dbos | none] [--peers-dir DIR] [--peers-venvs DIR]

The workload is issue 13's (and ../shared/peers_bench's): N delayed runs over T threads
(run i on thread i mod T), due evenly over ``spread`` seconds in a shuffled order, each
scheduled by one caller, one after another (each call returns once the run is
committed). With P processes there are P callers, one per process, each scheduling its
share (runs i with i mod P = k) one after another; every process also executes runs
(the runs are claimed by whichever process gets them).

Everything happens in one fresh database (``te_bench_<pid>_<hex>``, dropped at the end)
on the server under test: first the raw baseline (the product's own ``effect_runs`` table,
generated DDL, one ``INSERT`` per run from one psycopg connection, each its own committed
transaction), then each product case in its own schema and its own processes
(``--child``). Then, on the same server and with the same N and spread, the peers of
issue 13 as ../shared/peers_bench runs them (its runners unchanged, pointed at this server
with ``PEERS_BENCH_PG_DSN``; each makes a database of its own, dropped afterwards):
procrastinate (``peer_procrastinate.py``, case ``tuned@100``) and DBOS with a PostgreSQL
system database (``peer_dbos.py``, case ``pg-queue-delay@100``). A peer whose venv
(``setup.sh`` makes them under /tmp/peers_bench) is missing is skipped, and the report says
so and how to make it. bench/README.md says what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _args import nonnegative_float, positive_int  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

SCRIPT = Path(__file__).resolve()
APP_DIR = SCRIPT.parent / "app"
DEFAULT_SERVER = os.environ.get("THREAD_EFFECTS_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
TABLE_HEADER = "| figure | processes | thread-effects | raw psycopg | ratio | target | result |"
PEER_SCHEDULE_RATE = 960.0
"""The best peer's schedule rate on this kind of machine (DBOS, 850 to 960/s; procrastinate
about 700/s): issue 13's target is at least 3 times that with one process."""
TARGET_SCHEDULE_RATE = 3 * PEER_SCHEDULE_RATE
TARGET_P99_LAG_SECONDS = 0.100
PEERS = {
    # peer: (runner script, its case, venv folder, the databases it makes on the server)
    "procrastinate": ("peer_procrastinate.py", "tuned@100", "venv-proc", ("peersbench",)),
    "dbos": ("peer_dbos.py", "pg-queue-delay@100", "venv-dbos", ("peersbench_dbos_sys",)),
}
"""Issue 13's peers, each in the ../shared/peers_bench case that runs it on PostgreSQL."""
TARGET_PEER_RATIO = 3.0
GUARD_SECONDS = 120.0
"""How long a case may wait past the last due time for its runs before it gives up."""


def _percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[k]


def _progress(message: str) -> None:
    print(f"[bench_postgres {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- raw baseline


def raw_insert_rate(url: str, runs: int, *, explicit: bool, callers: int = 1) -> float:
    """Runs inserted per second by psycopg connections into the product's table.

    ``explicit``: ``BEGIN; INSERT; COMMIT`` as psycopg does it outside autocommit (three
    round trips); otherwise one autocommitted ``INSERT`` (one round trip, one commit).
    ``callers``: that many connections, each in a thread of its own inserting its share
    one after another (the server's commits then share WAL flushes).
    """
    import threading

    from runtime.storage.pg_schema import MIGRATIONS

    schema = f"raw_{'tx' if explicit else 'ac'}_{callers}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path = {schema}")
        for ddl in MIGRATIONS[0]:  # the product's own tables and indexes
            conn.execute(ddl)
    now = time.time()
    conns = [psycopg.connect(url, autocommit=not explicit,
                             options=f"-c search_path={schema}") for _ in range(callers)]
    go = threading.Barrier(callers + 1)

    def insert(conn: psycopg.Connection[Any], share: range) -> None:
        go.wait()
        for i in share:
            conn.execute(
                "INSERT INTO effect_runs (thread_id, id, name, status, args, run_at, "
                "created_at, attempts, replay_of, key, schedule_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s, %s, %s)",
                (f"bench-{i % 100}", uuid.uuid4().hex, "noop", "pending",
                 json.dumps({"due": now + 3600}), now + 3600, now, None, None, None),
            )
            if explicit:
                conn.commit()

    try:
        workers = [threading.Thread(target=insert, args=(conn, range(k, runs, callers)))
                   for k, conn in enumerate(conns)]
        for worker in workers:
            worker.start()
        go.wait()
        start = time.perf_counter()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
    finally:
        for conn in conns:
            conn.close()
    return runs / elapsed


# ---------------------------------------------------------------- one product process


def _dues(runs: int, base: float, spread: float) -> list[float]:
    """Due instant of run i: evenly over ``spread`` seconds, in a fixed shuffled order."""
    order = list(range(runs))
    random.Random(13).shuffle(order)
    return [base + spread * order[i] / runs for i in range(runs)]


def _completed(url: str) -> int:
    from runtime.storage.postgres import split_schema

    base, schema = split_schema(url)
    with psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}") as conn:
        row = conn.execute("SELECT count(*) FROM effect_runs WHERE status = 'completed'"
                           ).fetchone()
    return int(row[0]) if row else 0


def _leftovers(url: str, now: float, late_seconds: float) -> dict[str, int]:
    """What the runs not completed are: running, pending, and pending ones that are stuck.

    A pending run is *stuck* when it was due more than ``late_seconds`` ago and its thread
    runs nothing (no run of it is ``running``): no node is working on the thread, so the
    run waits for a wake-up that should have come (the poll plus the grace at most).
    """
    from runtime.storage.postgres import split_schema

    base, schema = split_schema(url)
    with psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}") as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE r.status = 'running'), "
            "count(*) FILTER (WHERE r.status = 'pending'), "
            "count(*) FILTER (WHERE r.status = 'pending' AND r.run_at < %s AND NOT EXISTS "
            "(SELECT 1 FROM effect_runs o WHERE o.thread_id = r.thread_id "
            "AND o.status = 'running')), "
            "count(*) FILTER (WHERE r.status = 'pending' AND NOT EXISTS "
            "(SELECT 1 FROM alarms a WHERE a.thread_id = r.thread_id AND a.due_at <= r.run_at)) "
            "FROM effect_runs r WHERE r.status NOT IN ('completed', 'failed', 'canceled')",
            (now - late_seconds,),
        ).fetchone()
    assert row is not None
    return {"running": int(row[0]), "pending": int(row[1]), "stuck": int(row[2]),
            "pending_without_alarm": int(row[3])}


async def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One product process: start, (process 0) create the threads, say ``ready``, wait for
    the start instant on stdin, schedule this process's share one after another, then
    wait until every run of the case completed; returns its figures."""
    import asyncio

    from runtime import Runtime

    index, processes = spec["index"], spec["processes"]
    runs, threads = spec["runs"], spec["threads"]
    extra: dict[str, Any] = {}
    if processes > 1:
        extra["node_id"] = f"bench-{index}"
    with tempfile.TemporaryDirectory(prefix="te-bench-pg-") as data:
        rt = Runtime(app_dir=APP_DIR, data_dir=data, database_url=spec["url"],
                     freeze_gc=True, **extra)
        await rt.start()
        try:
            noop = rt.registry.resolve("noop").fn.__globals__
            lags: list[float] = noop["LAGS"]
            if index == 0:
                for t in range(threads):
                    await rt.create_thread(f"bench-{t}")
            print("ready", flush=True)
            line = await asyncio.to_thread(sys.stdin.readline)
            t0, base = (float(x) for x in line.split())
            states = [await rt.get_thread(f"bench-{t}") for t in range(threads)]
            dues = _dues(runs, base, spec["spread"])
            await asyncio.sleep(max(0.0, t0 - time.time()))
            mine = range(index, runs, processes)
            callers = spec.get("callers", 1)

            async def caller(share: Sequence[int]) -> None:
                for i in share:
                    await states[i % threads].schedule_effect(
                        "noop", {"due": dues[i]}, delay=max(0.0, dues[i] - time.time()))

            started, cpu_started = time.time(), time.process_time()
            await asyncio.gather(*(caller(mine[k::callers]) for k in range(callers)))
            scheduled, cpu_scheduled = time.time(), time.process_time()
            limit = base + spec["spread"] + GUARD_SECONDS
            leftovers = None
            while True:
                if await asyncio.to_thread(_completed, spec["url"]) >= runs:
                    break
                if time.time() >= limit:
                    late = rt.settings.cluster_poll_seconds + 2 * (
                        rt.settings.cluster_wake_grace_seconds)
                    leftovers = await asyncio.to_thread(
                        _leftovers, spec["url"], time.time(), late)
                    break
                await asyncio.sleep(0.1)
            return {"index": index, "scheduled_runs": len(range(index, runs, processes)),
                    "schedule_started": started, "schedule_ended": scheduled,
                    "schedule_cpu": cpu_scheduled - cpu_started,
                    "cpu": time.process_time() - cpu_started,
                    "lags": list(lags), "starts": list(noop["STARTS"]),
                    "leftovers": leftovers}
        finally:
            await rt.close()


def _commits(url: str) -> int:
    """The committed transactions of ``url``'s database so far (`pg_stat_database`)."""
    from runtime.storage.postgres import split_schema

    base, _ = split_schema(url)
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def _server_cpu_seconds() -> float | None:
    """User + system seconds of every ``postgres`` process on this machine (``/proc``).

    The whole server: this database's backends, the WAL writer, the checkpointer, and any
    other database's work at the same time (read it on a quiet machine). None when no
    server process is readable here (a server on another host). Each process's reaped
    children count too (``cutime``, ``cstime``: the postmaster's ended backends), so the
    backends of a case's pools, gone when it is read again, are not lost.
    """
    total, seen = 0, False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                name, _, rest = f.read().partition(" (")[2].rpartition(") ")
        except OSError:
            continue
        if name != "postgres" and not name.startswith("postgres"):
            continue
        fields = rest.split()
        total += sum(int(x) for x in fields[11:15])
        seen = True
    return total / os.sysconf("SC_CLK_TCK") if seen else None


def run_case(url: str, processes: int, runs: int, threads: int, spread: float,
             lead: float, callers: int = 1) -> dict[str, Any]:
    """Start ``processes`` product processes on a fresh schema of ``url`` and measure."""
    spec = {"url": url, "processes": processes, "runs": runs, "threads": threads,
            "spread": spread, "callers": callers}
    procs: list[subprocess.Popen[str]] = []
    commits_before = _commits(url)
    server_before = _server_cpu_seconds()
    try:
        for index in range(processes):
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--child", json.dumps({**spec, "index": index})],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            )
            procs.append(proc)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                proc.wait(timeout=GUARD_SECONDS)
                raise RuntimeError(f"product process {index} of {processes} did not start "
                                   f"(exit {proc.returncode}); see its error output above")
        t0 = time.time() + 0.5
        base = t0 + lead
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{t0!r} {base!r}\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=lead + spread + GUARD_SECONDS + 60)
            if proc.returncode != 0:
                raise RuntimeError(f"a product process failed (exit {proc.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Every transaction of the database while the case ran (the processes have exited, so
    # their counts are flushed): its own, the completion polls' (10/s), autovacuum's.
    commits = _commits(url) - commits_before
    server_after = _server_cpu_seconds()
    lags = [lag for r in results for lag in r["lags"]]
    starts = [s for r in results for s in r["starts"]]
    sched_end = max(r["schedule_ended"] for r in results)
    sched_start = min(r["schedule_started"] for r in results)
    return {
        "processes": processes,
        "runs": runs,
        "schedule_rate": runs / (sched_end - sched_start),
        "executed": len(lags),
        "exec_rate": len(starts) / (max(starts) - base) if starts else 0.0,
        "lag_p50": _percentile(lags, 50),
        "lag_p99": _percentile(lags, 99),
        "lag_max": max(lags, default=float("nan")),
        "overlap": sched_end > base,
        # CPU seconds of the product processes (every thread: loop, storage, bus), per run.
        "schedule_cpu_per_run": sum(r["schedule_cpu"] for r in results) / runs,
        "cpu_per_run": sum(r["cpu"] for r in results) / runs,
        "commits_per_run": commits / runs,
        # CPU seconds of the whole PostgreSQL server on this machine over the case, per run.
        "server_cpu_per_run": (None if server_before is None or server_after is None
                               else (server_after - server_before) / runs),
        "per_process_executed": [len(r["lags"]) for r in results],
        "leftovers": next((r["leftovers"] for r in results if r["leftovers"]), None),
    }


# ---------------------------------------------------------------- the peers


def peers_dir(given: Path | None) -> Path | None:
    """../shared/peers_bench (next to the checkout or its parent), or ``given``."""
    candidates = [given] if given else [
        ROOT.parent / "shared" / "peers_bench", ROOT.parent.parent / "shared" / "peers_bench",
    ]
    return next((p for p in candidates if p is not None and (p / "harness.py").is_file()),
                None)


def run_peer(peer: str, server_url: str, peers: Path | None, venvs: Path, runs: int,
             spread: float) -> dict[str, Any]:
    """Run one peer's PostgreSQL case on ``server_url``; its result row, or ``skipped``.

    The runner is the peers' own (``--cases``, ``--n``, ``--spread``, ``--out``), run with
    its venv's interpreter and ``PEERS_BENCH_PG_DSN`` set to this server; the databases it
    makes are dropped afterwards.
    """
    script, case, venv, databases = PEERS[peer]
    python = venvs / venv / "bin" / "python"
    if peers is None:
        return {"peer": peer, "case": case, "skipped": "../shared/peers_bench not found "
                "(give --peers-dir)"}
    if not python.is_file():
        return {"peer": peer, "case": case, "skipped": (
            f"no venv {python.parent.parent} (make it: bash {peers / 'setup.sh'}, from the "
            f"project root; it makes every peer's venv under /tmp/peers_bench)")}
    with tempfile.TemporaryDirectory(prefix="te-bench-peer-") as tmp:
        out = Path(tmp) / f"{peer}.json"
        cmd = [str(python), str(peers / script), "--cases", case, "--n", str(runs),
               "--spread", repr(spread), "--out", str(out)]
        env = {**os.environ, "PEERS_BENCH_PG_DSN": f"{server_url}/postgres",
               "PEERS_BENCH_DATA": tmp}
        try:
            proc = subprocess.run(cmd, env=env, cwd=peers, capture_output=True, text=True,
                                  timeout=15 * 60)
        finally:
            with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
                for db in databases:
                    conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        if proc.returncode != 0 or not out.is_file():
            return {"peer": peer, "case": case, "error": (
                f"runner exit {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}")}
        doc = json.loads(out.read_text())
    [row] = doc["results"]
    row.update(peer=peer, case=case, versions=doc.get("versions", {}))
    return dict(row)


# ---------------------------------------------------------------- report


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _peer_lag(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    return f"{'≥ ' if row.get('lag_censored') else ''}{value:,.1f} ms"


def report_peers(raw: dict[str, float], cases: list[dict[str, Any]],
                 peers: list[dict[str, Any]]) -> None:
    """The second table: thread-effects (1 process) beside each peer, measured in this run."""
    one = next((c for c in cases if c["processes"] == 1 and c.get("callers", 1) == 1), None)
    if one is None or not peers:
        return
    ours = one["schedule_rate"]
    print(f"\nBeside the peers (same server, {one['executed']:,} of our runs executed; "
          f"raw committed INSERT {_fmt_rate(raw['autocommit'])}): issue 13's targets are "
          f"thread-effects ≥ {TARGET_PEER_RATIO:g} x each peer's schedule rate and lag p99 "
          f"< {_fmt_ms(TARGET_P99_LAG_SECONDS)}, one process.\n")
    print("| system (case) | scheduled | / raw INSERT | thread-effects / it | target "
          "| result | executed | lag p50 | lag p99 | lag max | missing |")
    print("|---|--:|--:|--:|---|---|--:|--:|--:|--:|--:|")
    print(f"| thread-effects (1 process) | {_fmt_rate(ours)} | {ours / raw['autocommit']:.2f} "
          f"| - | - | - | {_fmt_rate(one['exec_rate'])} | {_fmt_ms(one['lag_p50'])} "
          f"| {_fmt_ms(one['lag_p99'])} | {_fmt_ms(one['lag_max'])} "
          f"| {int(one['runs']) - one['executed']} |")
    for row in peers:
        name = f"{row['peer']} ({row['case']})"
        if "skipped" in row or "error" in row:
            why = row.get("skipped") or row.get("error")
            print(f"| {name} | not run: {why} | - | - | - | - | - | - | - | - | - |")
            continue
        rate = row.get("sched_rate") or 0.0
        ratio = ours / rate if rate else float("nan")
        print(f"| {name} | {_fmt_rate(rate)} | {rate / raw['autocommit']:.2f} | "
              f"{ratio:.2f} | ≥ {TARGET_PEER_RATIO:g} | {_verdict(ratio >= TARGET_PEER_RATIO)} "
              f"| {_fmt_rate(row.get('exec_rate') or 0.0)} | {_peer_lag(row, 'lag_ms_p50')} "
              f"| {_peer_lag(row, 'lag_ms_p99')} | {_peer_lag(row, 'lag_ms_max')} "
              f"| {row.get('missing', '-')} |")
        note = row.get("case_error") or (
            "overlap: scheduling was still going when the first item came due"
            if row.get("overlap") else None)
        if note:
            print(f"|   ({row['peer']}: {note}) | | | | | | | | | | |")


def report(raw: dict[str, float], cases: list[dict[str, Any]], skipped: dict[int, str],
           opts: argparse.Namespace, peers: list[dict[str, Any]] | None = None) -> None:
    """Print the Markdown table (stdout) and, with ``--json``, one JSON line after it."""
    base = raw["autocommit"]
    print(f"\nPostgreSQL {raw['server_version']}, {opts.runs:,} runs over {opts.threads} "
          f"threads due over {opts.spread:g} s, one caller per process; raw psycopg: one "
          f"connection, one committed INSERT per run ({_fmt_rate(base)}; BEGIN/INSERT/COMMIT: "
          f"{_fmt_rate(raw['explicit'])})"
          + (f"; with {raw['callers']} callers: {raw['callers']} connections, each in a "
             f"thread of its own ({_fmt_rate(raw['autocommit_callers'])})"
             if "callers" in raw else "") + ".\n")
    print(TABLE_HEADER)
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        callers = case.get("callers", 1)
        # The targets are read on the one-caller case of one process (the peers' shape).
        judged = case["processes"] == 1 and callers == 1
        p = case["processes"] if callers == 1 else f"{case['processes']} x {callers} callers"
        rate = case["schedule_rate"]
        floor = base if callers == 1 else raw["autocommit_callers"]
        target = (f"≥ {TARGET_SCHEDULE_RATE:,.0f}/s (3 x {PEER_SCHEDULE_RATE:,.0f}/s)"
                  if judged else "-")
        result = _verdict(rate >= TARGET_SCHEDULE_RATE) if judged else "-"
        print(f"| scheduled | {p} | {_fmt_rate(rate)} | {_fmt_rate(floor)} | "
              f"{rate / floor:.2f} | {target} | {result} |")
        print(f"| executed (runs / last start - first due) | {p} | "
              f"{_fmt_rate(case['exec_rate'])} | - | - | - | - |")
        print(f"| lag due→start p50 | {p} | {_fmt_ms(case['lag_p50'])} | - | - | - | - |")
        target = f"< {_fmt_ms(TARGET_P99_LAG_SECONDS)}" if judged else "-"
        result = _verdict(case["lag_p99"] < TARGET_P99_LAG_SECONDS) if judged else "-"
        print(f"| lag due→start p99 | {p} | {_fmt_ms(case['lag_p99'])} | - | - | {target} "
              f"| {result} |")
        print(f"| lag due→start max | {p} | {_fmt_ms(case['lag_max'])} | - | - | - | - |")
        print(f"| CPU per run while scheduling | {p} | "
              f"{case['schedule_cpu_per_run'] * 1e6:,.0f} µs | - | - | - | - |")
        print(f"| CPU per run, whole case | {p} | {case['cpu_per_run'] * 1e6:,.0f} µs | - | - "
              f"| - | - |")
        server = case.get("server_cpu_per_run")
        print(f"| PostgreSQL server CPU per run, whole case | {p} | "
              f"{'-' if server is None else f'{server * 1e6:,.0f} µs'} | - | - | - | - |")
        print(f"| database commits per run, whole case | {p} | "
              f"{case['commits_per_run']:.2f} | - | - | - | - |")
    for p, why in skipped.items():
        print(f"| (not run) | {p} | {why} | - | - | - | - |")
    notes = []
    for case in cases:
        if case["executed"] != opts.runs:
            notes.append(f"{case['processes']} process(es): {case['executed']} of "
                         f"{opts.runs} runs executed before the case gave up")
            left = case.get("leftovers")
            if left:
                notes.append(
                    f"{case['processes']} process(es), at give-up: {left['running']} running, "
                    f"{left['pending']} pending, of which {left['stuck']} stuck (due more "
                    f"than a poll plus twice the grace ago in a thread that runs nothing) "
                    f"and {left['pending_without_alarm']} without an alarm row at or "
                    f"before them")
        if case["overlap"]:
            notes.append(f"{case['processes']} process(es): scheduling was still going when "
                         f"the first run came due (raise --lead)")
        if case["processes"] > 1:
            notes.append(f"{case['processes']} processes: runs executed per process "
                         f"{case['per_process_executed']}")
    for note in notes:
        print(f"\nNote: {note}.")
    report_peers(raw, cases, peers or [])
    if opts.json:
        print(json.dumps({"raw": raw, "cases": cases, "skipped": skipped,
                          "peers": peers or []}))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=10_000, help="runs (default 10,000)")
    parser.add_argument("--threads", type=positive_int, default=100, help="threads (default 100)")
    parser.add_argument("--spread", type=nonnegative_float, default=5.0,
                        help="seconds over which the runs come due (default 5)")
    parser.add_argument("--lead", type=nonnegative_float, default=None,
                        help="seconds from the start of scheduling to the first due time "
                             "(default: runs / 1,200 + 1, so scheduling ends before it)")
    parser.add_argument("--processes", default="1,3",
                        help="product process counts to run, comma-separated (default 1,3)")
    parser.add_argument("--server-url", default=DEFAULT_SERVER,
                        help="PostgreSQL server without a database name")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: 500 runs, 10 threads, 1 s spread")
    parser.add_argument("--peers", default="procrastinate,dbos",
                        help="peers to run on the same server after the product, "
                             "comma-separated, or 'none' (default procrastinate,dbos)")
    parser.add_argument("--peers-dir", type=Path, default=None,
                        help="../shared/peers_bench (default: found next to the checkout)")
    parser.add_argument("--peers-venvs", type=Path, default=Path("/tmp/peers_bench"),
                        help="where peers_bench's setup.sh made the venvs (/tmp/peers_bench)")
    parser.add_argument("--callers", type=positive_int, default=1,
                        help="also run each process count with this many concurrent "
                             "callers per process (each call still returns once its run "
                             "is committed), beside a raw baseline with as many "
                             "connections (default 1: one caller only)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.runs, opts.threads, opts.spread = 500, 10, 1.0
    if opts.lead is None:
        opts.lead = opts.runs / 1200 + 1.0
    names = [p.strip() for p in opts.peers.split(",") if p.strip()]
    opts.peers = [] if names == ["none"] else names
    for name in opts.peers:
        if name not in PEERS:
            parser.error(f"--peers: unknown peer {name!r} (known: {', '.join(PEERS)}, "
                         f"or none)")
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    if opts.child:
        import asyncio

        print(json.dumps(asyncio.run(_child(json.loads(opts.child)))))
        return
    name = f"te_bench_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(f"{opts.server_url}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
        version = conn.execute("SHOW server_version").fetchone()
    url = f"{opts.server_url}/{name}"
    try:
        raw: dict[str, Any] = {"server_version": version[0] if version else "?"}
        _progress(f"raw psycopg: {opts.runs} committed INSERTs")
        raw["autocommit"] = raw_insert_rate(url, opts.runs, explicit=False)
        raw["explicit"] = raw_insert_rate(url, opts.runs, explicit=True)
        if opts.callers > 1:
            _progress(f"raw psycopg: {opts.runs} committed INSERTs, {opts.callers} callers")
            raw["callers"] = opts.callers
            raw["autocommit_callers"] = raw_insert_rate(url, opts.runs, explicit=False,
                                                        callers=opts.callers)
        cases, skipped = [], {}
        for processes in (int(p) for p in opts.processes.split(",")):
            _progress(f"thread-effects, {processes} process(es)")
            try:
                cases.append(run_case(f"{url}?schema=p{processes}", processes, opts.runs,
                                      opts.threads, opts.spread, opts.lead))
                if opts.callers > 1:
                    _progress(f"thread-effects, {processes} process(es), {opts.callers} "
                              f"callers each")
                    case = run_case(f"{url}?schema=p{processes}c", processes, opts.runs,
                                    opts.threads, opts.spread, opts.lead, opts.callers)
                    case["callers"] = opts.callers
                    cases.append(case)
            except RuntimeError as exc:
                if processes == 1:
                    raise
                skipped[processes] = f"could not run: {exc}"
        peers = []
        for peer in opts.peers:
            _progress(f"peer {peer} ({PEERS[peer][1]}) on the same server")
            peers.append(run_peer(peer, opts.server_url, peers_dir(opts.peers_dir),
                                  opts.peers_venvs, opts.runs, opts.spread))
        report(raw, cases, skipped, opts, peers)
    finally:
        with psycopg.connect(f"{opts.server_url}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
