"""Throughput, lag, memory and loop stalls of the runtime core, beside raw ``sqlite3``.

Usage::

    .venv/bin/python bench/bench_effects.py [--threads 100] [--runs 10000]
        [--synchronous FULL|NORMAL] [--spread 5] [--repeat 1] [--quick]

Everything runs on one disk (``--data-dir``, default the system temp folder), with one
SQLite file per thread and the same ``synchronous`` setting for the runtime and for the raw
baselines. Each raw baseline runs right before the runtime figure it is compared with, so
that load from other processes hits both alike. The runtime phases of the workload run
each in a fresh interpreter (``--child``), so that their RSS and stalls are their own.
bench/README.md says what each figure means; the targets come from docs/design.md
("Performance targets").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _args import nonnegative_float, positive_int  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio.to_thread  # noqa: E402

from runtime import Runtime, ThreadState  # noqa: E402
from runtime.storage.schema import EFFECT_RUNS_DDL  # noqa: E402

SCRIPT = Path(__file__).resolve()
APP_DIR = SCRIPT.parent / "app"
TABLE_HEADER = "| figure | threads | thread-effects | raw sqlite3 | ratio | target | result |"
FAR_FUTURE_SECONDS = 3600.0
"""Delay of the runs in the scheduling-only phase: nothing comes due while it is measured."""
TICK_SECONDS = 0.010
MIB = 1 << 20

# The raw baselines use the runtime's own schema (the DDL it runs, generated from its models:
# runtime/storage/schema.py) and the runtime's SQL (runtime/storage/sqlite.py: insert_run,
# finish_and_claim).
_COLUMNS = (
    "seq, id, name, status, args, run_at, created_at, started_at, finished_at, "
    "attempts, error, replay_of"
)
_INSERT = (
    "INSERT INTO effect_runs (id, name, status, args, run_at, created_at, attempts, "
    "replay_of) VALUES (?, ?, ?, ?, ?, ?, 0, ?)"
)
_FINISH = (
    f"UPDATE effect_runs SET status = ?, error = ?, finished_at = ? "
    f"WHERE id = ? AND status = 'running' RETURNING {_COLUMNS}"
)
_CLAIM = (
    f"UPDATE effect_runs SET status = 'running', attempts = attempts + 1, started_at = ? "
    f"WHERE seq = (SELECT seq FROM effect_runs WHERE status = 'pending' AND run_at <= ? "
    f"ORDER BY run_at, seq LIMIT 1) RETURNING {_COLUMNS}"
)
_NEXT_DUE = "SELECT min(run_at) FROM effect_runs WHERE status = 'pending'"


# ---------------------------------------------------------------------------- helpers


def _split(total: int, parts: int) -> list[int]:
    """``total`` runs spread over ``parts`` threads as evenly as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def _rss_bytes() -> int:
    """The process's resident set size now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _schedstat() -> tuple[float, float] | None:
    """The calling thread's (CPU seconds, seconds waiting for a CPU), from Linux schedstat."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu_ns, wait_ns, _ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(cpu_ns) / 1e9, int(wait_ns) / 1e9


def _worker_threads() -> int:
    """anyio's worker-thread limit, which bounds the runtime's concurrent SQLite calls."""
    return int(anyio.to_thread.current_default_thread_limiter().total_tokens)


def _args_json(due: float) -> str:
    return json.dumps({"due": due}, separators=(",", ":"))


