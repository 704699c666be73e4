"""NUL (U+0000) in what users send: the same answer on every backend, nothing lost.

PostgreSQL text cannot hold NUL, SQLite can. Identifiers, keys, ``by``, user and agent ids,
tags, names and filters are refused at the input boundary (400 naming the field; the Python
API raises `InvalidArgument`); free text (message content, args, errors) is stored as given
and read back unchanged on every backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic_ai.messages  # noqa: F401 - imported here, not on the loop (no_blocking)
import pytest

from runtime.errors import InvalidArgument
from tests.conftest import DEMO_APP, Api, serve_api
from tests.test_http import error_of

pytestmark = [pytest.mark.usefixtures("no_blocking"), pytest.mark.every_backend]


async def test_identifiers_with_nul_are_refused_over_http(api: Api) -> None:
    post = api.client.post
    for body, field in [
        ({"id": "n", "user_id": "a\u0000b"}, "user_id"),
        ({"agent_id": "x\u0000"}, "agent_id"),
        ({"tags": ["ok", "v\u0000ip"]}, "tags[1]"),
    ]:
        assert field in error_of(await post("/api/threads", json=body), 400, "invalid_argument")
    assert (await api.client.get("/api/threads/n")).status_code == 404  # nothing stored
    error_of(await post("/api/threads", json={"id": "a\u0000"}), 400, "invalid_thread_id")
    error_of(await api.client.get("/api/threads/a%00"), 400, "invalid_thread_id")

    for url, field in [
        ("/api/threads?user_id=a%00", "user_id"),
        ("/api/threads?tag=a%00", "tag"),
        ("/api/threads?agent_id=%00", "agent_id"),
        ("/api/runs?name=a%00", "name"),
        ("/api/runs?user_id=a%00", "user_id"),
        ("/api/runs?tag=%00x", "tag"),
    ]:
        assert field in error_of(await api.client.get(url), 400, "invalid_parameter")
    assert "user_id" in error_of(
        await post("/api/runs/cancel", json={"user_id": "a\u0000"}), 400, "invalid_argument"
    )

    tid = await api.new_thread(user_id="u", tags=["t"])
    res = await post(f"/api/threads/{tid}/effects",
                     json={"name": "note", "args": {"text": "x"}, "key": "k\u0000"})
    assert "key" in error_of(res, 400, "invalid_argument")
    res = await post(f"/api/threads/{tid}/effects", json={"name": "no\u0000te", "args": {}})
    assert "name" in error_of(res, 400, "invalid_argument")
    res = await post(f"/api/threads/{tid}/schedules",
                     json={"name": "no\u0000te", "every_seconds": 60})
    assert "name" in error_of(res, 400, "invalid_argument")
    run_id = await api.schedule(tid, "note", {"text": "x"}, delay_seconds=60)
    res = await post(f"/api/threads/{tid}/effects/{run_id}/cancel", json={"by": "me\u0000"})
    assert "canceled_by" in error_of(res, 400, "invalid_argument")
    assert (await api.run(tid, run_id))["status"] == "pending"  # nothing canceled
    res = await api.client.get(f"/api/threads/{tid}/effects/{run_id}%00")
    assert "run_id" in error_of(res, 400, "invalid_parameter")
    res = await post(f"/api/threads/{tid}/schedules",
                     json={"name": "note", "args": {"text": "x"}, "every_seconds": 60,
                           "key": "s\u0000"})
    assert "key" in error_of(res, 400, "invalid_argument")
    # Filters that do not hold NUL still work, on a thread whose tags and ids are plain.
    listed = (await api.client.get("/api/threads", params={"user_id": "u", "tag": "t"})).json()
    assert [t["id"] for t in listed["threads"]] == [tid]


async def test_identifiers_with_nul_are_refused_by_the_python_api(api: Api) -> None:
    rt = api.rt
    with pytest.raises(InvalidArgument, match="user_id"):
        await rt.create_thread(user_id="a\u0000")
    with pytest.raises(InvalidArgument, match=r"tags\[0\]"):
        await rt.create_thread(tags=["\u0000"])
    with pytest.raises(InvalidArgument, match="user_id"):
        await rt.list_threads(user_id="a\u0000")
    with pytest.raises(InvalidArgument, match="name"):
        await rt.list_runs(name="a\u0000")
    with pytest.raises(InvalidArgument, match="user_id"):
        await rt.cancel_runs(user_id="a\u0000")
    state = await rt.get_thread(await api.new_thread())
    with pytest.raises(InvalidArgument, match="key"):
        await state.schedule("note", {"text": "x"}, key="k\u0000")
    with pytest.raises(InvalidArgument, match="name"):
        await state.schedule("no\u0000te", {"text": "x"})
    with pytest.raises(InvalidArgument, match="name"):
        await state.list_runs(name="no\u0000te")
    with pytest.raises(InvalidArgument, match="name"):
        await state.get_scheduled_effects("no\u0000te")


async def test_free_text_with_nul_is_stored_and_read_back_unchanged(api: Api) -> None:
    tid = await api.new_thread()
    state = await api.rt.get_thread(tid)
    await state.inject_message("before \u0000 after")
    await state.inject_message("\u0001nul\u0001 looks like the escape mark")
    page = (await api.client.get(f"/api/threads/{tid}/messages")).json()
    assert [m["content"] for m in page["messages"]] == [
        "before \u0000 after", "\u0001nul\u0001 looks like the escape mark",
    ]

    done = await api.schedule(tid, "note", {"text": "hi \u0000"})
    failed = await api.schedule(tid, "boom", {"message": "bad \u0000 thing"})
    await api.rt.wait_idle()
    run = await api.run(tid, done)
    assert run["status"] == "completed" and run["args"] == {"text": "hi \u0000"}
    run = await api.run(tid, failed)
    assert run["status"] == "failed" and "bad \u0000 thing" in run["error"]
    assert "ThreadStorageError" not in run["error"]
    indexed = (await api.client.get("/api/runs", params={"status": "failed"})).json()
    assert [r["id"] for r in indexed["runs"]] == [failed]
    assert "bad \u0000 thing" in indexed["runs"][0]["error"]


async def test_a_reminder_with_nul_completes_and_posts_it(
    tmp_path: Path, backend_settings: dict[str, Any]
) -> None:
    async with serve_api(tmp_path / "data", app_dir=DEMO_APP, **backend_settings) as api:
        tid = await api.new_thread()
        run_id = await api.schedule(tid, "send_reminder", {"text": "hi \u0000"})
        await api.rt.wait_idle()
        run = await api.run(tid, run_id)
        assert run["status"] == "completed", run["error"]
        page = (await api.client.get(f"/api/threads/{tid}/messages")).json()
        assert page["messages"][-1]["content"] == "Reminder: hi \u0000"
