"""``thread-effects`` against real ``server.py`` processes: every command, as a table and as
``--json``, and its failures (unknown thread or run, wrong state, server down, bad token).

The commands run in this process through Click's runner (each one a real HTTP client of the
server process); the console script and ``thread-effects serve`` run as processes too.
Loops poll the API until a state appears; nothing asserts how long anything took.
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from test_server_process import GUARD_SECONDS, ROOT, ServerProcess, free_port

from runtime.cli import TOKEN_ENV, URL_ENV, cli

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "thread-effects"


@pytest.fixture(autouse=True, scope="module")
def console_script() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} is missing: pip install -e . installs the console script"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("cli-server")
    proc = ServerProcess(root / "data", root / "server.log").start()
    try:
        yield proc
    finally:
        proc.stop()


def te(
    url: str,
    *args: str,
    token: str | None = None,
    input: str | None = None,
    columns: int | None = None,
) -> Result:
    """Run ``thread-effects <args>`` against ``url``; never a traceback, whatever happens."""
    env = {URL_ENV: url, TOKEN_ENV: token, "COLUMNS": str(columns) if columns else None}
    result = CliRunner().invoke(
        cli, list(args), env=env, input=input, prog_name="thread-effects"
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception, result.output,
    )
    assert "Traceback" not in result.output
    return result


def ok(url: str, *args: str, **kwargs: Any) -> str:
    result = te(url, *args, **kwargs)
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result.stdout


def ok_json(url: str, *args: str, **kwargs: Any) -> Any:
    return json.loads(ok(url, *args, "--json", **kwargs))


def next_page(url: str, table: str, what: str) -> list[str]:
    """Run the "more <what>: ..." hint of a table as it is; its JSON answer's ids."""
    (hint,) = [line for line in table.splitlines() if line.startswith(f"more {what}: ")]
    command = hint.removeprefix(f"more {what}: ").removesuffix(" (or --all)")
    words = shlex.split(command)
    assert words[0] == "thread-effects"
    return [item["id"] for item in ok_json(url, *words[1:])[what]]


def new_thread(url: str, **body: Any) -> dict[str, Any]:
    res = httpx.post(f"{url}/api/threads", json=body)
    assert res.status_code == 201, res.text
    thread: dict[str, Any] = res.json()
    return thread


def schedule(url: str, tid: str, name: str, args: Any = None, delay: float = 0) -> str:
    res = httpx.post(
        f"{url}/api/threads/{tid}/effects",
        json={"name": name, "args": args, "delay_seconds": delay},
    )
    assert res.status_code == 201, res.text
    run_id: str = res.json()["id"]
    return run_id


def a_schedule(url: str, tid: str, **body: Any) -> dict[str, Any]:
    res = httpx.post(f"{url}/api/threads/{tid}/schedules",
                     json={"name": "send_reminder", "args": {"text": "tick"}, **body})
    assert res.status_code == 201, res.text
    made: dict[str, Any] = res.json()
    return made


def wait_for(url: str, tid: str, run_id: str, done: Callable[[dict[str, Any]], bool]) -> None:
    deadline = time.monotonic() + GUARD_SECONDS
    while True:
        run = httpx.get(f"{url}/api/threads/{tid}/effects/{run_id}").json()
        if done(run):
            return
        assert time.monotonic() < deadline, f"run never reached the state: {run}"
        time.sleep(0.05)


def finished(run: dict[str, Any]) -> bool:
    return run["status"] in ("completed", "failed", "canceled")


def a_thread_with_runs(url: str) -> tuple[str, dict[str, str]]:
    """A thread with one completed, one failed and one pending run (due in an hour)."""
    tid = new_thread(url, user_id="ann", tags=["vip", "[bold]not markup"])["id"]
    runs = {
        "completed": schedule(url, tid, "send_reminder", {"text": "stretch"}),
        "failed": schedule(url, tid, "fail_on_purpose", {"reason": "no [red]luck"}),
        "pending": schedule(url, tid, "send_reminder", {"text": "later"}, delay=3600),
    }
    wait_for(url, tid, runs["completed"], finished)
    wait_for(url, tid, runs["failed"], finished)
    return tid, runs


# ---------------------------------------------------------------------------- threads


