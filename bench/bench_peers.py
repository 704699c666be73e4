"""The product's cases of the peers' benchmark and the SQLite floor's, in one run: PASS/MISS.

    .venv/bin/python bench/bench_peers.py [--peers-dir DIR] [--n 10000] [--lead-scale 1]
                                          [--no-fanout] [--no-cpu] [--out DIR]

Runs ``../shared/peers_bench`` (its README says what each case does): for each pair, the
floor's case (``peer_sqlite_floor.py``, stdlib ``sqlite3``: one INSERT+COMMIT per item,
WAL, one file per thread) right before the product's (``peer_thread_effects.py``, this
tree's ``runtime`` with this interpreter), so background load hits both alike:

| pair | floor case | product case |
|---|---|---|
| FULL, 100 threads | ``wal-full-file-per-thread@100`` | ``full-file-per-thread@100`` |
| FULL, 1 thread | ``wal-full-1file@1`` | ``full-file-per-thread@1`` |
| NORMAL, 100 threads | ``wal-normal-file-per-thread@100`` | ``normal-file-per-thread@100`` |
| burst (all due at once), FULL | ``wal-full-file-per-thread-burst@100`` | ``full-burst@100`` |

then ``bench/bench_fanout.py`` (200 WebSocket clients on one thread, FULL) and
``bench/bench_cpu.py`` (process CPU µs per no-op run, schedule + execute, ``NORMAL``), and
prints one Markdown table of issue 14's targets: the product's figure, the floor's, their
ratio and PASS/MISS. The runners' JSON goes to ``--out`` (default: a new temporary folder);
their databases to a private temporary folder (``PEERS_BENCH_DATA``). Needs no venv of
the other peers. About 3 to 4 minutes with the defaults (more on a loaded machine).
The rates are wall clock: on a machine busy with other work the floor itself swings
severalfold between runs (a line under the table says so when the load average was above
the number of CPUs); compare runs made on a quiet machine, or several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _args import positive_float, positive_int, source_tree  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = [
    ("FULL, 100 threads", "wal-full-file-per-thread@100", "full-file-per-thread@100"),
    ("FULL, 1 thread", "wal-full-1file@1", "full-file-per-thread@1"),
    ("NORMAL, 100 threads", "wal-normal-file-per-thread@100", "normal-file-per-thread@100"),
    ("burst, FULL, 100 threads", "wal-full-file-per-thread-burst@100", "full-burst@100"),
]


def _peers_dir(given: Path | None) -> Path:
    candidates = [given] if given else [
        ROOT.parent / "shared" / "peers_bench", ROOT.parent.parent / "shared" / "peers_bench",
    ]
    for path in candidates:
        if path is not None and (path / "harness.py").is_file():
            return path
    raise SystemExit(f"peers_bench not found (tried {', '.join(map(str, candidates))}); "
                     "pass --peers-dir")


def _runner(peers: Path, script: str, case: str, out: Path, opts: argparse.Namespace,
            data: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(peers / script), "--cases", case, "--out", str(out),
           "--n", str(opts.n), "--lead-scale", str(opts.lead_scale)]
    env = {**os.environ, "PEERS_BENCH_DATA": str(data), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(opts.source.resolve()), os.environ.get("PYTHONPATH")]))}
    print(f"{time.strftime('%H:%M:%S')} {script} {case}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=peers)
    if not out.is_file():
        raise SystemExit(f"{script} {case} wrote no result (rc {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    (result,) = doc["results"]
    if "error" in result:
        print(f"   {script} {case}: {result['error'][:500]}", file=sys.stderr)
    return dict(result)


def _json_line(cmd: list[str]) -> dict[str, Any]:
    print(f"{time.strftime('%H:%M:%S')} {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _num(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def table(pairs: dict[str, tuple[dict[str, Any], dict[str, Any]]], fanout: dict[str, Any] | None,
          cpu: dict[str, Any] | None, n: int, spread: float) -> str:
    """The Markdown table of the targets (issue 14) from the runners' results."""
    rows = ["| target | case | thread-effects | floor | ratio | target | result |",
            "|---|---|--:|--:|--:|---|---|"]

    def row(target: str, case: str, ours: Any, floor: Any, ratio: float | None, goal: str,
            ok: bool | None, digits: int = 0, unit: str = "") -> None:
        rows.append(f"| {target} | {case} | {_num(ours, digits, unit)} | "
                    f"{_num(floor, digits, unit)} | {_num(ratio, 2)} | {goal} | {_verdict(ok)} |")

    for label, (floor, ours) in pairs.items():
        if "error" in floor or "error" in ours:
            rows.append(f"| - | {label} | error | error |  |  | MISS |")
            continue
        sched = _ratio(ours.get("sched_rate"), floor.get("sched_rate"))
        execr = _ratio(ours.get("exec_rate"), floor.get("exec_rate"))
        p99, fp99 = ours.get("lag_ms_p99"), floor.get("lag_ms_p99")
        flags = ",".join(f for f in ("overlap", "missing", "lag_censored") if ours.get(f))
        case = label + (f" ({flags})" if flags else "")
        if label.startswith("FULL, 100"):
            row("1. scheduled/s, one caller", case, ours["sched_rate"], floor["sched_rate"],
                sched, "≥ 0.80", sched is not None and sched >= 0.8)
            row("2. executed/s", case, ours["exec_rate"], floor["exec_rate"], execr, "≥ 0.80",
                execr is not None and execr >= 0.8)
            # Issue 14: "at most 2x the floor's in the same run; on a disk that keeps up
            # with 2,000 commits/s, that is p99 <= 20 ms" - the floor's own p99 is then well
            # under a millisecond, so the bound is the larger of the two.
            row("2. lag p99", case, p99, fp99, _ratio(p99, fp99), "≤ max(2x floor, 20 ms)",
                p99 is not None and fp99 is not None and p99 <= max(2 * fp99, 20), 1, " ms")
        elif label.startswith("NORMAL"):
            due = n / spread
            row("3. executed/s (due/s: " + _num(due) + ")", case, ours["exec_rate"],
                floor["exec_rate"], execr, f"≥ {due * 0.95:,.0f} (keeps up)",
                ours["exec_rate"] >= 0.95 * due)
            # An absolute target: the floor's p99 is shown beside it, not divided by.
            row("3. lag p99", case, p99, fp99, None, "≤ 20 ms",
                p99 is not None and p99 <= 20, 1, " ms")
            row("   scheduled/s", case, ours["sched_rate"], floor["sched_rate"], sched, "", None)
        elif label.startswith("burst"):
            row("4. executed/s, all due at once", case, ours["exec_rate"], floor["exec_rate"],
                execr, "≥ 0.50", execr is not None and execr >= 0.5)
        else:
            row("   scheduled/s", case, ours["sched_rate"], floor["sched_rate"], sched, "", None)
            row("   executed/s", case, ours["exec_rate"], floor["exec_rate"], execr, "", None)
            row("   lag p99", case, p99, fp99, _ratio(p99, fp99), "", None, 1, " ms")
    if cpu is not None:
        us = cpu["exec_cpu_us"]
        row("3. CPU per run (schedule + execute, NORMAL)", "bench_cpu.py, 50 threads", us, None,
            None, "< 150 µs", us < 150, 0, " µs")
    if fanout is not None:
        ok = (fanout["ratio"] >= 0.8 and fanout["other"] == 0
              and fanout["complete"] + fanout["closed_1013"] == fanout["clients"])
        # The baseline is the product without clients (in the case column), not a floor.
        row(f"5. runs/s with {fanout['clients']} WebSocket clients (ratio: / without)",
            f"1 thread, {fanout['runs']} runs, {fanout['synchronous']}; without clients: "
            f"{_num(fanout['runs_per_second_alone'])}/s",
            fanout["runs_per_second_with_clients"], None,
            fanout["ratio"], "≥ 0.80, every frame or 1013", ok)
        row("5. delivered frames/s", f"{fanout['complete']} clients complete, "
            f"{fanout['closed_1013']} closed 1013", fanout["frames_per_second"], None, None,
            "≥ 20,000", fanout["frames_per_second"] >= 20_000)
    rss = [p[1].get("peak_rss_mib") for p in pairs.values() if "error" not in p[1]]
    stalls = [p[1].get("max_loop_stall_ms") for p in pairs.values() if "error" not in p[1]]
    rss_max = max((r for r in rss if r is not None), default=None)
    stall_max = max((s for s in stalls if s is not None), default=None)
    row("6. peak RSS (largest case)", "product cases", rss_max, None, None, "≤ 100 MiB",
        rss_max is not None and rss_max <= 100, 0, " MiB")
    row("6. longest loop stall (largest case)", "product cases", stall_max, None, None,
        "≤ 50 ms", stall_max is not None and stall_max <= 50, 1, " ms")
    return "\n".join(rows)