class LoopMonitor:
    """Measures, while active, the longest event-loop stall and the peak RSS.

    A ticker task sleeps ``TICK_SECONDS`` in a loop; how much later than asked it wakes
    is how long the loop was kept from running it (a stall). RSS is sampled at each tick.
    For the longest gap (the sleep plus the stall) it also keeps where the loop thread's
    time went: on a CPU running code (``stall_cpu``: code ran on the loop), waiting for a
    CPU the OS gave to another thread or process (``stall_runqueue``), and the rest
    (``stall_other``: mostly waiting for the GIL held by worker threads).
    """

    def __init__(self) -> None:
        self.max_stall = 0.0
        self.stall_cpu = 0.0
        self.stall_runqueue: float | None = None
        self.stall_other: float | None = None
        self.peak_rss = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        ticks = 0
        while True:
            # Every system call here lets a worker thread take the GIL, so RSS is read
            # only every fifth tick.
            if ticks % 5 == 0:
                self.peak_rss = max(self.peak_rss, _rss_bytes())
            ticks += 1
            start, start_cpu, start_sched = time.perf_counter(), time.thread_time(), _schedstat()
            await asyncio.sleep(TICK_SECONDS)
            gap = time.perf_counter() - start
            if gap - TICK_SECONDS > self.max_stall:
                self.max_stall = gap - TICK_SECONDS
                self.stall_cpu = time.thread_time() - start_cpu
                end_sched = _schedstat()
                if start_sched is not None and end_sched is not None:
                    self.stall_runqueue = end_sched[1] - start_sched[1]
                    self.stall_other = max(
                        0.0, gap - TICK_SECONDS - self.stall_cpu - self.stall_runqueue
                    )

    async def __aenter__(self) -> LoopMonitor:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self.peak_rss = max(self.peak_rss, _rss_bytes())


# ------------------------------------------------------------------- raw baselines