def test_threads_list_as_a_table_and_as_json(server: ServerProcess) -> None:
    first = new_thread(server.url, user_id="ann", tags=["vip", "[bold]not markup"])
    second = new_thread(server.url, agent_id="assistant")

    table = ok(server.url, "threads", "list")
    assert "Thread" in table and "Created (UTC)" in table
    row = next(line for line in table.splitlines() if first["id"] in line)
    assert "ann" in row and "vip, [bold]not markup" in row  # user text, not Rich markup
    assert second["id"] in table

    listed = ok_json(server.url, "threads", "list")
    by_id = {t["id"]: t for t in listed["threads"]}
    for made in (first, second):  # as created, with when it last did something
        listed_one = dict(by_id[made["id"]])
        assert listed_one.pop("lastActivityAt") >= made["createdAt"]
        assert listed_one == made
    assert listed["nextCursor"] is None

    one = ok_json(server.url, "threads", "list", "--limit", "1")
    assert len(one["threads"]) == 1 and one["nextCursor"]
    assert (
        "more threads: thread-effects threads list --sort activity --limit 1 --cursor "
        f"{shlex.quote(one['nextCursor'])} (or --all)"
    ) in ok(server.url, "threads", "list", "--limit", "1", columns=300)
    rest = ok_json(server.url, "threads", "list", "--cursor", one["nextCursor"])
    assert one["threads"][0] not in rest["threads"]
    every = ok_json(server.url, "threads", "list", "--limit", "1", "--all")
    assert every == {"threads": listed["threads"], "nextCursor": None}
    assert ok_json(server.url, "threads", "list", "--all") == every


def test_threads_list_filters_and_sorts_by_last_activity(server: ServerProcess) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    older = new_thread(server.url, user_id=user, tags=["cli-filter"])
    newer = new_thread(server.url, user_id=user)
    new_thread(server.url, user_id="someone-else", tags=["cli-filter"])
    # The older thread does something: it goes first by activity, second by creation.
    schedule(server.url, older["id"], "send_reminder", {"text": "later"}, delay=3600)

    mine = ok_json(server.url, "threads", "list", "--user", user)
    assert [t["id"] for t in mine["threads"]] == [older["id"], newer["id"]]
    assert mine["threads"][0]["lastActivityAt"] > older["createdAt"]
    created = ok_json(server.url, "threads", "list", "--user", user, "--sort", "created")
    assert [t["id"] for t in created["threads"]] == [newer["id"], older["id"]]
    tagged = ok_json(server.url, "threads", "list", "--user", user, "--tag", "cli-filter")
    assert [t["id"] for t in tagged["threads"]] == [older["id"]]
    assert ok_json(server.url, "threads", "list", "--user", user, "--agent", "nobody") == {
        "threads": [], "nextCursor": None
    }
    # Paged one at a time, in the same order.
    walked = ok_json(server.url, "threads", "list", "--user", user, "--limit", "1", "--all")
    assert walked == {"threads": mine["threads"], "nextCursor": None}
    # The hint to the next page repeats the filters and the sort: run as it is, it goes on.
    for sort, order in (("activity", mine), ("created", created)):
        first = ok(server.url, "threads", "list", "--user", user, "--sort", sort,
                   "--limit", "1", columns=300)
        assert f"--sort {sort} --user {user} --limit 1 --cursor '{sort}:" in first
        assert next_page(server.url, first, "threads") == [order["threads"][1]["id"]]

    table = ok(server.url, "threads", "list", "--user", user, "--tag", "cli-filter")
    assert "Last activity (UTC)" in table and older["id"] in table
    assert newer["id"] not in table
    assert ok(server.url, "threads", "list", "--user", user, "--agent", "nobody").strip() == (
        "No threads."
    )
    bad = te(server.url, "threads", "list", "--sort", "recent")
    assert bad.exit_code == 2 and "recent" in bad.output


def test_threads_show(server: ServerProcess) -> None:
    tid, runs = a_thread_with_runs(server.url)

    shown = ok_json(server.url, "threads", "show", tid)
    assert shown["thread"]["id"] == tid and shown["thread"]["userId"] == "ann"
    assert shown["thread"]["lastActivityAt"] > shown["thread"]["createdAt"]
    assert shown["counts"] == {
        "pending": 1, "running": 0, "completed": 1, "failed": 1, "canceled": 0,
    }
    assert [r["id"] for r in shown["runs"]] == [
        runs["pending"], runs["failed"], runs["completed"],
    ]

    table = ok(server.url, "threads", "show", tid)
    assert f"Thread         {tid}" in table and "User           ann" in table
    last = shown["thread"]["lastActivityAt"].replace("T", " ")[:19]
    assert f"Last activity  {last}" in table
    assert "pending 1  running 0  completed 1  failed 1  canceled 0" in table
    failed_row = next(line for line in table.splitlines() if runs["failed"] in line)
    assert "fail_on_purpose" in failed_row and "DemoFailure: no [red]luck" in failed_row

    few = ok(server.url, "threads", "show", tid, "--runs", "1")
    assert runs["pending"] in few and runs["completed"] not in few
    assert f"1 of 3 runs shown; thread-effects runs list --thread {tid}" in few


