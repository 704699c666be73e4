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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_packages import demo_dist  # noqa: F401  (fixture: te-demo-pkg, pip-installed)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GUARD_SECONDS = 60.0


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
def servers(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*args: str, **env: str) -> ServerProcess:
        server = ServerProcess(tmp_path / "data", tmp_path / "server.log", *args, **env)
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


def test_json_logs_metrics_and_probes_of_a_server_process(
    servers: Callable[..., ServerProcess],
) -> None:
    server = servers("--shutdown-grace-seconds", "0.1", "--log-format", "json")
    assert httpx.get(f"{server.url}/api/health").json() == {"status": "ok"}
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
    monkeypatch: pytest.MonkeyPatch,
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
    with pytest.raises(SystemExit, match="THREAD_EFFECTS_LOAD_PACKAGES='maybe' is not a yes/no"):
        server.parse_args([])


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


def test_a_second_server_on_a_data_dir_in_use_says_so_in_one_line(
    servers: Callable[..., ServerProcess], tmp_path: Path
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
    assert len(locked) == 1 and "is in use by pid" in locked[0], output
    assert httpx.get(f"{first.url}/api/threads", timeout=5).status_code == 200


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