def _raw_open(folder: Path, files: int, synchronous: str) -> list[sqlite3.Connection]:
    """One WAL file per thread with the runtime's run table (same DDL, indexes and pragmas)."""
    folder.mkdir(parents=True)
    conns = []
    for i in range(files):
        conn = sqlite3.connect(
            folder / f"raw-{i}.sqlite", isolation_level=None, check_same_thread=False,
            timeout=30,
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        for statement in EFFECT_RUNS_DDL:
            conn.execute(statement)
        conns.append(conn)
    return conns


def _raw_parallel(
    conns: list[sqlite3.Connection], job: Callable[[sqlite3.Connection, int], None],
    shares: list[int], workers: int,
) -> float:
    """Run ``job(conn, share)`` for every file on a pool of OS threads; seconds taken."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(workers, len(conns)))) as pool:
        list(pool.map(job, conns, shares))
    return time.perf_counter() - start


def raw_insert_rate(folder: Path, files: int, runs: int, synchronous: str, workers: int) -> float:
    """Raw INSERT+COMMIT per second: one transaction per run, each file written serially."""
    conns = _raw_open(folder, files, synchronous)

    def job(conn: sqlite3.Connection, share: int) -> None:
        for _ in range(share):
            now = time.time()
            due = now + FAR_FUTURE_SECONDS
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                _INSERT, (uuid.uuid4().hex, "noop", "pending", _args_json(due), due, now, None)
            )
            conn.execute("COMMIT")

    try:
        elapsed = _raw_parallel(conns, job, _split(runs, files), workers)
    finally:
        for conn in conns:
            conn.close()
        shutil.rmtree(folder)
    return runs / elapsed


def raw_execute_rate(folder: Path, files: int, runs: int, synchronous: str, workers: int) -> float:
    """Raw executions per second of runs that are all due: the runtime's per-run writes.

    Each run costs what it costs the runtime's drain loop: one transaction that finishes
    the previous run and claims the next (``UPDATE … RETURNING`` twice, then COMMIT), and
    a last one per file that finds nothing more due.
    """
    conns = _raw_open(folder, files, synchronous)
    shares = _split(runs, files)
    past = time.time() - 1.0
    for conn, share in zip(conns, shares, strict=True):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            _INSERT,
            [(uuid.uuid4().hex, "noop", "pending", _args_json(past), past, past, None)
             for _ in range(share)],
        )
        conn.execute("COMMIT")

    def job(conn: sqlite3.Connection, share: int) -> None:
        previous: str | None = None
        while True:
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            if previous is not None:
                conn.execute(_FINISH, ("completed", None, now, previous)).fetchone()
            row = conn.execute(_CLAIM, (now, now)).fetchone()
            if row is None:
                conn.execute(_NEXT_DUE).fetchone()
            conn.execute("COMMIT")
            if row is None:
                return
            json.loads(row[4])
            previous = row[1]

    try:
        elapsed = _raw_parallel(conns, job, shares, workers)
    finally:
        for conn in conns:
            conn.close()
        shutil.rmtree(folder)
    return runs / elapsed


async def raw_lag(
    folder: Path, files: int, runs: int, synchronous: str, workers: int, lead: float,
    spread: float,
) -> list[float]:
    """Raw lag due→start for the lag workload: what plain sqlite3 achieves on this machine now.

    The runs are inserted beforehand (not timed). For each, the event loop's own timer
    (``loop.call_at``) hands it at its due time to a pool of OS threads, which claims it
    (the runtime's claim ``UPDATE``, COMMIT), records the lag, and finishes it (UPDATE,
    COMMIT); each file is used by one OS thread at a time.
    """
    conns = await asyncio.to_thread(_raw_open, folder, files, synchronous)
    locks = [threading.Lock() for _ in conns]
    base = time.time() + lead
    dues: list[list[float]] = [[] for _ in range(files)]
    for i in range(runs):
        dues[i % files].append(base + spread * i / runs)

    def fill() -> None:
        for conn, thread_dues in zip(conns, dues, strict=True):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                _INSERT,
                [(uuid.uuid4().hex, "noop", "pending", _args_json(d), d, time.time(), None)
                 for d in thread_dues],
            )
            conn.execute("COMMIT")

    await asyncio.to_thread(fill)
    lags: list[float] = []

    def run_one(index: int, due: float) -> None:
        conn = conns[index]
        with locks[index]:
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(_CLAIM, (now, now)).fetchone()
            conn.execute("COMMIT")
            if row is None:
                raise RuntimeError("raw lag: a due run was not found")
            lags.append(time.time() - json.loads(row[4])["due"])
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_FINISH, ("completed", None, now, row[1])).fetchone()
            conn.execute("COMMIT")

    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[None]] = []
    all_submitted = asyncio.Event()
    try:
        with ThreadPoolExecutor(max(1, min(workers, files))) as pool:

            def submit(index: int, due: float) -> None:
                futures.append(loop.run_in_executor(pool, run_one, index, due))
                if len(futures) == runs:
                    all_submitted.set()

            offset = loop.time() - time.time()
            for index, thread_dues in enumerate(dues):
                for due in thread_dues:
                    loop.call_at(due + offset, submit, index, due)
            await all_submitted.wait()
            await asyncio.gather(*futures)
    finally:
        for conn in conns:
            conn.close()
        await asyncio.to_thread(shutil.rmtree, folder)
    return lags


# ------------------------------------------------------------------ runtime phases


@dataclass
class Phase:
    """What one runtime phase measured."""

    name: str = ""
    schedule_rate: float = 0.0
    execute_rate: float = 0.0
    lags: list[float] = field(default_factory=list)
    max_stall: float = 0.0
    stall_cpu: float = 0.0
    stall_runqueue: float | None = None
    stall_other: float | None = None
    peak_rss: int = 0
    start_rss: int = 0
    """RSS when the phase began: the interpreter with the runtime imported."""
    overran: float = 0.0
    """Seconds by which scheduling ran past the first due time (0 = it did not)."""
    tail: float = 0.0
    """Seconds from the last due time until every run had finished."""


def _stall_fields(mon: LoopMonitor) -> dict[str, Any]:
    return {
        "stall_cpu": mon.stall_cpu, "stall_runqueue": mon.stall_runqueue,
        "stall_other": mon.stall_other,
    }


async def _start(
    folder: Path, threads: int, synchronous: str
) -> tuple[Runtime, list[ThreadState], list[float]]:
    # freeze_gc as the server runs it (it was unconditional before it became a setting).
    rt = Runtime(app_dir=APP_DIR, data_dir=folder, synchronous=synchronous, freeze_gc=True)
    await rt.start()
    states = list(await asyncio.gather(*(rt.create_thread(f"bench-{i}") for i in range(threads))))
    # Discovery imports the effect file afresh for each runtime: this is its own list.
    lags: list[float] = rt.registry.resolve("noop").fn.__globals__["LAGS"]
    return rt, states, lags


async def _stop(rt: Runtime, folder: Path) -> None:
    await rt.close()
    await asyncio.to_thread(shutil.rmtree, folder)


async def _schedule(states: list[ThreadState], dues: list[list[float]]) -> float:
    """Schedule every thread's runs (each thread's in order, threads concurrently), the
    way independent requests would; returns the seconds taken."""

    async def one(state: ThreadState, thread_dues: list[float]) -> None:
        for due in thread_dues:
            await state.schedule_effect("noop", {"due": due}, delay=max(0.0, due - time.time()))

    start = time.perf_counter()
    await asyncio.gather(*(one(s, d) for s, d in zip(states, dues, strict=True)))
    return time.perf_counter() - start


async def _until_done(rt: Runtime, lags: list[float], runs: int, limit_seconds: float) -> float:
    """Wait until every run has started and the runtime is idle; returns ``time.time()``.

    ``wait_idle`` alone could return before the first alarm fires, so this first waits for
    the effect to have recorded every run (polling keeps the effect itself minimal).
    """
    async with asyncio.timeout(limit_seconds):
        while len(lags) < runs:  # noqa: ASYNC110
            await asyncio.sleep(0.002)
    await rt.wait_idle(limit_seconds)
    return time.time()


async def phase_schedule(folder: Path, threads: int, runs: int, synchronous: str) -> Phase:
    """(a) Scheduling only: every run is due far in the future."""
    rt, states, _ = await _start(folder, threads, synchronous)
    try:
        base = time.time() + FAR_FUTURE_SECONDS
        dues = [[base] * n for n in _split(runs, threads)]
        async with LoopMonitor() as mon:
            elapsed = await _schedule(states, dues)
    finally:
        await _stop(rt, folder)
    return Phase(
        schedule_rate=runs / elapsed, max_stall=mon.max_stall, **_stall_fields(mon),
        peak_rss=mon.peak_rss,
    )


async def phase_burst(
    folder: Path, threads: int, runs: int, synchronous: str, lead: float
) -> Phase:
    """(c) Every run due at the same instant, ``lead`` seconds after scheduling begins."""
    rt, states, lags = await _start(folder, threads, synchronous)
    try:
        base = time.time() + lead
        dues = [[base] * n for n in _split(runs, threads)]
        async with LoopMonitor() as mon:
            elapsed = await _schedule(states, dues)
            overran = max(0.0, time.time() - base)
            done = await _until_done(rt, lags, runs, lead + 600)
    finally:
        await _stop(rt, folder)
    return Phase(
        schedule_rate=runs / elapsed, execute_rate=runs / (done - base), lags=list(lags),
        max_stall=mon.max_stall, **_stall_fields(mon), peak_rss=mon.peak_rss,
        overran=overran,
    )


async def phase_lag(
    folder: Path, threads: int, runs: int, synchronous: str, lead: float, spread: float
) -> Phase:
    """(b) Runs due evenly over ``spread`` seconds (run i on thread i mod threads)."""
    rt, states, lags = await _start(folder, threads, synchronous)
    try:
        base = time.time() + lead
        dues: list[list[float]] = [[] for _ in range(threads)]
        for i in range(runs):
            dues[i % threads].append(base + spread * i / runs)
        async with LoopMonitor() as mon:
            elapsed = await _schedule(states, dues)
            overran = max(0.0, time.time() - base)
            done = await _until_done(rt, lags, runs, lead + spread + 600)
    finally:
        await _stop(rt, folder)
    last_due = base + spread * (runs - 1) / runs
    return Phase(
        schedule_rate=runs / elapsed, lags=list(lags), max_stall=mon.max_stall,
        **_stall_fields(mon), peak_rss=mon.peak_rss, overran=overran,
        tail=done - last_due,
    )


PHASES = {"schedule": phase_schedule, "burst": phase_burst, "lag": phase_lag}


async def run_phase(name: str, *, isolated: bool, **params: Any) -> Phase:
    """Run a runtime phase here, or alone in a fresh interpreter (``isolated``).

    The phases the targets are judged on run isolated, so that their peak RSS is that of
    a process running only the workload (not of one that already ran the raw baselines
    and earlier phases, whose freed memory the allocator keeps), and no leftover thread
    of an earlier phase competes with them.
    """
    if not isolated:
        start_rss = _rss_bytes()
        phase = await PHASES[name](**params)
        phase.start_rss = start_rss
        phase.name = name
        return phase
    spec = json.dumps({"phase": name, **params}, default=str)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--child", spec,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"phase {name} failed in its own process (exit {proc.returncode})")
    return Phase(**json.loads(out))


async def _child(spec: str) -> None:
    start_rss = _rss_bytes()
    params = json.loads(spec)
    name = params.pop("phase")
    params["folder"] = Path(params["folder"])
    phase = await PHASES[name](**params)
    phase.start_rss = start_rss
    phase.name = name
    print(json.dumps(asdict(phase)))


# ------------------------------------------------------------------------- the run


@dataclass
class Case:
    """One thread count's figures, each a list with one value per repetition."""

    threads: int
    runs: int
    raw_insert: list[float] = field(default_factory=list)
    raw_execute: list[float] = field(default_factory=list)
    schedule: list[Phase] = field(default_factory=list)
    burst: list[Phase] = field(default_factory=list)
    lag: list[Phase] = field(default_factory=list)
    raw_lags: list[list[float]] = field(default_factory=list)