def test_threads_show_lists_the_threads_schedules(server: ServerProcess) -> None:
    tid = new_thread(server.url)["id"]
    assert ok_json(server.url, "threads", "show", tid)["schedules"] == []
    assert "Schedules      0" in ok(server.url, "threads", "show", tid)
    made = a_schedule(server.url, tid, cron="0 9 * * 1-5", timezone="Europe/Istanbul")
    shown = ok_json(server.url, "threads", "show", tid)
    assert [s["id"] for s in shown["schedules"]] == [made["id"]]
    table = ok(server.url, "threads", "show", tid)
    assert "Schedules      1" in table
    row = next(line for line in table.splitlines() if line.startswith(made["id"]))
    assert "send_reminder" in row and "cron 0 9 * * 1-5 (Europe/Istanbul)" in row
    assert "active" in row


def test_threads_delete_asks_first(server: ServerProcess) -> None:
    tid = new_thread(server.url)["id"]

    declined = te(server.url, "threads", "delete", tid, input="n\n")
    assert declined.exit_code == 1
    assert "not deleted (confirm, or pass --yes)" in declined.stderr
    unanswered = te(server.url, "threads", "delete", tid)  # no input: a script, not a person
    assert unanswered.exit_code == 1 and "not deleted" in unanswered.stderr
    assert ok_json(server.url, "threads", "show", tid)["thread"]["id"] == tid

    assert ok(server.url, "threads", "delete", tid, input="y\n") == f"Deleted thread {tid}.\n"
    gone = te(server.url, "threads", "show", tid)
    assert gone.exit_code == 1
    assert gone.stderr == (
        f"thread-effects: Thread not found: {tid} [HTTP 404 thread_not_found]\n"
    )

    other = new_thread(server.url)["id"]
    assert ok_json(server.url, "threads", "delete", other, "--yes") == {"deleted": True}
    again = te(server.url, "threads", "delete", other, "--yes", "--json")
    assert again.exit_code == 1 and again.stdout == ""
    assert json.loads(again.stderr) == {"error": {
        "code": "thread_not_found", "message": f"Thread not found: {other}", "status": 404,
    }}


# ------------------------------------------------------------------------------- runs


