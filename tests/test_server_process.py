"""``python server.py`` as a real process: runs survive SIGKILL, SIGTERM re-queues, and an
exposed address without a token is refused.

The loops below poll the API until a state appears (with a generous bound against hangs);
they never assert how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import pytest
from test_packages import demo_dist  # noqa: F401  (fixture: te-demo-pkg, pip-installed)
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GUARD_SECONDS = 60.0

STORAGE_KINDS = ("sqlite", "postgres")
"""The backends of this module's every_backend tests: the server has no synchronous option."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """``python server.py`` with its output in a log file."""

    def __init__(self, data_dir: Path, log: Path, *args: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {
            **os.environ,
            "THREAD_EFFECTS_DATA_DIR": str(data_dir),
            "THREAD_EFFECTS_PORT": str(self.port),
            **env,
        }
        self.env.pop("THREAD_EFFECTS_API_TOKEN", None)
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "server.py", *self.args],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + GUARD_SECONDS
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server.py exited {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/api/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server.py did not start:\n{self.output()}"
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def signal(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=GUARD_SECONDS)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=GUARD_SECONDS)


@pytest.fixture
def servers(
    tmp_path: Path, backend_settings: dict[str, Any]
) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []
    backend_env = {}
    if "database_url" in backend_settings:
        backend_env["THREAD_EFFECTS_DATABASE_URL"] = backend_settings["database_url"]
        # One node id for every server a test starts: a restart after SIGKILL is the same
        # node and re-queues its runs at once (another node id waits out the lease).
        backend_env["THREAD_EFFECTS_NODE_ID"] = "node-1"

    def start(*args: str, **env: str) -> ServerProcess:
        server = ServerProcess(tmp_path / "data", tmp_path / "server.log", *args,
                               **{**backend_env, **env})
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def wait_for_run(
    url: str, tid: str, run_id: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    deadline = time.monotonic() + GUARD_SECONDS
    while True:
        run: dict[str, Any] = httpx.get(f"{url}/api/threads/{tid}/effects/{run_id}").json()
        if done(run):
            return run
        assert time.monotonic() < deadline, f"run never reached the state: {run}"
        time.sleep(0.05)


def schedule(url: str, tid: str, name: str, args: Any, delay: float = 0) -> str:
    res = httpx.post(
        f"{url}/api/threads/{tid}/effects",
        json={"name": name, "args": args, "delay_seconds": delay},
    )
    assert res.status_code == 201, res.text
    run_id: str = res.json()["id"]
    return run_id


@pytest.mark.every_backend
def test_runs_survive_sigkill(servers: Callable[..., ServerProcess], tmp_path: Path) -> None:
    first = servers()
    tid = httpx.post(f"{first.url}/api/threads", json={}).json()["id"]
    # One run killed while it works, one due shortly after the kill.
    working = schedule(first.url, tid, "slow_task", {"seconds": 1.5})
    due_later = schedule(first.url, tid, "send_reminder", {"text": "after the crash"}, 1.0)
    wait_for_run(first.url, tid, working, lambda r: r["status"] == "running")
    assert first.signal(signal.SIGKILL) == -signal.SIGKILL

    second = servers()
    run = wait_for_run(second.url, tid, working, lambda r: r["status"] == "completed")
    assert run["attempts"] == 2 and run["error"] is None
    run = wait_for_run(second.url, tid, due_later, lambda r: r["status"] == "completed")
    assert run["attempts"] == 1
    reminders = (tmp_path / "data" / "reminders" / f"{tid}.txt").read_text().splitlines()
    assert len(reminders) == 1 and reminders[0].endswith("after the crash")


@pytest.mark.every_backend
def test_sigkill_in_a_burst_keeps_every_outcome_a_client_saw(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # SQLite FULL (the server's default) commits a drain's outcomes in groups and holds
    # their frames until the group's flush: a client never sees an outcome that a crash
    # could take back, and every run still ends completed, at most once re-run.
    first = servers("--app-dir", CORE_APP, "--no-packages")
    tid = httpx.post(f"{first.url}/api/threads", json={}).json()["id"]
    assert httpx.post(f"{first.url}/api/threads/{tid}/pause").status_code == 200
    ids = [schedule(first.url, tid, "record", {"key": f"k{i}"}) for i in range(400)]
    seen: dict[str, tuple[str, int]] = {}  # run id -> (its last change received, attempts)
    url = f"ws://127.0.0.1:{first.port}/api/threads/{tid}/stream"
    with ws_connect(url, origin=None, open_timeout=GUARD_SECONDS) as ws:
        assert httpx.post(f"{first.url}/api/threads/{tid}/resume").status_code == 200
        while sum(change == "completed" for change, _ in seen.values()) < 50:
            frame = json.loads(ws.recv(timeout=GUARD_SECONDS))
            if frame["eventType"] == "effect_changed":
                seen[frame["data"]["id"]] = (frame["data"]["change"], frame["data"]["attempts"])
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)
        # What was on its way to this client before the kill is received too.
        with pytest.raises((ConnectionClosed, TimeoutError, OSError)):
            while True:
                frame = json.loads(ws.recv(timeout=GUARD_SECONDS))
                if frame["eventType"] == "effect_changed":
                    seen[frame["data"]["id"]] = (frame["data"]["change"],
                                                 frame["data"]["attempts"])
    assert first.proc.wait(timeout=GUARD_SECONDS) == -signal.SIGKILL
    completed_seen = {rid: a for rid, (change, a) in seen.items() if change == "completed"}
    assert len(completed_seen) >= 50

    second = servers("--app-dir", CORE_APP, "--no-packages")
    deadline = time.monotonic() + GUARD_SECONDS
    while True:
        runs = httpx.get(f"{second.url}/api/threads/{tid}/effects?limit=500").json()["runs"]
        if all(r["status"] == "completed" for r in runs):
            break
        assert time.monotonic() < deadline, [r for r in runs if r["status"] != "completed"]
        time.sleep(0.1)
    by_id = {r["id"]: r for r in runs}
    assert set(by_id) == set(ids)
    for rid, attempts in completed_seen.items():
        # Seen completed: completed in the store in that attempt, never run again.
        assert (by_id[rid]["status"], by_id[rid]["attempts"]) == ("completed", attempts)
    # A run interrupted by the kill ran once more; none reached the attempt limit.
    assert all(r["attempts"] in (1, 2) and r["error"] is None for r in runs)
    keys = [json.loads(line)["key"] for line in
            (tmp_path / "data" / "record.jsonl").read_text().splitlines()]
    assert set(keys) == {f"k{i}" for i in range(400)}


def test_sigterm_requeues_a_running_run(servers: Callable[..., ServerProcess]) -> None:
    first = servers("--shutdown-grace-seconds", "0.1")
    tid = httpx.post(f"{first.url}/api/threads", json={}).json()["id"]
    run_id = schedule(first.url, tid, "slow_task", {"seconds": 60})
    wait_for_run(first.url, tid, run_id, lambda r: r["status"] == "running")
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status says why.
    assert first.signal(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in first.output()

    # Re-queued, not failed: after the restart it starts again, as its second attempt.
    second = servers()
    run = wait_for_run(
        second.url, tid, run_id, lambda r: r["status"] == "running" and r["attempts"] == 2
    )
    assert run["error"] is None


CORE_APP = str(ROOT / "tests" / "apps" / "core")


def test_a_run_going_at_sigterm_finishes_and_schedules_its_follow_up(
    servers: Callable[..., ServerProcess],
) -> None:
    first = servers("--shutdown-grace-seconds", "10", "--app-dir", CORE_APP, "--no-packages")
    tid = httpx.post(f"{first.url}/api/threads", json={}).json()["id"]
    # Sleeps 2 s, then schedules itself again with a delay of 1 s (the follow-up run).
    run_id = schedule(first.url, tid, "again", {"seconds": 2, "delay": 1})
    wait_for_run(first.url, tid, run_id, lambda r: r["status"] == "running")
    time.sleep(0.5)  # SIGTERM in the middle of the run, not at its start
    assert first.signal(signal.SIGTERM) in (0, -signal.SIGTERM)

    second = servers("--app-dir", CORE_APP, "--no-packages")
    run = wait_for_run(second.url, tid, run_id, lambda r: r["status"] != "running")
    assert (run["status"], run["attempts"], run["error"]) == ("completed", 1, None)
    runs = httpx.get(f"{second.url}/api/threads/{tid}/effects?name=again").json()["runs"]
    follow_ups = [r for r in runs if r["id"] != run_id]
    assert len(follow_ups) >= 1, runs  # scheduled during the grace period, and kept


def test_the_requeued_frame_reaches_the_stream_before_it_closes(
    servers: Callable[..., ServerProcess],
) -> None:
    server = servers("--shutdown-grace-seconds", "0.1", "--app-dir", CORE_APP, "--no-packages")
    tid = httpx.post(f"{server.url}/api/threads", json={}).json()["id"]
    url = f"ws://127.0.0.1:{server.port}/api/threads/{tid}/stream"
    with ws_connect(url, origin=None, open_timeout=GUARD_SECONDS) as ws:
        run_id = schedule(server.url, tid, "slow", {"seconds": 60})
        wait_for_run(server.url, tid, run_id, lambda r: r["status"] == "running")
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        changes: list[tuple[str, str]] = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                frame = json.loads(ws.recv(timeout=GUARD_SECONDS))
                if frame["data"].get("id") == run_id:
                    changes.append((frame["data"]["status"], frame["data"]["attempts"]))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    assert changes[-1] == ("pending", 1), changes
    assert server.proc.wait(timeout=GUARD_SECONDS) in (0, -signal.SIGTERM)


def test_the_guard_stops_a_runaway_chain(servers: Callable[..., ServerProcess]) -> None:
    server = servers("--app-dir", CORE_APP, "--no-packages")
    tid = httpx.post(f"{server.url}/api/threads", json={}).json()["id"]
    runs_url = f"{server.url}/api/threads/{tid}/effects"
    schedule(server.url, tid, "runaway", None)  # schedules itself again with no delay
    deadline = time.monotonic() + GUARD_SECONDS
    while (counts := httpx.get(runs_url).json()["counts"])["failed"] == 0:
        assert time.monotonic() < deadline, f"the chain was not stopped: {counts}"
        time.sleep(0.05)
    assert counts["pending"] == 0 and counts["running"] == 0 and counts["completed"] >= 100
    [failed] = httpx.get(runs_url, params={"status": "failed"}).json()["runs"]
    assert failed["error"].startswith(f"TooManyImmediateRuns: Thread {tid}: ")
    assert "max_immediate_runs_per_second=100" in failed["error"]


def test_a_chain_is_paused_over_http_and_its_next_run_canceled(
    servers: Callable[..., ServerProcess],
) -> None:
    server = servers("--app-dir", CORE_APP, "--no-packages")
    tid = httpx.post(f"{server.url}/api/threads", json={}).json()["id"]
    runs_url = f"{server.url}/api/threads/{tid}/effects"
    # A chain with a short delay: never due long enough to be canceled while it runs.
    schedule(server.url, tid, "again", {"seconds": 0, "delay": 0.01})
    deadline = time.monotonic() + GUARD_SECONDS
    while httpx.get(runs_url).json()["counts"]["completed"] < 10:
        assert time.monotonic() < deadline, "the chain did not run"
        time.sleep(0.05)

    res = httpx.post(f"{server.url}/api/threads/{tid}/pause")
    assert res.status_code == 200 and res.json()["paused"] is True
    # The run going at the pause finishes; its follow-up stays pending, so it can be canceled.
    while True:
        counts = httpx.get(runs_url).json()["counts"]
        if counts["running"] == 0 and counts["pending"] == 1:
            break
        assert time.monotonic() < deadline, f"the chain did not stop: {counts}"
        time.sleep(0.05)
    [pending] = httpx.get(runs_url, params={"status": "pending"}).json()["runs"]
    res = httpx.post(f"{runs_url}/{pending['id']}/cancel")
    assert res.json() == {"canceled": True}
    counts = httpx.get(runs_url).json()["counts"]
    assert counts["pending"] == 0 and counts["canceled"] == 1 and counts["failed"] == 0
    assert httpx.get(f"{server.url}/api/threads/{tid}").json()["paused"] is True
@pytest.mark.every_backend
def test_json_logs_metrics_and_probes_of_a_server_process(
    servers: Callable[..., ServerProcess], storage_kind: str,
) -> None:
    server = servers("--shutdown-grace-seconds", "0.1", "--log-format", "json")
    assert httpx.get(f"{server.url}/api/health").json() == {
        "status": "ok",
        "backend": storage_kind,
        "databaseConnected": True if storage_kind == "postgres" else None,
        "nodeId": "node-1" if storage_kind == "postgres" else ANY,
    }
    tid = httpx.post(f"{server.url}/api/threads", json={}).json()["id"]
    run_id = schedule(server.url, tid, "slow_task", {"seconds": 60})
    wait_for_run(server.url, tid, run_id, lambda r: r["status"] == "running")
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "thread_effects_running_runs 1.0" in metrics
    assert 'thread_effects_run_attempts_total{effect="slow_task"} 1.0' in metrics
    assert server.signal(signal.SIGTERM) in (0, -signal.SIGTERM)

    lines = [json.loads(line) for line in server.output().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    runs = [line for line in lines if line["logger"] == "runtime.runs"]
    assert [line["change"] for line in runs] == ["scheduled", "started", "requeued"]
    started = runs[1]
    assert (started["thread_id"], started["run_id"], started["effect"]) == (
        tid, run_id, "slow_task"
    )
    assert started["status"] == "running" and started["attempt"] == 1
    assert isinstance(started["lag_seconds"], float) and started["lag_seconds"] >= 0
    said = [line["message"] for line in lines if line["logger"] == "runtime"]
    assert any(
        m.startswith("shutting down: waiting up to 0.1 s for 1 running run(s): slow_task")
        and run_id in m for m in said
    ), said
    assert any(m.startswith("shutdown: 1 interrupted run(s) re-queued") and run_id in m
               for m in said), said


def test_demo_webhook_posts_to_the_server_itself(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = servers("--api-token", "tok")
    auth = {"Authorization": "Bearer tok"}
    tid = httpx.post(f"{server.url}/api/threads", json={}, headers=auth).json()["id"]
    res = httpx.post(
        f"{server.url}/api/threads/{tid}/effects",
        json={"name": "post_webhook", "args": {"payload": {"hello": "world"}}},
        headers=auth,
    )
    run_id = res.json()["id"]
    closed = free_port()  # nothing listens there: the run fails with a clear error
    res = httpx.post(
        f"{server.url}/api/threads/{tid}/effects",
        json={"name": "post_webhook", "args": {"url": f"http://127.0.0.1:{closed}/hook"}},
        headers=auth,
    )
    failing = res.json()["id"]

    def get(rid: str) -> dict[str, Any]:
        deadline = time.monotonic() + GUARD_SECONDS
        while True:
            run: dict[str, Any] = httpx.get(
                f"{server.url}/api/threads/{tid}/effects/{rid}", headers=auth
            ).json()
            if run["status"] in ("completed", "failed"):
                return run
            assert time.monotonic() < deadline
            time.sleep(0.05)

    assert get(run_id)["status"] == "completed"
    inbox = (tmp_path / "data" / "webhook-inbox.jsonl").read_text()
    assert f'"threadId":"{tid}"' in inbox and '"hello":"world"' in inbox
    run = get(failing)
    assert run["status"] == "failed"
    assert run["error"].startswith(f"WebhookError: POST http://127.0.0.1:{closed}/hook failed")


def test_an_exposed_address_without_a_token_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "THREAD_EFFECTS_API_TOKEN"}
    done = subprocess.run(
        [sys.executable, "server.py", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=GUARD_SECONDS,
    )
    assert done.returncode == 2
    assert "without an API token" in done.stderr and "THREAD_EFFECTS_API_TOKEN" in done.stderr
    assert not (tmp_path / "runtime.sqlite").exists()


def test_no_packages_and_its_variable_switch_package_effects_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import server
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.delenv("THREAD_EFFECTS_LOAD_PACKAGES", raising=False)
    assert server.parse_args([]).load_packages is True
    assert server.parse_args(["--no-packages"]).load_packages is False
    monkeypatch.setenv("THREAD_EFFECTS_LOAD_PACKAGES", "0")
    assert server.parse_args([]).load_packages is False
    monkeypatch.setenv("THREAD_EFFECTS_LOAD_PACKAGES", "maybe")
    with pytest.raises(SystemExit) as exited:
        server.parse_args([])
    assert exited.value.code == 2
    assert "THREAD_EFFECTS_LOAD_PACKAGES='maybe' is not a yes/no" in capsys.readouterr().err


def test_a_bad_value_from_a_variable_is_reported_under_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import server
    finally:
        sys.path.remove(str(ROOT))
    for variable, value, reason in [
        ("THREAD_EFFECTS_PORT", "eighty", "port must be 1..65535, got 'eighty'"),
        ("THREAD_EFFECTS_LEASE_SECONDS", "0.1", "lease must be a number of seconds"),
        ("THREAD_EFFECTS_DATABASE_URL", "mysql://x", "database URL must begin with"),
        ("THREAD_EFFECTS_EFFECT_TOOL_LEASE_SECONDS", "soon",
         "effect tool lease must be a number of seconds above 0, at most 86400, got 'soon'"),
    ]:
        monkeypatch.setenv(variable, value)
        with pytest.raises(SystemExit) as exited:
            server.parse_args([])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"error: {variable}: {reason}" in err, err
        assert "argument --" not in err
        monkeypatch.delenv(variable)
    # The same bad value given as the option is still reported as the option.
    monkeypatch.setenv("THREAD_EFFECTS_PORT", "8000")
    with pytest.raises(SystemExit):
        server.parse_args(["--port", "eighty"])
    assert "argument --port: port must be 1..65535" in capsys.readouterr().err
    # A bad option given on the command line with its variable also set names the option.
    monkeypatch.setenv("THREAD_EFFECTS_PORT", "eighty")
    with pytest.raises(SystemExit):
        server.parse_args(["--port=seventy"])
    assert "argument --port: port must be 1..65535, got 'seventy'" in capsys.readouterr().err


@pytest.mark.usefixtures("demo_dist")
def test_a_server_with_no_packages_lists_no_package_effects(
    servers: Callable[..., ServerProcess],
) -> None:
    def names(server: ServerProcess) -> set[str]:
        return {e["name"] for e in httpx.get(f"{server.url}/api/effects").json()["effects"]}

    with_packages = servers()
    assert any(n.startswith("te_demo/") for n in names(with_packages))
    with_packages.signal(signal.SIGTERM)
    assert not any("/" in n for n in names(servers("--no-packages")))


@pytest.mark.every_backend
def test_a_second_server_on_a_data_dir_in_use_says_so_in_one_line(
    servers: Callable[..., ServerProcess], tmp_path: Path, storage_kind: str
) -> None:
    first = servers()
    env = {**first.env, "THREAD_EFFECTS_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "server.py"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=GUARD_SECONDS,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    locked = [line for line in output.splitlines() if "DataDirLocked" in line]
    held_by = ("is in use by pid" if storage_kind == "sqlite"
               else "node id node-1 is in use by another live process")
    assert len(locked) == 1 and held_by in locked[0], output
    assert httpx.get(f"{first.url}/api/threads", timeout=5).status_code == 200


@pytest.mark.parametrize("storage_kind", ["postgres"])
def test_a_second_node_joins_a_database_and_runs_its_threads_runs(
    servers: Callable[..., ServerProcess], storage_kind: str,
) -> None:
    """On PostgreSQL a second server with another node id shares the threads."""
    first = servers()
    second = servers(THREAD_EFFECTS_NODE_ID="node-2")
    health = httpx.get(f"{second.url}/api/health").json()
    assert health["nodeId"] == "node-2" and health["databaseConnected"] is True
    assert httpx.get(f"{first.url}/api/health").json()["nodeId"] == "node-1"
    tid = httpx.post(f"{first.url}/api/threads", json={}).json()["id"]
    run_id = schedule(second.url, tid, "slow_task", {"seconds": 0})
    run = wait_for_run(first.url, tid, run_id, lambda r: r["status"] == "completed")
    assert [a["nodeId"] for a in run["attemptDetails"]] in (["node-1"], ["node-2"])


def test_a_busy_port_is_reported_before_the_data_dir_is_made(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        data_dir = tmp_path / "fresh"
        env = {k: v for k, v in os.environ.items() if not k.startswith("THREAD_EFFECTS_")}
        done = subprocess.run(
            [sys.executable, "server.py", "--port", str(port), "--data-dir", str(data_dir)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=GUARD_SECONDS,
        )
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not data_dir.exists()


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--shutdown-grace-seconds", "-1"], {}, "--shutdown-grace-seconds"),
        (["--shutdown-grace-seconds", "nan"], {}, "--shutdown-grace-seconds"),
        (["--shutdown-grace-seconds", "inf"], {}, "--shutdown-grace-seconds"),
        (["--shutdown-grace-seconds", "1e400"], {}, "--shutdown-grace-seconds"),
        ([], {"THREAD_EFFECTS_SHUTDOWN_GRACE_SECONDS": "nan"},
         "THREAD_EFFECTS_SHUTDOWN_GRACE_SECONDS:"),
        (["--log-level", "bogus"], {}, "--log-level"),
        ([], {"THREAD_EFFECTS_LOG_LEVEL": "bogus"}, "THREAD_EFFECTS_LOG_LEVEL:"),
        (["--log-format", "xml"], {}, "--log-format"),
        ([], {"THREAD_EFFECTS_LOG_FORMAT": "xml"}, "THREAD_EFFECTS_LOG_FORMAT:"),
        (["--port", "0"], {}, "--port"),
        (["--effect-tool-lease-seconds", "-5"], {}, "--effect-tool-lease-seconds"),
        (["--effect-tool-lease-seconds", "0"], {}, "--effect-tool-lease-seconds"),
        (["--effect-tool-lease-seconds", "nan"], {}, "--effect-tool-lease-seconds"),
        ([], {"THREAD_EFFECTS_EFFECT_TOOL_LEASE_SECONDS": "nan"},
         "THREAD_EFFECTS_EFFECT_TOOL_LEASE_SECONDS:"),
        ([], {"THREAD_EFFECTS_LOAD_PACKAGES": "maybe"}, "THREAD_EFFECTS_LOAD_PACKAGES="),
        (["--database-url", "mysql://u:secret@h/db"], {}, "--database-url"),
        ([], {"THREAD_EFFECTS_DATABASE_URL": "sqlite:///x.db"}, "THREAD_EFFECTS_DATABASE_URL:"),
        (["--port", "\u0665"], {}, "--port"),
        (["--api-token", "t\u00f8ken"], {}, "--api-token"),
        ([], {"THREAD_EFFECTS_API_TOKEN": "bad\ntoken"}, "THREAD_EFFECTS_API_TOKEN:"),
    ],
)
def test_a_bad_option_is_one_line_before_anything_is_made(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    data_dir = tmp_path / "fresh"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THREAD_EFFECTS_")}
    done = subprocess.run(
        [sys.executable, "server.py", "--data-dir", str(data_dir), *args],
        cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=GUARD_SECONDS,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "tøken" not in done.stderr and "bad\ntoken" not in done.stderr  # never printed
    assert "secret" not in done.stderr  # nor a database URL's password
    assert not data_dir.exists()


def test_a_data_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THREAD_EFFECTS_")}
    done = subprocess.run(
        [sys.executable, "server.py", "--data-dir", str(tmp_path / "file" / "data"),
         "--port", str(free_port())],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=GUARD_SECONDS,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("server.py: cannot create data directory"), done.stderr
    assert done.stderr.count("\n") == 1


EFFECT_TOOLS_APP = ROOT / "tests" / "apps" / "effect_tools"


def wait_until(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + GUARD_SECONDS
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_a_server_killed_between_execute_and_record_applies_nothing_on_the_retried_turn(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    world, hang = tmp_path / "world.txt", tmp_path / "hang"
    hang.touch()
    env = {"NOTES_WORLD": str(world), "NOTES_HANG_FILE": str(hang)}
    options = ("--app-dir", str(EFFECT_TOOLS_APP), "--no-packages")
    # An hour's lease: the restarted server must not wait it out (it knows the holder is
    # gone: one process per data directory) and would give up waiting after 60 s.
    first = servers(*options, "--effect-tool-lease-seconds", "3600", **env)
    tid = httpx.post(f"{first.url}/api/threads", json={"agent_id": "notes"}).json()["id"]
    ask = {"content": "post a note about release: Shipped 1.2"}

    def send(url: str) -> None:
        with pytest.raises(httpx.TransportError):  # the server dies under the turn
            httpx.post(f"{url}/api/threads/{tid}/messages", json=ask, timeout=GUARD_SECONDS)

    sender = threading.Thread(target=send, args=(first.url,))
    sender.start()
    # The note is in the world; the call hangs before its result is recorded.
    wait_until("the note was written", lambda: world.exists() and world.read_text())
    wait_until("APPLIED", lambda: "APPLIED" in first.output())
    held = httpx.get(f"{first.url}/api/threads/{tid}/effect-records").json()["records"]
    assert [(r["key"], r["status"], r["result"]) for r in held] == [
        ("note:release", "in_progress", None)
    ]
    lease = datetime.fromisoformat(held[0]["leaseExpiresAt"]) - datetime.fromisoformat(
        held[0]["createdAt"])
    assert lease == timedelta(hours=1)
    assert first.signal(signal.SIGKILL) == -signal.SIGKILL
    sender.join(GUARD_SECONDS)

    hang.unlink()
    second = servers(*options, **env)
    # The restarted server resumes the interrupted turn by itself; the client sends the
    # message again under the turn's run id and gets that turn's answer.
    [interrupted] = httpx.get(f"{second.url}/api/threads/{tid}/turns").json()["turns"]
    res = httpx.post(f"{second.url}/api/threads/{tid}/messages",
                     json={**ask, "run_id": interrupted["runId"]}, timeout=GUARD_SECONDS)
    assert res.status_code == 200, res.text
    # The resumed turn took over the dead call's key, asked already_applied, which found
    # the note by its marker: nothing was applied twice.
    assert len(world.read_text().splitlines()) == 1
    records = httpx.get(f"{second.url}/api/threads/{tid}/effect-records").json()["records"]
    assert [(r["key"], r["status"], r["result"]) for r in records] == [
        ("note:release", "applied", {"note": 1, "reconciled": True})
    ]
    tool_results = [r for m in res.json()["messages"] for r in m.get("toolResults", [])]
    assert [r["isError"] for r in tool_results] == [False]
    # Deleting the thread deletes its records.
    assert httpx.delete(f"{second.url}/api/threads/{tid}").status_code == 200
    assert httpx.get(f"{second.url}/api/threads/{tid}/effect-records").status_code == 404


def test_the_demo_agent_posts_a_note_once_to_the_inbox(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = servers("--no-packages")
    tid = httpx.post(f"{server.url}/api/threads", json={}).json()["id"]
    res = httpx.post(f"{server.url}/api/threads/{tid}/messages",
                     json={"content": "post a note about release: Shipped 1.2"},
                     timeout=GUARD_SECONDS)
    assert res.status_code == 200, res.text
    assert res.json()["reply"]["content"] == "Posted your note about release to the inbox."
    inbox = [json.loads(line) for line in
             (tmp_path / "data" / "webhook-inbox.jsonl").read_text().splitlines()]
    [record] = httpx.get(f"{server.url}/api/threads/{tid}/effect-records").json()["records"]
    assert record["toolName"] == "post_note" and record["status"] == "applied"
    assert record["key"] == f"{res.json()['runId']}:note:release"
    assert [(e["threadId"], e["topic"]) for e in inbox] == [(tid, "release")]
    assert inbox[0]["note"] == f"Shipped 1.2 <!-- thread-effects:effect={record['key']} -->"
    # The inbox answers the tool's search by marker.
    found = httpx.get(f"{server.url}/demo/webhook",
                      params={"contains": f"effect={record['key']}"}).json()
    assert found == {"entries": inbox}


DURABLE_APP = ROOT / "tests" / "apps" / "durable_turns"


def test_a_turn_killed_after_its_tool_completes_by_itself_after_restart(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    world, hang = tmp_path / "world.txt", tmp_path / "hang"
    hang.touch()
    env = {"SHOP_WORLD": str(world), "SHOP_HANG_FILE": str(hang)}
    options = ("--app-dir", str(DURABLE_APP), "--no-packages")
    first = servers(*options, **env)
    tid = httpx.post(f"{first.url}/api/threads", json={"agent_id": "shop"}).json()["id"]
    ask = {"content": "charge order 42", "run_id": "order-42"}

    def send() -> None:
        with pytest.raises(httpx.TransportError):  # the server dies under the turn
            httpx.post(f"{first.url}/api/threads/{tid}/messages", json=ask,
                       timeout=GUARD_SECONDS)

    sender = threading.Thread(target=send)
    sender.start()
    # The card is charged and the call journaled; the model's next step hangs.
    wait_until("CHARGED", lambda: "CHARGED" in first.output())
    assert world.read_text().splitlines() == ["charged order 42"]
    assert first.signal(signal.SIGKILL) == -signal.SIGKILL
    sender.join(GUARD_SECONDS)

    hang.unlink()
    second = servers(*options, **env)

    def turn() -> dict[str, Any] | None:
        turns = httpx.get(f"{second.url}/api/threads/{tid}/turns").json()["turns"]
        return turns[0] if turns and turns[0]["status"] != "running" else None

    # Nobody posts again: the restarted server resumes the turn by itself.
    done = wait_until("the turn was resumed", turn)
    assert (done["runId"], done["status"], done["attempts"], done["resumed"]) == (
        "order-42", "succeeded", 2, True
    )
    assert world.read_text().splitlines() == ["charged order 42"]
    messages = httpx.get(f"{second.url}/api/threads/{tid}/messages").json()["messages"]
    said = [(m["role"], m["content"]) for m in messages if m["role"] != "tool" and m["content"]]
    assert said == [("user", "charge order 42"), ("assistant", "Done: order 42 charged.")]
    # Posted again (the client lost the answer): the same turn, its stored answer.
    again = httpx.post(f"{second.url}/api/threads/{tid}/messages", json=ask,
                       timeout=GUARD_SECONDS)
    assert again.status_code == 200, again.text
    assert again.json()["reply"]["content"] == "Done: order 42 charged."
    assert [m["id"] for m in again.json()["messages"]] == [m["id"] for m in messages]
    assert world.read_text().splitlines() == ["charged order 42"]


def test_a_turn_open_at_sigterm_gets_the_grace_period_then_a_json_503(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    world, hang = tmp_path / "world.txt", tmp_path / "hang"
    hang.touch()
    server = servers("--app-dir", str(DURABLE_APP), "--no-packages",
                     "--shutdown-grace-seconds", "1",
                     SHOP_WORLD=str(world), SHOP_HANG_FILE=str(hang))
    tid = httpx.post(f"{server.url}/api/threads", json={"agent_id": "shop"}).json()["id"]
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(httpx.post(f"{server.url}/api/threads/{tid}/messages",
                                  json={"content": "charge order 7", "run_id": "order-7"},
                                  timeout=GUARD_SECONDS))

    sender = threading.Thread(target=send)
    sender.start()
    wait_until("CHARGED", lambda: "CHARGED" in server.output())
    # The turn outlives the grace period: it is interrupted, and its request answers.
    assert server.signal(signal.SIGTERM) in (0, -signal.SIGTERM)
    sender.join(GUARD_SECONDS)
    assert len(answers) == 1
    res = answers[0]
    assert res.status_code == 503, res.text
    assert res.json()["error"]["code"] == "shutting_down"
    assert res.headers["retry-after"] == "5"
    assert "timeout graceful shutdown exceeded" not in server.output()
    assert "still open after the 1s grace period" in server.output()


SLOW_REMINDER = '''
import asyncio
from pydantic import BaseModel, Field
from runtime import ThreadState, define_tool

class SetReminder(BaseModel):
    text: str
    delay_seconds: float = Field(ge=0)

async def set_reminder(state: ThreadState, args: SetReminder) -> dict:
    await asyncio.sleep(1.5)  # SIGTERM arrives meanwhile
    run_id = await state.schedule_effect("note", {"text": args.text}, args.delay_seconds)
    return {"scheduled": True, "run_id": run_id}

tool = define_tool("Sets a reminder, slowly.", SetReminder, set_reminder)
'''


def test_a_turn_going_at_sigterm_finishes_within_the_grace_period(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    app = tmp_path / "app"
    for folder in ("agents", "tools", "effects"):
        (app / folder).mkdir(parents=True)
    (app / "agents" / "bot.py").write_text(
        "from runtime import define_agent\n\n"
        "agent = define_agent('bot', 'You set reminders.', tools=['set_reminder'])\n"
    )
    (app / "tools" / "set_reminder.py").write_text(SLOW_REMINDER)
    (app / "effects" / "note.py").write_text(
        (ROOT / "tests" / "apps" / "server_app" / "effects" / "note.py").read_text()
    )
    server = servers("--app-dir", str(app), "--shutdown-grace-seconds", "10")
    tid = httpx.post(f"{server.url}/api/threads", json={}).json()["id"]
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(httpx.post(
            f"{server.url}/api/threads/{tid}/messages",
            json={"content": "remind me in 100 seconds to stretch"}, timeout=GUARD_SECONDS,
        ))

    turn = threading.Thread(target=send)
    turn.start()
    time.sleep(0.4)  # SIGTERM while the tool sleeps, inside the turn
    server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    turn.join(GUARD_SECONDS)
    assert server.proc.wait(timeout=GUARD_SECONDS) in (0, -signal.SIGTERM)  # type: ignore[union-attr]
    [answer] = answers
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert "stretch" in body["reply"]["content"]
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "user" and roles[-1] == "assistant" and len(roles) >= 4

    # After the restart: the turn's messages and the effect its tool scheduled are there.
    again = servers("--app-dir", str(app))
    stored = httpx.get(f"{again.url}/api/threads/{tid}/messages").json()["messages"]
    assert [m["id"] for m in stored] == [m["id"] for m in body["messages"]]
    runs = httpx.get(f"{again.url}/api/threads/{tid}/effects").json()
    listed = runs["runs"] if isinstance(runs, dict) else runs
    assert [(r["name"], r["status"]) for r in listed] == [("note", "pending")]


def _occurrences(url: str, tid: str, sid: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = httpx.get(
        f"{url}/api/threads/{tid}/effects", params={"limit": 500}
    ).json()["runs"]
    return [r for r in runs if r["scheduleId"] == sid]


def _wait_occurrences(url: str, tid: str, sid: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + GUARD_SECONDS
    while True:
        done = [r for r in _occurrences(url, tid, sid) if r["status"] == "completed"]
        if len(done) >= count:
            return done
        assert time.monotonic() < deadline, f"only {len(done)} occurrences completed"
        time.sleep(0.1)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_schedule_survives_sigkill_with_no_lost_or_doubled_occurrence(
    servers: Callable[..., ServerProcess],
) -> None:
    first = servers()
    tid = httpx.post(f"{first.url}/api/threads", json={}).json()["id"]
    res = httpx.post(f"{first.url}/api/threads/{tid}/schedules", json={
        "name": "send_reminder", "args": {"text": "tick"}, "every_seconds": 1,
    })
    assert res.status_code == 201, res.text
    sid, anchor = res.json()["id"], _ts(res.json()["createdAt"])
    before = _wait_occurrences(first.url, tid, sid, 3)
    killed_at = time.time()
    assert first.signal(signal.SIGKILL) == -signal.SIGKILL
    time.sleep(2.5)  # down across at least two fire times

    second = servers()
    back_at = time.time()
    _wait_occurrences(second.url, tid, sid, len(before) + 3)
    schedule = httpx.get(f"{second.url}/api/threads/{tid}/schedules/{sid}").json()
    runs = _occurrences(second.url, tid, sid)
    fires = sorted(_ts(r["runAt"]) for r in runs)

    # Never doubled: one run per fire time, each on the schedule's grid.
    assert len(fires) == len(set(fires)) == schedule["occurrences"]
    steps = [round(f - anchor) for f in fires]
    assert all(abs(f - anchor - k) < 1e-3 for f, k in zip(fires, steps, strict=True))
    # Never lost: every fire time up to the last one is a run, a counted skip (its
    # previous occurrence still ran), or lies in the outage, which made at most one run.
    outage = [k for k in range(1, steps[-1]) if killed_at < anchor + k < back_at]
    missing = [k for k in range(1, steps[-1]) if k not in steps and k not in outage]
    assert len(missing) <= schedule["skipped"], (missing, schedule)
    assert len([k for k in steps if k in outage]) <= 1, (steps, outage)
    assert len(outage) >= 2
    # Each ran: completed, at most the one killed mid-run with a second attempt.
    finished = [r for r in runs if r["status"] != "pending"]
    assert all(r["status"] in ("completed", "running") for r in finished)
    assert sum(r["attempts"] == 2 for r in runs) <= 1


def test_a_server_switched_to_postgresql_warns_of_the_sqlite_threads_it_does_not_serve(
    servers: Callable[..., ServerProcess], pg_url: str,
) -> None:
    sqlite = servers()
    assert httpx.post(f"{sqlite.url}/api/threads", json={"id": "s1"}).status_code == 201
    schedule(sqlite.url, "s1", "send_reminder", {"text": "later"}, delay=3600)
    sqlite.signal(signal.SIGTERM)
    assert "SQLite thread file" not in sqlite.output()

    switched = servers(THREAD_EFFECTS_DATABASE_URL=pg_url, THREAD_EFFECTS_NODE_ID="node-1")
    warned = [line for line in switched.output().splitlines() if "SQLite thread file" in line]
    assert len(warned) == 1, switched.output()
    assert "holds 1 SQLite thread file(s); with --database-url they are not served" in warned[0]
    assert "WARNING" in warned[0]
    assert httpx.get(f"{switched.url}/api/threads/s1").status_code == 404
