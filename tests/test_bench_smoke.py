"""The benchmark runs end to end in --quick mode. No timing is asserted (docs/design.md:
performance is measured by bench/, never by timed tests)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg import SERVER_URL as PG_SERVER

ROOT = Path(__file__).resolve().parent.parent
HEADER = "| figure | threads | thread-effects | raw sqlite3 | ratio | target | result |"


def test_bench_quick_runs_and_prints_the_table(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "bench_effects.py"), "--quick",
            "--threads", "3", "--runs", "60", "--runs-one", "20", "--spread", "0.3",
            "--data-dir", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert HEADER in result.stdout
    assert "(b) lag due→start p99" in result.stdout
    # The benchmark cleans up its databases.
    assert list(tmp_path.iterdir()) == []


def test_bench_effect_tools_quick_runs_and_prints_the_table(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_effect_tools.py"), "--quick",
         "--calls", "20", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| tool call | wall µs/call | overhead (wall) | CPU µs/call | overhead (CPU) |" in (
        result.stdout)
    for row in ("| plain |", "| effect, first application (sqlite) |",
                "| effect, recorded hit (memory) |", "| effect, first application (thread store) |",
                "| effect, recorded hit (thread store) |"):
        assert row in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_bench_durable_quick_runs_and_prints_the_tables(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_durable.py"), "--quick",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| turn | wall µs/step | overhead (wall) | CPU µs/step | overhead (CPU) |" in (
        result.stdout)
    for row in ("| agent.run (no journal) |", "| run_durable, SqliteJournal |",
                "| resume (replay 10 steps, 1 model request) |"):
        assert row in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("client", ["websockets", "raw"])
def test_bench_fanout_small_runs_and_every_client_gets_every_frame(client: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_fanout.py"), "--clients", "5",
         "--runs", "30", "--synchronous", "NORMAL", "--json", "--client", client, "--reads"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    # Real uvicorn, real clients: each got all 3 frames of each run, the same bytes.
    assert (figures["complete"], figures["closed_1013"], figures["other"]) == (5, 0, 0)
    assert figures["identical"] is True
    assert figures["runs_per_second_alone"] > 0 and figures["frames_per_second"] > 0
    # The prober (a process of its own) read the busy thread's runs, every read a 200.
    assert figures["reads"]["alone"]["n"] >= 1 and figures["reads"]["with_clients"]["n"] >= 1


def test_bench_schedule_wait_prints_both_cases_with_commit_counts() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_schedule_wait.py"),
         "--threads", "2", "--runs", "6", "--synchronous", "NORMAL"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["case"] for line in lines] == ["idle", "stream"]
    idle, stream = lines
    assert idle["schedules"] == 6 and stream["schedules"] == 120
    # No schedule commits an alarm row of its own: a thread's row is written with the
    # thread, and stays while the thread is warm (it drained a moment ago).
    assert idle["lower_alarm"] == 0
    assert stream["lower_alarm"] == 0


def test_bench_disk_counts_one_fsync_per_schedule_on_both_sides() -> None:
    import shutil

    import pytest

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_disk.py"), "--n", "40", "--threads", "4",
         "--lead", "3", "--strace-lead", "8", "--spread", "0.2"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    if result.returncode != 0 and "PTRACE" in result.stderr.upper():
        pytest.skip("strace cannot trace here")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    phases = {(line["side"], line["phase"]): line for line in lines if "phase" in line}
    assert set(phases) == {(side, phase) for side in ("floor", "product")
                           for phase in ("schedule", "execute")}
    # The caller waits for one fsync'd commit of the thread's file per schedule, and
    # the alarm index adds none (the floor: one per schedule, one per finished run).
    assert phases["floor", "schedule"]["thread-wal"]["syncs_per_run"] == 1.0
    assert phases["floor", "execute"]["thread-wal"]["syncs_per_run"] == 1.0
    assert phases["product", "schedule"]["thread-wal"]["syncs_per_run"] == 1.0
    timing = next(line["timing"] for line in lines if "timing" in line)
    assert "lower_alarm" not in timing["runtime_store_calls_schedule"]
    assert timing["schedule_effect"]["p50_us"] > 0


def test_bench_postgres_small_runs_and_prints_the_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_postgres.py"), "--runs", "60",
         "--threads", "3", "--spread", "0.3", "--processes", "1,3", "--json",
         "--peers", "none", "--callers", "4"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| figure | processes | thread-effects | raw psycopg | ratio | target | result |" in (
        result.stdout)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["raw"]["autocommit"] > 0
    [one] = [case for case in figures["cases"] if case["processes"] == 1
             and "callers" not in case]
    assert one["executed"] == 60  # every run ran, once
    # The same with 4 concurrent callers per process, beside a raw baseline of 4 connections.
    [four] = [case for case in figures["cases"] if case.get("callers") == 4
              and case["processes"] == 1]
    assert four["executed"] == 60
    assert figures["raw"]["autocommit_callers"] > 0
    assert "| scheduled | 1 x 4 callers |" in result.stdout
    assert one["commits_per_run"] >= 1  # at least each run's own schedule
    assert "| lag due→start p99 | 1 |" in result.stdout
    assert "| database commits per run, whole case | 1 |" in result.stdout
    assert figures["peers"] == []


def test_bench_pg_claims_small_runs_every_run_and_counts_its_commits() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_pg_claims.py"), "--runs", "60",
         "--threads", "3", "--workers", "4", "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "60 runs over 3 threads, 4 workers:" in result.stdout
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["runs_per_second"] > 0 and figures["cpu_per_run"] > 0
    # A call per run and per thread, at most a commit each (fewer when grouped), and the
    # backend's own opening and closing (about 20).
    assert 0 < figures["commits_per_run"] < 2
    # The raw two-statement baseline ran every run too; the server's CPU is read from /proc
    # (the test server runs on this machine).
    assert "raw claim + finish, same table and workers:" in result.stdout
    assert figures["raw"]["runs_per_second"] > 0 and figures["raw"]["cpu_per_run"] > 0
    assert figures["server_cpu_per_run"] is not None and figures["server_cpu_per_run"] >= 0


def test_bench_pg_exec_small_runs_every_run_and_counts_its_statements() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_pg_exec.py"), "--runs", "60",
         "--threads", "3", "--spread", "0.5", "--count", "--server-url", PG_SERVER,
         "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "60 of 60 runs over 3 threads due over 0.5 s:" in result.stdout
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["executed"] == 60  # every run ran, once
    assert figures["runs_per_second"] > 0 and figures["cpu_us_per_run"] > 0
    # The claims' transactions were counted: at least a commit per two runs (a claim
    # transaction finishes one run and claims the next, or groups several threads').
    statements = figures["statements_per_run"]
    assert statements.get("COMMIT", 0) > 0


def test_bench_pg_writes_small_inserts_and_indexes_every_run_per_round() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_pg_writes.py"), "--runs", "50",
         "--threads", "5", "--rounds", "2", "--server-url", PG_SERVER, "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "50 runs over 5 threads, one caller, 2 rounds" in result.stdout
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert list(figures) == [str(ROOT)]
    rounds = figures[str(ROOT)]
    assert [r["indexed"] for r in rounds] == [50, 50]
    assert all(r["inserts_per_s"] > 0 and r["index_rows_per_s"] > 0 for r in rounds)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_bench_schedule_floor_small_prints_every_way_against_the_floor(backend: str) -> None:
    extra = ["--postgres", PG_SERVER] if backend == "postgres" else []
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_schedule_floor.py"), "--rounds", "2",
         "--chunk", "20", "--threads", "4", "--json", *extra],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    ways = figures["ways"]
    expected = {"floor", "asyncio-inline", "asyncio-hop", "product"}
    if backend == "postgres":
        expected.add("asyncio-async")
    assert set(ways) == expected and figures["backend"] == backend
    assert ways["floor"]["ratio"] == 1.0
    assert all(w["rate"] > 0 and w["cpu_us_per_call"] > 0 for w in ways.values())


def test_bench_postgres_skips_a_peer_without_its_venv_and_says_how_to_make_it(
        tmp_path: Path) -> None:
    # A peers_bench folder of its own: the checkout may live anywhere (a CI clone has no
    # ../shared next to it).
    peers = tmp_path / "peers_bench"
    peers.mkdir()
    (peers / "harness.py").write_text("")
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_postgres.py"), "--runs", "20",
         "--threads", "2", "--spread", "0.2", "--processes", "1", "--json",
         "--peers", "procrastinate,dbos", "--peers-venvs", str(tmp_path),
         "--peers-dir", str(peers)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert [p["peer"] for p in figures["peers"]] == ["procrastinate", "dbos"]
    for peer, venv in (("procrastinate", "venv-proc"), ("dbos", "venv-dbos")):
        [row] = [p for p in figures["peers"] if p["peer"] == peer]
        assert str(tmp_path / venv) in row["skipped"] and "setup.sh" in row["skipped"]
        assert f"| {peer} (" in result.stdout
    assert "| thread-effects (1 process) |" in result.stdout


def test_bench_commits_prints_a_line_per_thread_count_and_a_drain_writes_four_pages() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_commits.py"), "--threads", "1,2",
         "--runs", "40", "--synchronous", "NORMAL"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["threads"] for line in lines] == [1, 2]
    for line in lines:
        assert set(line) == {"threads", "synchronous", "floor", "insert", "drain"}
        # Thread schema 9: a finish + claim writes the run's row and index pages and one
        # run_attempts page (4 pages of 4 KiB plus WAL frame headers), where schema 8
        # wrote 6 (the attempt's rowid table and key index, the pending-key index).
        assert line["drain"]["written_kib"] < 20, line
        assert line["insert"]["written_kib"] < 24, line


def _two_free_ports() -> int:
    """A port that is free, and so is the next one."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


def test_bench_blink_small_runs_two_nodes_and_prints_the_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_blink.py"), "--blinks", "1",
         "--outage", "1", "--port", str(_two_free_ports())],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for row in ("| slowest call after a blink (schedule, thread, ready) |",
                "| cancel through node 2 right after node 1's bus cut |",
                "| /api/ready 200 after the database opened |"):
        assert row in result.stdout