def test_runs_list_with_the_api_filters(server: ServerProcess) -> None:
    tid, runs = a_thread_with_runs(server.url)

    table = ok(server.url, "runs", "list", "--thread", tid)
    header = table.splitlines()[0].split()
    assert header[:3] == ["Run", "Effect", "Status"] and "Attempts" in header
    for status, run_id in runs.items():
        row = next(line for line in table.splitlines() if run_id in line)
        assert f" {status} " in row
    assert "DemoFailure: no [red]luck" in table
    assert "pending 1  running 0  completed 1  failed 1  canceled 0" in table

    page = ok_json(server.url, "runs", "list", "-t", tid)
    assert [r["id"] for r in page["runs"]] == [
        runs["pending"], runs["failed"], runs["completed"],
    ]
    assert "args" not in page["runs"][0] and page["nextCursor"] is None

    failed = ok_json(server.url, "runs", "list", "-t", tid, "--status", "failed")
    assert [r["id"] for r in failed["runs"]] == [runs["failed"]]
    both = ok_json(
        server.url, "runs", "list", "-t", tid, "--status", "failed", "--status", "pending"
    )
    assert {r["id"] for r in both["runs"]} == {runs["failed"], runs["pending"]}
    named = ok_json(server.url, "runs", "list", "-t", tid, "--name", "send_reminder")
    assert {r["id"] for r in named["runs"]} == {runs["completed"], runs["pending"]}
    assert named["counts"]["failed"] == 0  # the counts follow the name filter

    # A narrow terminal: columns go (Started first), long text is cut, ids stay whole.
    for columns, gone in ((120, ["Started"]), (80, ["Started", "Duration", "Attempts", "Due"])):
        narrow = ok(server.url, "runs", "list", "-t", tid, columns=columns)
        assert all(len(line) <= columns for line in narrow.splitlines()), narrow
        head = narrow.splitlines()[0]
        assert head.split()[:3] == ["Run", "Effect", "Status"] and "Error" in head
        assert not any(word in head for word in gone)
        assert all(run_id in narrow for run_id in runs.values())
        assert "DemoFailure: no" in narrow and "…" in narrow

    assert "No runs match." in ok(server.url, "runs", "list", "-t", tid, "--name", "nothing")
    one = ok(server.url, "runs", "list", "-t", tid, "--limit", "1", columns=300)
    assert f"more runs: thread-effects runs list --thread {tid} --limit 1 --cursor " in one
    assert next_page(server.url, one, "runs") == [runs["failed"]]
    filtered = ok(server.url, "runs", "list", "--user", "ann", "--status", "failed",
                  "--status", "completed", "--limit", "1", columns=300)
    assert "--status failed --status completed --user ann --limit 1 --cursor" in filtered
    assert next_page(server.url, filtered, "runs") == [runs["completed"]]
    every = ok_json(server.url, "runs", "list", "-t", tid, "--limit", "1", "--all")
    assert [r["id"] for r in every["runs"]] == [r["id"] for r in page["runs"]]

    bad = te(server.url, "runs", "list", "-t", tid, "--status", "done")
    assert bad.exit_code == 2 and "'done' is not one of" in bad.stderr
    # Without --thread (or with --user, --tag, --since, --until): across every thread.
    across = ok_json(server.url, "runs", "list", "--status", "failed", "--all")
    assert runs["failed"] in {r["id"] for r in across["runs"]}
    assert all(r["status"] == "failed" for r in across["runs"]) and across["complete"]
    mine = ok_json(server.url, "runs", "list", "--thread", tid, "--user", "ann",
                   "--tag", "vip")
    assert [r["id"] for r in mine["runs"]] == [
        runs["pending"], runs["failed"], runs["completed"],
    ]
    assert mine["counts"]["failed"] == 1
    soon = (datetime.now(UTC) + timedelta(minutes=30)).isoformat()  # pending: in an hour
    assert [r["id"] for r in ok_json(server.url, "runs", "list", "-t", tid,
                                      "--since", soon)["runs"]] == [runs["pending"]]
    wide = ok(server.url, "runs", "list", "--user", "ann", columns=200)
    head = wide.splitlines()[0].split()
    assert head[:3] == ["Run", "Thread", "Effect"]
    row = next(line for line in wide.splitlines() if runs["failed"] in line)
    assert tid in row and " failed " in row
    assert "No runs match." in ok(server.url, "runs", "list", "--user", "nobody-at-all")
    bad_time = te(server.url, "runs", "list", "--since", "yesterday")
    assert bad_time.exit_code == 1 and "ISO 8601" in bad_time.stderr
    unknown = te(server.url, "runs", "list", "-t", "nobody")
    assert unknown.exit_code == 1
    assert "Thread not found: nobody [HTTP 404 thread_not_found]" in unknown.stderr
    over = te(server.url, "runs", "list", "-t", tid, "--limit", "501")
    assert over.exit_code == 2 and "1<=x<=500" in over.stderr  # refused before any request

    # --replayed / --not-replayed: across threads, as GET /api/runs?replayed= answers.
    replay = ok_json(server.url, "runs", "replay", runs["failed"], "-t", tid)
    wait_for(server.url, tid, replay["id"], lambda r: r["status"] in ("completed", "failed"))
    replayed = ok_json(server.url, "runs", "list", "-t", tid, "--replayed")
    assert [r["id"] for r in replayed["runs"]] == [runs["failed"]]
    not_yet = ok_json(server.url, "runs", "list", "-t", tid, "--not-replayed")
    assert runs["failed"] not in {r["id"] for r in not_yet["runs"]}
    assert replay["id"] in {r["id"] for r in not_yet["runs"]}
    hint = ok(server.url, "runs", "list", "-t", tid, "--not-replayed", "--limit", "1",
              columns=300)
    assert "--not-replayed --limit 1 --cursor" in hint
    assert len(next_page(server.url, hint, "runs")) == 1


def test_runs_show(server: ServerProcess) -> None:
    tid, runs = a_thread_with_runs(server.url)

    run = ok_json(server.url, "runs", "show", runs["failed"], "--thread", tid)
    assert run["status"] == "failed" and run["args"] == {"reason": "no [red]luck"}
    assert run["error"] == "DemoFailure: no [red]luck" and run["attempts"] == 1

    table = ok(server.url, "runs", "show", runs["pending"], "-t", tid)
    assert f"Run        {runs['pending']}" in table
    assert "Status     pending" in table and "Started    -" in table
    assert '"text": "later"' in table

    failed = ok(server.url, "runs", "show", runs["failed"], "-t", tid, columns=200)
    assert "Error      DemoFailure: no [red]luck" in failed
    # Each attempt, with how it ended.
    assert [(a["attempt"], a["outcome"]) for a in run["attemptDetails"]] == [(1, "failed")]
    head = next(line for line in failed.splitlines() if "Attempt" in line and "Outcome" in line)
    assert head.split()[:1] == ["Attempt"]
    row = failed.splitlines()[failed.splitlines().index(head) + 1:][0:3]
    assert any(" failed " in line and "DemoFailure" in line for line in row), failed

    unknown = te(server.url, "runs", "show", "f" * 32, "-t", tid)
    assert unknown.exit_code == 1
    assert f"Run not found: {'f' * 32}" in unknown.stderr and "HTTP 404" in unknown.stderr