async def run_case(
    root: Path, threads: int, runs: int, opts: argparse.Namespace, *, with_lag: bool
) -> Case:
    """Measure one thread count, each raw baseline right before its runtime figure.

    With ``with_lag`` (the workload the targets are about) it also measures the lag, and
    each runtime phase runs in its own process; the 1-thread phases run in this one.
    """
    case = Case(threads, runs)
    workers = _worker_threads()
    for rep in range(opts.repeat):
        tag = f"t{threads}-r{rep}"
        _progress(f"{threads} thread(s), {runs} runs, repetition {rep + 1}/{opts.repeat}")
        case.raw_insert.append(await asyncio.to_thread(
            raw_insert_rate, root / f"raw-insert-{tag}", threads, runs, opts.synchronous,
            workers,
        ))
        common = {"threads": threads, "runs": runs, "synchronous": opts.synchronous}
        sched = await run_phase(
            "schedule", isolated=with_lag, folder=root / f"schedule-{tag}", **common
        )
        case.schedule.append(sched)
        # Room for scheduling to finish before the first run is due, with a margin.
        lead = runs / sched.schedule_rate * 1.5 + 0.5
        case.raw_execute.append(await asyncio.to_thread(
            raw_execute_rate, root / f"raw-execute-{tag}", threads, runs, opts.synchronous,
            workers,
        ))
        case.burst.append(await run_phase(
            "burst", isolated=with_lag, folder=root / f"burst-{tag}", lead=lead, **common
        ))
        if with_lag:
            case.raw_lags.append(await raw_lag(
                root / f"raw-lag-{tag}", threads, runs, opts.synchronous, workers, lead,
                opts.spread,
            ))
            case.lag.append(await run_phase(
                "lag", isolated=True, folder=root / f"lag-{tag}", lead=lead,
                spread=opts.spread, **common,
            ))
    return case


