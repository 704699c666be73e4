"""What survives a real SIGKILL of a real process running the runtime."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.storage.sqlite import SQLiteRuntimeStore

CHILD = Path(__file__).parent / "_child.py"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def child_backend(monkeypatch: pytest.MonkeyPatch, backend_settings: dict[str, str]) -> None:
    """The children of a test marked every_backend use its backend (they read the variable)."""
    if "database_url" in backend_settings:
        monkeypatch.setenv("THREAD_EFFECTS_DATABASE_URL", backend_settings["database_url"])
        monkeypatch.setenv("THREAD_EFFECTS_NODE_ID", "node-1")
    else:
        monkeypatch.delenv("THREAD_EFFECTS_DATABASE_URL", raising=False)
        monkeypatch.delenv("THREAD_EFFECTS_NODE_ID", raising=False)
    if "synchronous" in backend_settings:
        monkeypatch.setenv("THREAD_EFFECTS_TEST_SYNCHRONOUS", backend_settings["synchronous"])
    else:
        monkeypatch.delenv("THREAD_EFFECTS_TEST_SYNCHRONOUS", raising=False)


def _start(data_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir), "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start_mode(data_dir: Path, mode: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"child exited ({proc.wait()}) before {prefix!r}: {err}")
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix!r} line within {timeout}s")


def _wait_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    _reap(proc)


def _reap(proc: subprocess.Popen[str]) -> str:
    """Wait for a process that was killed (or killed itself); return its stderr."""
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err
    return err


def _drain(data_dir: Path, thread_id: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, str(CHILD), str(data_dir), "drain", thread_id],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.every_backend
def test_sigkill_while_running_requeues_the_run_with_a_second_attempt(tmp_path: Path) -> None:
    proc = _start(tmp_path, "t1", "hang_once", "null", "0")
    _wait_line(proc, "SCHEDULED")
    _wait_file(tmp_path / "hang_once.started")
    _kill(proc)

    runs = _drain(tmp_path, "t1")

    assert len(runs) == 1
    assert runs[0]["status"] == "completed"
    assert runs[0]["attempts"] == 2
    assert (tmp_path / "hang_once.done").exists()


def test_sigkill_while_a_concurrent_run_runs_requeues_it(tmp_path: Path) -> None:
    # Its drain ended long before the kill (the run runs beside, in a task of its own):
    # the alarm row must still bring the thread back to re-queue it.
    proc = _start(tmp_path, "t1", "hang_once_beside", "null", "0")
    _wait_line(proc, "SCHEDULED")
    _wait_file(tmp_path / "hang_once_beside.started")
    time.sleep(0.5)  # past the alarm flusher's batching delay: the row is written by now
    _kill(proc)
    store = SQLiteRuntimeStore(tmp_path / "runtime.sqlite")
    try:
        alarms = dict(store.load_alarms())
    finally:
        store.close()
    assert "t1" in alarms  # a restart reopens the thread without anyone asking for it

    runs = _drain(tmp_path, "t1")

    assert [(r["status"], r["attempts"]) for r in runs] == [("completed", 2)]
    assert (tmp_path / "hang_once_beside.done").exists()


@pytest.mark.every_backend
def test_effect_that_kills_its_process_fails_after_the_third_attempt(tmp_path: Path) -> None:
    attempts_file = tmp_path / "kill_self.attempts"
    _reap(_start(tmp_path, "t1", "kill_self", "null", "0"))  # attempt 1 kills its process
    for _ in range(2):  # attempts 2 and 3: each restart re-queues and runs it again
        _reap(_start(tmp_path))

    runs = _drain(tmp_path, "t1")  # the third interruption is final: failed, not re-run

    assert attempts_file.read_text().count("x") == 3
    assert [r["status"] for r in runs] == ["failed"]
    assert runs[0]["attempts"] == 3
    assert "Interrupted 3 times" in str(runs[0]["error"])

    runs = _drain(tmp_path, "t1")  # and never queued again
    assert attempts_file.read_text().count("x") == 3
    assert [r["status"] for r in runs] == ["failed"]


@pytest.mark.every_backend
def test_run_scheduled_before_a_crash_runs_once_after_restart_past_due(tmp_path: Path) -> None:
    proc = _start(tmp_path, "t1", "record", json.dumps({"key": "k"}), "2")
    _wait_line(proc, "SCHEDULED")
    _kill(proc)  # right after schedule_effect returned
    due = time.time() + 2
    time.sleep(max(0.0, due - time.time()) + 0.2)

    runs = _drain(tmp_path, "t1")

    assert [(r["status"], r["attempts"]) for r in runs] == [("completed", 1)]
    lines = (tmp_path / "record.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["key"] == "k"
    # A second start has nothing left to do: still exactly one execution.
    _drain(tmp_path, "t1")
    assert len((tmp_path / "record.jsonl").read_text().splitlines()) == 1


def test_run_scheduled_on_a_warm_thread_before_a_crash_runs_once_after_restart(
    tmp_path: Path,
) -> None:
    # The thread drained just before: its alarm row stayed at that drain (it was not
    # removed), so the schedule committed only its run row before it returned.
    proc = _start_mode(tmp_path, "serve-warm", "t1", "record", json.dumps({"key": "k"}), "2")
    _wait_line(proc, "SCHEDULED")
    _kill(proc)  # right after schedule_effect returned
    due = time.time() + 2
    store = SQLiteRuntimeStore(tmp_path / "runtime.sqlite")
    try:
        alarms = dict(store.load_alarms())
    finally:
        store.close()
    assert alarms["t1"] < due - 1  # the row of the first drain, not moved to this run
    time.sleep(max(0.0, due - time.time()) + 0.2)

    runs = _drain(tmp_path, "t1")

    assert [(r["status"], r["attempts"]) for r in runs] == [("completed", 1)] * 2
    keys = [json.loads(line)["key"] for line in
            (tmp_path / "record.jsonl").read_text().splitlines()]
    assert keys == ["first", "k"]
    _drain(tmp_path, "t1")  # a second start has nothing left to do
    assert len((tmp_path / "record.jsonl").read_text().splitlines()) == 2


def test_second_process_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        _wait_line(proc, "READY")
        out = subprocess.run(
            [sys.executable, str(CHILD), str(tmp_path), "serve"],
            capture_output=True, text=True, timeout=30,
        )
        assert out.returncode != 0
        assert "is in use by pid" in out.stderr
        assert f"pid {proc.pid}" in out.stderr
    finally:
        _kill(proc)
    assert os.path.exists(tmp_path / "runtime.sqlite")


def test_sigkill_mid_delete_never_leaves_a_registered_thread_without_its_alarm(
    tmp_path: Path,
) -> None:
    # x's drain meets x being deleted, and the deletion is stuck behind another one: a
    # kill there keeps x registered, so its alarm row must still be there with it.
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path), "delete-while-opening"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _wait_line(proc, "READY")
    _kill(proc)

    conn = sqlite3.connect(tmp_path / "runtime.sqlite")
    try:
        registered = {r[0] for r in conn.execute("SELECT id FROM threads")}
        alarms = {r[0] for r in conn.execute("SELECT thread_id FROM alarms")}
    finally:
        conn.close()
    assert registered == {"x", "y"}
    assert "x" in alarms

    runs = _drain(tmp_path, "x")  # after the restart, its run is not lost

    assert [(r["status"], r["attempts"]) for r in runs] == [("completed", 1)]