def test_runs_cancel(server: ServerProcess) -> None:
    tid, runs = a_thread_with_runs(server.url)
    other = schedule(server.url, tid, "send_reminder", {"text": "x"}, delay=3600)

    assert ok(server.url, "runs", "cancel", runs["pending"], "-t", tid) == (
        f"Canceled run {runs['pending']}.\n"
    )
    again = te(server.url, "runs", "cancel", runs["pending"], "-t", tid)
    assert again.exit_code == 1
    assert f"run {runs['pending']} is canceled, not pending: nothing canceled" in again.stderr
    assert ok_json(server.url, "runs", "cancel", other, "-t", tid) == {"canceled": True}
    done = te(server.url, "runs", "cancel", runs["completed"], "-t", tid, "--json")
    assert done.exit_code == 1 and json.loads(done.stdout) == {"canceled": False}
    assert json.loads(done.stderr)["error"]["code"] == "not_canceled"
    statuses = ok_json(server.url, "runs", "list", "-t", tid, "--status", "canceled")
    assert {r["id"] for r in statuses["runs"]} == {runs["pending"], other}


def test_runs_run_now(server: ServerProcess) -> None:
    tid, runs = a_thread_with_runs(server.url)
    later = schedule(server.url, tid, "send_reminder", {"text": "soon"}, delay=3600)

    assert ok(server.url, "runs", "run-now", runs["pending"], "-t", tid) == (
        f"Run {runs['pending']} is due now (pending).\n"
    )
    # Run-now of a run waiting behind a running one is refused (409): let the first end.
    wait_for(server.url, tid, runs["pending"], lambda r: r["status"] == "completed")
    assert ok_json(server.url, "runs", "run-now", later, "-t", tid) == {
        "id": later, "status": "pending",
    }
    wait_for(server.url, tid, later, lambda r: r["status"] == "completed")

    refused = te(server.url, "runs", "run-now", runs["completed"], "-t", tid)
    assert refused.exit_code == 1
    assert "only a pending run can be run now [HTTP 409 run_state_conflict]" in refused.stderr


def test_runs_replay(server: ServerProcess) -> None:
    tid, runs = a_thread_with_runs(server.url)

    said = ok(server.url, "runs", "replay", runs["failed"], "-t", tid)
    assert said.startswith(f"Replayed run {runs['failed']} as run ")
    first = said.strip().rstrip(".").rsplit(" ", 1)[1]
    second = ok_json(server.url, "runs", "replay", runs["completed"], "-t", tid)["id"]
    for new, old in ((first, runs["failed"]), (second, runs["completed"])):
        wait_for(server.url, tid, new, finished)
        replayed = ok_json(server.url, "runs", "show", new, "-t", tid)
        assert replayed["replayOf"] == old

    refused = te(server.url, "runs", "replay", runs["pending"], "-t", tid, "--json")
    assert refused.exit_code == 1
    error = json.loads(refused.stderr)["error"]
    assert error["code"] == "run_state_conflict" and error["status"] == 409
    assert "only a finished run" in error["message"]


# ---------------------------------------------------------------------------- effects


# -------------------------------------------------------------------------- schedules


def test_schedules_list_and_show(server: ServerProcess) -> None:
    tid = new_thread(server.url)["id"]
    assert ok(server.url, "schedules", "list", "-t", tid) == "No schedules.\n"
    assert ok_json(server.url, "schedules", "list", "-t", tid) == {"schedules": []}
    daily = a_schedule(server.url, tid, cron="30 8 * * *", timezone="Europe/Berlin",
                       key="digest")
    hourly = a_schedule(server.url, tid, every_seconds=3600)

    listed = ok_json(server.url, "schedules", "list", "--thread", tid)["schedules"]
    assert [s["id"] for s in listed] == [daily["id"], hourly["id"]]
    table = ok(server.url, "schedules", "list", "-t", tid)
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["Schedule", "Effect", "When", "State"]
    assert rows[0].startswith(daily["id"]) and "cron 30 8 * * * (Europe/Berlin)" in rows[0]
    assert rows[0].rstrip().endswith("digest")
    assert daily["nextFireAt"].replace("T", " ")[:19] in rows[0]
    assert rows[1].startswith(hourly["id"]) and "every 3600s" in rows[1]

    shown = ok_json(server.url, "schedules", "show", daily["id"], "-t", tid)
    assert shown["id"] == daily["id"] and shown["args"] == {"text": "tick"}
    details = ok(server.url, "schedules", "show", daily["id"], "-t", tid)
    assert f"Schedule   {daily['id']}" in details
    assert "When       cron 30 8 * * * (Europe/Berlin)" in details
    assert '"text": "tick"' in details and "Key        digest" in details

    unknown = te(server.url, "schedules", "show", "f" * 32, "-t", tid)
    assert unknown.exit_code == 1 and "[HTTP 404 schedule_not_found]" in unknown.stderr
    missing = te(server.url, "schedules", "list", "-t", "no-such-thread")
    assert missing.exit_code == 1 and "[HTTP 404 thread_not_found]" in missing.stderr
    no_thread = te(server.url, "schedules", "show", daily["id"])
    assert no_thread.exit_code == 2 and "--thread" in no_thread.stderr
    odd = te(server.url, "schedules", "pause", "a/b", "-t", tid)
    assert odd.exit_code == 2 and "cannot be a schedule id" in odd.stderr