def main() -> None:
    """Run every pair, then the fan-out and CPU figures; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers-dir", type=Path, default=None)
    parser.add_argument("--n", type=positive_int, default=10_000)
    parser.add_argument("--lead-scale", type=positive_float, default=1.0)
    parser.add_argument("--no-fanout", action="store_true")
    parser.add_argument("--no-cpu", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="folder for the runners' JSON")
    parser.add_argument("--source", type=source_tree, default=ROOT,
                        help="the source tree whose runtime is measured (A/B against a checkout)")
    opts = parser.parse_args()
    peers = _peers_dir(opts.peers_dir)
    out = opts.out or Path(tempfile.mkdtemp(prefix="bench_peers_"))
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="peers_data_") as data:
        for label, floor_case, our_case in PAIRS:
            floor = _runner(peers, "peer_sqlite_floor.py", floor_case,
                            out / f"floor-{floor_case.replace('@', '-t')}.json", opts, Path(data))
            ours = _runner(peers, "peer_thread_effects.py", our_case,
                           out / f"te-{our_case.replace('@', '-t')}.json", opts, Path(data))
            results[label] = (floor, ours)
    source = str(opts.source.resolve())
    fanout = None if opts.no_fanout else _json_line(
        [sys.executable, str(ROOT / "bench" / "bench_fanout.py"), "--json", "--source", source])
    cpu = None if opts.no_cpu else _json_line(
        [sys.executable, str(ROOT / "bench" / "bench_cpu.py"), source])
    (out / "summary.json").write_text(json.dumps(
        {"pairs": results, "fanout": fanout, "cpu": cpu}, indent=1))
    load1 = os.getloadavg()
    print(f"{started}, source {opts.source.resolve()}, N = {opts.n}, load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after; {os.cpu_count()} CPUs; "
          f"results in {out}\n")
    print(table(results, fanout, cpu, opts.n, 5.0))
    busy = max(load0[0], load1[0])
    if busy > (os.cpu_count() or 1):
        print(f"\nThe load average reached {busy:.1f} on {os.cpu_count()} CPUs: other work "
              f"shared the machine, and wall-clock rates and ratios of this run are not "
              f"comparable with a quiet run's (the floor's own rates swing severalfold).")


if __name__ == "__main__":
    main()