def _progress(message: str) -> None:
    print(f"… {message}", file=sys.stderr, flush=True)


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _spread_note(values: Sequence[float]) -> str:
    """`` (min..max)`` when there are several repetitions."""
    if len(values) < 2:
        return ""
    return f" ({min(values):.2f}..{max(values):.2f})"


@dataclass
class Context:
    """What the run measured about its surroundings, for the header."""

    bare_rss: int
    idle_stall: float
    load_before: tuple[float, float, float]


def report(one: Case, many: Case, opts: argparse.Namespace, ctx: Context, started: float) -> None:
    """Print the header block and the comparison table (Markdown)."""
    rows: list[tuple[str, ...]] = []

    def ratio_rows(case: Case, letter_sched: str, letter_exec: str, *, targets: bool) -> None:
        sched_ratios = [p.schedule_rate / r
                        for p, r in zip(case.schedule, case.raw_insert, strict=True)]
        exec_ratios = [p.execute_rate / r
                       for p, r in zip(case.burst, case.raw_execute, strict=True)]
        exec_ins_ratios = [p.execute_rate / r
                           for p, r in zip(case.burst, case.raw_insert, strict=True)]
        s, e, ei = _median(sched_ratios), _median(exec_ratios), _median(exec_ins_ratios)
        rows.append((
            f"{letter_sched}scheduled (raw: INSERT+COMMIT)", str(case.threads),
            _fmt_rate(_median([p.schedule_rate for p in case.schedule])),
            _fmt_rate(_median(case.raw_insert)), f"{s:.2f}{_spread_note(sched_ratios)}",
            "≥ 0.80" if targets else "", _verdict(s >= 0.8) if targets else "",
        ))
        rows.append((
            f"{letter_exec}executed, {case.runs:,} due at once (raw: claim+finish+COMMIT)",
            str(case.threads), _fmt_rate(_median([p.execute_rate for p in case.burst])),
            _fmt_rate(_median(case.raw_execute)), f"{e:.2f}{_spread_note(exec_ratios)}",
            "≥ 0.50" if targets else "", _verdict(e >= 0.5) if targets else "",
        ))
        rows.append((
            "executed, same figure (raw: INSERT+COMMIT)", str(case.threads),
            _fmt_rate(_median([p.execute_rate for p in case.burst])),
            _fmt_rate(_median(case.raw_insert)), f"{ei:.2f}{_spread_note(exec_ins_ratios)}",
            "", "",
        ))

    ratio_rows(one, "", "", targets=False)
    ratio_rows(many, "(a) ", "(c) ", targets=True)
    rate = many.runs / opts.spread
    def lag_cell(samples: list[list[float]], pct: float) -> str:
        values = [_percentile(lags, pct) for lags in samples]
        note = (f" ({min(values) * 1000:.1f}..{max(values) * 1000:.1f})"
                if len(values) > 1 else "")
        return _fmt_ms(_median(values)) + note

    lags = [p.lags for p in many.lag]
    p99 = _median([_percentile(x, 99) for x in lags])
    rows.append((f"(b) lag due→start p50, {rate:,.0f} runs/s due", str(many.threads),
                 lag_cell(lags, 50), lag_cell(many.raw_lags, 50), "", "", ""))
    rows.append((f"(b) lag due→start p99, {rate:,.0f} runs/s due", str(many.threads),
                 lag_cell(lags, 99), lag_cell(many.raw_lags, 99), "", "≤ 20 ms",
                 _verdict(p99 <= 0.020)))
    rows.append(("    lag max", str(many.threads), lag_cell(lags, 100),
                 lag_cell(many.raw_lags, 100), "", "", ""))
    rows.append(("    all finished, after the last due", str(many.threads),
                 _fmt_ms(_median([p.tail for p in many.lag])), "", "", "", ""))
    phases = many.schedule + many.burst + many.lag
    peak = max(p.peak_rss for p in phases)
    worst_phase = max(phases, key=lambda p: p.max_stall)
    rows.append(("(d) peak RSS (a process running only the phase)", str(many.threads),
                 f"{peak / MIB:.0f} MiB",
                 "", "", "≤ 100 MiB", _verdict(peak <= 100 * MIB)))
    rows.append(("(e) longest event-loop stall", str(many.threads),
                 _fmt_ms(worst_phase.max_stall), "", "", "≤ 50 ms",
                 _verdict(worst_phase.max_stall <= 0.050)))
    w = worst_phase
    where = f"CPU {_fmt_ms(w.stall_cpu)}"
    if w.stall_runqueue is not None and w.stall_other is not None:
        where += (f", waiting for a CPU {_fmt_ms(w.stall_runqueue)}, "
                  f"for the GIL etc. {_fmt_ms(w.stall_other)}")
    rows.append((f"    where the loop thread's time went in that gap ({w.name} phase)",
                 str(many.threads),
                 where, "", "", "", ""))

    load = " ".join(f"{x:.1f}" for x in ctx.load_before)
    print()
    print(f"thread-effects bench, {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}: "
          f"synchronous={opts.synchronous}, data in {opts.data_dir}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}")
    print(f"workload: {many.runs:,} no-op runs across {many.threads} threads (one file each); "
          f"1-thread rows: {one.runs:,} runs; lag rows: due evenly over {opts.spread:g} s; "
          f"raw baselines on at most {_worker_threads()} OS threads (anyio's limit); "
          f"{opts.repeat} repetition(s), medians"
          + (" (min..max)" if opts.repeat > 1 else ""))
    print(f"noise: load average {load} before, "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} after; "
          f"idle-loop stall {_fmt_ms(ctx.idle_stall)} before any work")
    start_rss = _median([p.start_rss for p in phases])
    print(f"RSS: bare interpreter {ctx.bare_rss / MIB:.0f} MiB, "
          f"after importing runtime {start_rss / MIB:.0f} MiB")
    print()
    print(TABLE_HEADER)
    print("|---|--:|--:|--:|--:|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    notes = []
    for case in (one, many):
        for name, phase_list in (("(c) burst", case.burst), ("(b) lag", case.lag)):
            for p in phase_list:
                if p.overran > 0:
                    notes.append(f"{case.threads} thread(s), {name}: scheduling ran "
                                 f"{p.overran:.2f} s past the first due time, so its "
                                 f"figures include scheduling work")
    if opts.synchronous != "FULL":
        notes.append("the targets are defined for synchronous=FULL")
    for note in notes:
        print(f"note: {note}")
    print(f"total time {time.perf_counter() - started:.1f} s")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=positive_int,
                        help="threads of the workload (default 100)")
    parser.add_argument("--runs", type=positive_int, help="runs of the workload (default 10000)")
    parser.add_argument("--runs-one", type=positive_int,
                        help="runs of the 1-thread figures (default 2000)")
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    parser.add_argument("--spread", type=nonnegative_float,
                        help="seconds over which the lag phase's runs are due (default 5)")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="repetitions; figures are medians (default 1)")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the databases go (the disk under test)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (10 threads, 1000 runs, 200 on 1 thread, 1 s spread)")
    opts = parser.parse_args(argv)
    defaults = (10, 1000, 200, 1.0) if opts.quick else (100, 10_000, 2000, 5.0)
    for name, default in zip(("threads", "runs", "runs_one", "spread"), defaults, strict=True):
        if getattr(opts, name) is None:
            setattr(opts, name, default)
    if opts.threads < 1 or opts.runs < opts.threads or opts.runs_one < 1 or opts.repeat < 1:
        parser.error("need threads >= 1, runs >= threads, runs-one >= 1, repeat >= 1")
    if not opts.spread > 0:
        parser.error("--spread must be > 0")
    return opts