def test_schedules_pause_resume_cancel(server: ServerProcess) -> None:
    tid = new_thread(server.url)["id"]
    made = a_schedule(server.url, tid, every_seconds=3600)
    sid = made["id"]

    paused = ok(server.url, "schedules", "pause", sid, "-t", tid)
    assert paused == f"Paused schedule {sid} (send_reminder).\n"
    state = httpx.get(f"{server.url}/api/threads/{tid}/schedules/{sid}").json()
    assert state["state"] == "paused" and state["nextFireAt"] is None
    resumed = ok_json(server.url, "schedules", "resume", sid, "-t", tid)
    assert resumed["state"] == "active" and resumed["nextFireAt"] is not None
    again = ok(server.url, "schedules", "pause", sid, "-t", tid)
    assert again.startswith(f"Paused schedule {sid}")
    said = ok(server.url, "schedules", "resume", sid, "-t", tid)
    assert said.startswith(f"Resumed schedule {sid} (send_reminder); next fire ")

    canceled = ok_json(server.url, "schedules", "cancel", sid, "-t", tid)
    assert canceled["id"] == sid
    assert httpx.get(f"{server.url}/api/threads/{tid}/schedules").json() == {"schedules": []}
    gone = te(server.url, "schedules", "cancel", sid, "-t", tid, "--json")
    assert gone.exit_code == 1 and gone.stdout == ""
    assert json.loads(gone.stderr)["error"]["code"] == "schedule_not_found"
    other = a_schedule(server.url, tid, every_seconds=60)["id"]
    assert ok(server.url, "schedules", "cancel", other, "-t", tid) == (
        f"Canceled schedule {other} (send_reminder).\n"
    )


def test_effects_list(server: ServerProcess) -> None:
    table = ok(server.url, "effects", "list")
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    assert {"send_reminder", "fail_on_purpose", "slow_task", "thread_digest"} <= set(rows)
    assert "Posts a reminder into the thread" in rows["send_reminder"]
    assert rows["send_reminder"].rstrip().endswith("text: string")
    assert "seconds?: number = 10.0" in rows["slow_task"]
    assert "(no args)" in rows["thread_digest"]

    listed = ok_json(server.url, "effects", "list")
    by_name = {e["name"]: e for e in listed["effects"]}
    schema = by_name["send_reminder"]["argsSchema"]
    assert schema["required"] == ["text"] and schema["properties"]["text"]["type"] == "string"
    assert by_name["thread_digest"]["argsSchema"] is None


# ----------------------------------------------------------------------------- errors


def test_a_server_that_is_down_is_exit_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    down = te(url, "threads", "list")
    assert down.exit_code == 3 and down.stdout == ""
    assert down.stderr.startswith(f"thread-effects: cannot connect to {url}: ")
    assert "Is the server running" in down.stderr
    as_json = te(url, "effects", "list", "--json")
    assert as_json.exit_code == 3
    assert json.loads(as_json.stderr)["error"]["code"] == "cannot_connect"


def test_a_server_that_never_answers_is_exit_3() -> None:
    with socket.socket() as silent:  # connections queue in the backlog; none is answered
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = te(url, "--timeout", "0.2", "runs", "list", "-t", "t1", "--json")
    assert result.exit_code == 3 and result.stdout == ""
    assert json.loads(result.stderr)["error"] == {
        "code": "timeout",
        "message": f"no answer from {url} within 0.2 s (GET /api/threads/t1/effects; "
                   "--timeout waits longer)",
        "status": None,
    }


def test_an_answer_that_is_not_the_api_is_exit_3() -> None:
    class Other(http.server.BaseHTTPRequestHandler):
        """An HTML 404 below /html/, some other JSON API's 200 elsewhere."""

        def do_GET(self) -> None:
            html = self.path.startswith("/html/")
            self.send_response(404 if html else 200)
            self.send_header("Content-Type", "text/html" if html else "application/json")
            self.end_headers()
            self.wfile.write(b"<h1>nothing</h1>" if html else b'{"hello": "world"}')

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{other.server_address[1]}"
            html = te(f"{url}/html", "threads", "list")
            json_api = te(url, "runs", "list", "-t", "t1")
        finally:
            other.shutdown()
    assert html.exit_code == 3
    assert html.stderr == (
        f"thread-effects: {url}/html is not a thread-effects API: GET /api/threads answered "
        "HTTP 404 (text/html)\n"
    )
    assert json_api.exit_code == 3
    assert json_api.stderr == (
        f"thread-effects: {url} is not a thread-effects API: GET /api/threads/t1/effects "
        "answered without runs, counts\n"
    )


def test_usage_errors_are_exit_2(server: ServerProcess) -> None:
    result = CliRunner().invoke(cli, ["--url", "ftp://example.org", "threads", "list"])
    assert result.exit_code == 2
    assert "'ftp://example.org' is not an http(s) URL" in result.stderr
    unknown = te(server.url, "threads", "frobnicate")
    assert unknown.exit_code == 2 and "No such command 'frobnicate'" in unknown.stderr
    # Ids that cannot be one path segment would reach another route: refused here.
    for args in (("threads", "show", "a/b"), ("threads", "delete", "", "--yes"),
                 ("runs", "show", "..", "-t", "t1"), ("runs", "list", "-t", "x/y")):
        refused = te(server.url, *args)
        assert refused.exit_code == 2, args
        assert "cannot be a" in refused.stderr and "without '/'" in refused.stderr
    # Any other malformed id is the server's to name.
    odd = te(server.url, "threads", "show", "a.b")
    assert odd.exit_code == 1
    assert 'Invalid thread id "a.b": must match' in odd.stderr
    assert "[HTTP 400 invalid_thread_id]" in odd.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("runs", "list", "--user", ""), "'--user'"),
        (("runs", "list", "--tag", ""), "'--tag'"),
        (("runs", "list", "--name", ""), "'--name'"),
        (("runs", "list", "--since", ""), "'--since'"),
        (("runs", "list", "--cursor", ""), "'--cursor'"),
        (("threads", "list", "--user", ""), "'--user'"),
        (("threads", "list", "--agent", ""), "'--agent'"),
        (("threads", "list", "--tag", ""), "'--tag'"),
        (("runs", "list", "--thread", ""), "cannot be a thread id"),
    ],
)
def test_an_empty_filter_is_a_usage_error(args: tuple[str, ...], named: str) -> None:
    result = te("http://127.0.0.1:9", *args)  # refused before any request
    assert result.exit_code == 2, result.output
    assert named in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((b"runs", b"list", b"--tag", b"\xff"), "--tag"),
        ((b"runs", b"list", b"--tag=v\xff"), "--tag"),
        ((b"threads", b"show", b"t\xff"), "argument 't\\xff'"),
        ((b"runs", b"show", b"r1", b"-t", b"t\xff"), "-t"),
    ],
)
def test_an_argument_that_is_not_utf8_is_a_usage_error(
    args: tuple[bytes, ...], named: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREAD_EFFECTS_")}
    done = subprocess.run(
        [str(SCRIPT).encode(), b"--url", b"http://127.0.0.1:9", *args],
        env={**env, "LC_ALL": "C.UTF-8"}, capture_output=True, timeout=GUARD_SECONDS,
    )
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"thread-effects: {named}: "), err
    assert "is not UTF-8 text" in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--timeout", "nan"), "'--timeout'"),
        (("--timeout", "inf"), "'--timeout'"),
        (("--timeout", "1e400"), "'--timeout'"),
        (("--timeout", "0"), "'--timeout'"),
        (("--url", "http://[::1"), "is not an http(s) URL"),
        (("--url", "http://127.0.0.1:8811:1"), "is not an http(s) URL"),
        (("--url", "http://127.0.0.1:99999"), "is not an http(s) URL"),
    ],
)
def test_bad_global_options_are_usage_errors(args: tuple[str, ...], named: str) -> None:
    result = te("http://127.0.0.1:9", *args, "effects", "list")
    assert result.exit_code == 2, result.output
    assert named in result.stderr


@pytest.mark.parametrize("limit", ["0", "-1", "501"])
def test_a_page_size_outside_1_to_500_is_a_usage_error(limit: str) -> None:
    for args in (("threads", "list"), ("runs", "list", "-t", "t1")):
        result = te("http://127.0.0.1:9", *args, "--limit", limit)
        assert result.exit_code == 2, result.output  # refused before any request
        assert "'--limit'" in result.stderr