async def main_async(opts: argparse.Namespace, bare_rss: int, started: float) -> None:
    load_before = os.getloadavg()
    async with LoopMonitor() as idle:
        await asyncio.sleep(0.5 if opts.quick else 1.0)
    ctx = Context(bare_rss, idle.max_stall, load_before)
    root = Path(tempfile.mkdtemp(prefix="thread-effects-bench-", dir=opts.data_dir))
    try:
        one = await run_case(root, 1, opts.runs_one, opts, with_lag=False)
        many = await run_case(root, opts.threads, opts.runs, opts, with_lag=True)
    finally:
        await asyncio.to_thread(shutil.rmtree, root, ignore_errors=True)
    report(one, many, opts, ctx, started)


def _bare_rss() -> int:
    """RSS of a fresh interpreter that imported nothing, for comparison."""
    code = (
        "import os; print(int(open('/proc/self/statm').read().split()[1])"
        " * os.sysconf('SC_PAGE_SIZE'))"
    )
    try:
        out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True,
                             text=True, check=True, timeout=30)
        return int(out.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def main(argv: Sequence[str] | None = None) -> None:
    started = time.perf_counter()
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) == 2 and args[0] == "--child":
        asyncio.run(_child(args[1]))
        return
    opts = parse_args(args)
    asyncio.run(main_async(opts, _bare_rss(), started))


if __name__ == "__main__":
    main()