@pytest.mark.parametrize("token", ["tøken", "bad\ntoken", "two words"])
def test_a_malformed_token_is_named_but_never_printed(token: str) -> None:
    for extra in ((), ("--json",)):
        result = te("http://127.0.0.1:9", "threads", "list", *extra, token=token)
        assert result.exit_code == 2, result.output
        assert result.stderr == (
            "thread-effects: THREAD_EFFECTS_API_TOKEN is malformed: a token is printable "
            "ASCII without spaces or line breaks (its value is not shown)\n"
        )
        assert token not in result.output and "bad" not in result.output


def test_the_token_comes_from_the_environment(tmp_path: Path) -> None:
    guarded = ServerProcess(tmp_path / "data", tmp_path / "server.log", "--api-token", "s3cret")
    guarded.start()
    try:
        missing = te(guarded.url, "threads", "list")
        assert missing.exit_code == 1
        assert missing.stderr == (
            "thread-effects: This server requires an API token (Authorization: Bearer "
            "<token>); the token is missing (set THREAD_EFFECTS_API_TOKEN) "
            "[HTTP 401 unauthorized]\n"
        )
        wrong = te(guarded.url, "effects", "list", "--json", token="nope")
        assert wrong.exit_code == 1
        assert json.loads(wrong.stderr)["error"] == {
            "code": "unauthorized",
            "message": "This server requires an API token (Authorization: Bearer <token>); "
                       "the token is wrong",
            "status": 401,
        }
        assert ok(guarded.url, "threads", "list", token="s3cret") == "No threads.\n"
        tid = httpx.post(
            f"{guarded.url}/api/threads", headers={"Authorization": "Bearer s3cret"}
        ).json()["id"]
        assert ok_json(guarded.url, "threads", "show", tid, token="s3cret")["counts"] == {
            "pending": 0, "running": 0, "completed": 0, "failed": 0, "canceled": 0,
        }
    finally:
        guarded.stop()


# ------------------------------------------------------- the console script and serve


def test_the_console_script_serves_and_talks_to_its_server(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREAD_EFFECTS_")}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(SCRIPT), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        client_env = {**env, URL_ENV: url}
        deadline = time.monotonic() + GUARD_SECONDS
        while True:
            done = subprocess.run(
                [str(SCRIPT), "effects", "list", "--json"],
                env=client_env, capture_output=True, text=True, timeout=GUARD_SECONDS,
            )
            if done.returncode == 0:
                break
            assert done.returncode == 3, done.stderr  # not up yet: cannot connect
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        names = {e["name"] for e in json.loads(done.stdout)["effects"]}
        assert "send_reminder" in names

        tid = httpx.post(f"{url}/api/threads").json()["id"]
        done = subprocess.run(
            [str(SCRIPT), "--url", url, "threads", "list"],
            env=env, capture_output=True, text=True, timeout=GUARD_SECONDS,
        )
        assert done.returncode == 0 and tid in done.stdout
        done = subprocess.run(
            [str(SCRIPT), "--url", url, "runs", "show", "x" * 32, "-t", tid],
            env=env, capture_output=True, text=True, timeout=GUARD_SECONDS,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.startswith(f"thread-effects: Run not found: {'x' * 32}")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=GUARD_SECONDS) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=GUARD_SECONDS)


def test_serve_refuses_what_server_py_refuses(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREAD_EFFECTS_")}
    done = subprocess.run(
        [str(SCRIPT), "serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=GUARD_SECONDS,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("thread-effects serve: refusing to listen on 0.0.0.0 ")
    assert not (tmp_path / "runtime.sqlite").exists()

    helped = subprocess.run(
        [str(SCRIPT), "serve", "--help"], env=env, capture_output=True, text=True,
        timeout=GUARD_SECONDS,
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: thread-effects serve")
    for option in ("--app-dir", "--data-dir", "--host", "--port", "--api-token",
                   "--shutdown-grace-seconds", "--model", "--no-packages", "--log-level",
                   "--log-format"):
        assert option in helped.stdout


def test_import_runtime_leaves_the_command_line_tool_out() -> None:
    code = (
        "import sys, json, runtime; a = sorted(m for m in sys.modules if m in WATCH); "
        "import runtime.cli; b = sorted(m for m in sys.modules if m in WATCH); "
        "print(json.dumps([a, b]))"
    ).replace("WATCH", repr({"runtime.cli", "runtime.serve", "runtime.http", "uvicorn", "rich"}))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=GUARD_SECONDS
    )
    assert done.returncode == 0, done.stderr
    # The client loads neither the server (runtime.serve, uvicorn) nor the HTTP layer.
    assert json.loads(done.stdout) == [[], ["rich", "runtime.cli"]]
