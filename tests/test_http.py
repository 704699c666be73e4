"""The HTTP API of docs/http-api.md against the real app (its lifespan and a real runtime).

Every error path answers ``{"error": {"code", "message"}}`` with the documented status.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
import uvicorn
from conftest import DEMO_APP, SERVER_APP, Api, make_app, serve_api
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime import Runtime
from runtime.http import DEFAULT_WEB_DIR
from runtime.testing import FakeClock

pytestmark = pytest.mark.usefixtures("no_blocking")

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def error_of(res: httpx.Response, status: int, code: str) -> str:
    assert res.status_code == status, res.text
    body = res.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    message: str = body["error"]["message"]
    assert message
    return message


# ------------------------------------------------------------------------- threads


@pytest.mark.every_backend
async def test_create_list_and_delete_threads(api: Api) -> None:
    res = await api.client.post(
        "/api/threads", json={"agent_id": "helper", "user_id": "u1", "tags": ["a", "b"]}
    )
    assert res.status_code == 201
    created = res.json()
    assert created["agentId"] == "helper" and created["userId"] == "u1"
    assert created["tags"] == ["a", "b"]
    assert ISO_UTC.match(created["createdAt"])

    res = await api.client.post("/api/threads")  # no body at all
    assert res.status_code == 201
    second = res.json()["id"]
    named = await api.new_thread(id="named-thread_1")
    assert named == "named-thread_1"

    res = await api.client.get("/api/threads")
    assert res.status_code == 200
    page = res.json()
    assert {t["id"] for t in page["threads"]} == {created["id"], second, named}
    assert page["nextCursor"] is None
    listed = next(t for t in page["threads"] if t["id"] == created["id"])
    assert listed == {**created, "lastActivityAt": created["createdAt"]}  # nothing since

    res = await api.client.delete(f"/api/threads/{second}")
    assert res.status_code == 200 and res.json() == {"deleted": True}
    ids = [t["id"] for t in (await api.client.get("/api/threads")).json()["threads"]]
    assert second not in ids
    error_of(await api.client.delete(f"/api/threads/{second}"), 404, "thread_not_found")


@pytest.mark.every_backend
async def test_get_one_thread(api: Api) -> None:
    res = await api.client.post("/api/threads", json={"user_id": "u1", "tags": ["vip"]})
    created = res.json()
    res = await api.client.get(f"/api/threads/{created['id']}")
    assert res.status_code == 200
    shown = res.json()
    assert shown.pop("lastActivityAt") == created["createdAt"]  # it has done nothing yet
    assert shown == created
    error_of(await api.client.get("/api/threads/nobody"), 404, "thread_not_found")
    error_of(await api.client.get("/api/threads/bad%20id"), 400, "invalid_thread_id")


@pytest.mark.every_backend
async def test_threads_are_paged_with_next_cursor(api: Api) -> None:
    assert api.clock is not None
    made = []
    for i in range(5):
        made.append(await api.new_thread(id=f"t{i}"))
        api.clock.advance(1)  # distinct creation times: newest first is well defined
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get("/api/threads", params=params)).json()
        assert len(page["threads"]) <= 2
        seen += [t["id"] for t in page["threads"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(made))
    assert pages == 3


@pytest.mark.every_backend
async def test_thread_creation_errors(api: Api) -> None:
    await api.new_thread(id="taken")
    message = error_of(
        await api.client.post("/api/threads", json={"id": "taken"}), 409, "thread_exists"
    )
    assert "taken" in message
    message = error_of(
        await api.client.post("/api/threads", json={"id": "../etc"}), 400, "invalid_thread_id"
    )
    assert "../etc" in message
    error_of(await api.client.post("/api/threads", json={"tags": "x"}), 400, "invalid_body")
    message = error_of(
        await api.client.post("/api/threads", json={"color": "red"}), 400, "invalid_body"
    )
    assert "color" in message
    error_of(await api.client.post("/api/threads", json=[1, 2]), 400, "invalid_body")
    error_of(await api.client.post("/api/threads", json={"user_id": 7}), 400, "invalid_body")
    error_of(await api.client.post("/api/threads", content=b"{nope"), 400, "invalid_json")
    # Nothing was created by the refused requests.
    threads = (await api.client.get("/api/threads")).json()["threads"]
    assert [t["id"] for t in threads] == ["taken"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (rb'{"tags": ["\udfff"]}', "tags[0]"),
        (rb'{"user_id": "\ud800"}', "user_id"),
        (rb'{"agent_id": "ok", "tags": ["a", "b\udc00c"]}', "tags[1]"),
        (rb'{"\ud800": 1}', "a key"),
    ],
)
async def test_lone_surrogates_are_refused_and_nothing_is_created(
    api: Api, body: bytes, where: str
) -> None:
    message = error_of(await api.client.post("/api/threads", content=body), 400, "invalid_json")
    assert where in message and "lone surrogate" in message
    res = await api.client.get("/api/threads")
    assert res.status_code == 200 and res.json()["threads"] == []
    threads_dir = api.rt.settings.data_dir / "threads"
    files = await anyio.to_thread.run_sync(lambda: list(threads_dir.iterdir()))
    assert files == []


async def test_thread_fields_over_their_limits_are_400(api: Api) -> None:
    message = error_of(
        await api.client.post("/api/threads", json={"user_id": "u" * 257}),
        400, "invalid_argument",
    )
    assert "user_id" in message and "256" in message
    message = error_of(
        await api.client.post("/api/threads", json={"tags": [f"t{i}" for i in range(33)]}),
        400, "invalid_argument",
    )
    assert "32 tags" in message
    message = error_of(
        await api.client.post("/api/threads", json={"tags": ["ok", "x" * 65]}),
        400, "invalid_argument",
    )
    assert "tags[1]" in message and "64" in message
    assert (await api.client.get("/api/threads")).json()["threads"] == []
    # At the limits it works.
    await api.new_thread(user_id="u" * 256, tags=["x" * 64] * 32)


async def test_threads_stored_with_a_lone_surrogate_tag_still_list(api: Api) -> None:
    # Before tags were checked, such a row could be stored; the list must still answer.
    tid = await api.new_thread(tags=["fine"])

    def corrupt() -> None:
        import sqlite3

        with sqlite3.connect(api.rt.settings.data_dir / "runtime.sqlite") as db:
            db.execute("UPDATE threads SET tags = ? WHERE id = ?", ('["a\\udfff"]', tid))

    await anyio.to_thread.run_sync(corrupt)
    res = await api.client.get("/api/threads")
    assert res.status_code == 200, res.text
    assert res.json()["threads"][0]["tags"] == ["a\ufffd"]


@pytest.mark.parametrize(
    "params", [{"limit": "0"}, {"limit": "501"}, {"limit": "ten"}, {"cursor": "garbage"}]
)
async def test_thread_list_rejects_bad_paging(api: Api, params: dict[str, str]) -> None:
    error_of(await api.client.get("/api/threads", params=params), 400, "invalid_parameter")


# ------------------------------------------------------------------------- effects


async def test_effects_lists_names_descriptions_and_schemas(api: Api) -> None:
    res = await api.client.get("/api/effects")
    assert res.status_code == 200
    effects = {e["name"]: e for e in res.json()["effects"]}
    assert set(effects) == {"boom", "hold", "note", "ping"}
    assert effects["note"]["description"] == "Takes a note (does nothing else)."
    assert effects["note"]["argsSchema"]["properties"]["text"]["type"] == "string"
    assert effects["ping"]["argsSchema"] is None


def write_two_agents_without_a_default(app: Path) -> None:
    (app / "agents").mkdir(parents=True)
    (app / "agents" / "writer.py").write_text(
        "from runtime import define_agent\n"
        "agent = define_agent('writer', 'You write.', description='Drafts texts.')\n"
    )
    (app / "agents" / "critic.py").write_text(
        "from runtime import define_agent\nagent = define_agent('critic', 'You criticize.')\n"
    )


async def test_agents_lists_ids_descriptions_and_the_default(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "none") as api:  # the server test app has no agents
        assert (await api.client.get("/api/agents")).json() == {"agents": []}
    async with serve_api(tmp_path / "demo", app_dir=DEMO_APP) as api:
        assert (await api.client.get("/api/agents")).json() == {
            "agents": [
                {
                    "id": "assistant",
                    "default": True,  # the only agent serves threads created without one
                    "description": (
                        "Sets reminders that arrive later in the thread and posts notes."
                    ),
                }
            ]
        }
    turns_app = Path(__file__).parent / "apps" / "turns"
    async with serve_api(tmp_path / "turns", app_dir=turns_app) as api:
        agents = (await api.client.get("/api/agents")).json()["agents"]
        assert [(a["id"], a["default"]) for a in agents] == [
            ("greeter", False), ("helper", True), ("plain", False),
        ]

    app = tmp_path / "app"
    await anyio.to_thread.run_sync(write_two_agents_without_a_default, app)
    async with serve_api(tmp_path / "several", app_dir=app) as api:
        assert (await api.client.get("/api/agents")).json() == {
            "agents": [
                {"id": "critic", "default": False},
                {"id": "writer", "default": False, "description": "Drafts texts."},
            ]
        }
        # Which is why a client must choose: without agent_id there is no thread.
        error_of(await api.client.post("/api/threads", json={}), 404, "agent_not_found")
        res = await api.client.post("/api/threads", json={"agent_id": "writer"})
        assert res.status_code == 201 and res.json()["agentId"] == "writer"


@pytest.mark.every_backend
async def test_messages_page_back_from_the_newest_over_http(api: Api) -> None:
    tid = await api.new_thread()
    state = await api.rt.get_thread(tid)  # an app without agents still stores injected text
    for i in range(5):
        await state.inject_message(f"m{i}")
    url = f"/api/threads/{tid}/messages"

    newest = (await api.client.get(url, params={"latest": "true", "limit": 2})).json()
    assert [m["content"] for m in newest["messages"]] == ["m3", "m4"]
    assert newest["nextCursor"] is None
    assert newest["prevCursor"] == newest["messages"][0]["id"]
    older = (
        await api.client.get(url, params={"before": newest["prevCursor"], "limit": 2})
    ).json()
    assert [m["content"] for m in older["messages"]] == ["m1", "m2"]
    oldest = (
        await api.client.get(url, params={"before": older["prevCursor"], "limit": 2})
    ).json()
    assert [m["content"] for m in oldest["messages"]] == ["m0"]
    assert oldest["prevCursor"] is None
    start = (await api.client.get(url, params={"limit": 2})).json()
    assert start["prevCursor"] is None and start["nextCursor"] == start["messages"][1]["id"]

    error_of(await api.client.get(url, params={"latest": "maybe"}), 400, "invalid_parameter")
    error_of(await api.client.get(url, params={"before": "nope"}), 400, "invalid_parameter")
    both = {"latest": "true", "after": start["nextCursor"]}
    assert "at most one" in error_of(await api.client.get(url, params=both), 400,
                                     "invalid_parameter")


@pytest.mark.every_backend
async def test_schedule_run_and_read_a_run(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "note", {"text": "hello"})
    await api.rt.wait_idle()
    run = await api.run(tid, run_id)
    assert run["id"] == run_id and run["threadId"] == tid and run["name"] == "note"
    assert run["status"] == "completed" and run["attempts"] == 1 and run["error"] is None
    assert run["args"] == {"text": "hello"}
    assert run["replayOf"] is None
    for key in ("runAt", "createdAt", "startedAt", "finishedAt"):
        assert ISO_UTC.match(run[key]), (key, run[key])

    later = await api.schedule(tid, "ping", delay_seconds=3600)
    res = await api.client.get(f"/api/threads/{tid}/effects")
    runs = res.json()["runs"]
    assert [r["id"] for r in runs] == [later, run_id]  # newest first
    assert runs[0]["status"] == "pending"
    assert all("args" not in r for r in runs)  # args only in the single-run answer


@pytest.mark.every_backend
async def test_run_list_filters_by_status_and_name_and_pages(api: Api) -> None:
    tid = await api.new_thread()
    done = [await api.schedule(tid, "note", {"text": str(i)}) for i in range(3)]
    failed = await api.schedule(tid, "boom")
    await api.rt.wait_idle()
    pending = await api.schedule(tid, "ping", delay_seconds=60)

    async def ids(**params: str) -> list[str]:
        res = await api.client.get(f"/api/threads/{tid}/effects", params=params)
        assert res.status_code == 200, res.text
        return [r["id"] for r in res.json()["runs"]]

    assert await ids(status="completed") == list(reversed(done))
    assert await ids(status="failed") == [failed]
    assert await ids(status="pending") == [pending]
    assert await ids(status="canceled") == []
    assert await ids(name="boom") == [failed]
    assert await ids(status="pending,failed") == [pending, failed]

    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get(f"/api/threads/{tid}/effects", params=params)).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == [pending, failed, *reversed(done)]
    # Counts cover the whole thread (not the page), by status, with the name filter.
    assert page["counts"] == {
        "pending": 1, "running": 0, "completed": 3, "failed": 1, "canceled": 0,
    }
    by_name = (await api.client.get(f"/api/threads/{tid}/effects", params={"name": "note"}))
    assert by_name.json()["counts"]["completed"] == 3
    assert by_name.json()["counts"]["failed"] == 0


@pytest.mark.parametrize(
    "params", [{"status": "done"}, {"limit": "0"}, {"limit": "x"}, {"cursor": "abc"}]
)
async def test_run_list_rejects_bad_parameters(api: Api, params: dict[str, str]) -> None:
    tid = await api.new_thread()
    error_of(
        await api.client.get(f"/api/threads/{tid}/effects", params=params),
        400, "invalid_parameter",
    )


@pytest.mark.every_backend
async def test_a_failing_run_shows_its_error(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "boom", {"message": "kaput"})
    await api.rt.wait_idle()
    run = await api.run(tid, run_id)
    assert run["status"] == "failed"
    assert run["error"] == "ValueError: kaput"
    assert run["attempts"] == 1


@pytest.mark.every_backend
async def test_schedule_errors(api: Api) -> None:
    tid = await api.new_thread()
    path = f"/api/threads/{tid}/effects"

    async def post(body: Any) -> httpx.Response:
        return await api.client.post(path, json=body)

    assert "nope" in error_of(await post({"name": "nope"}), 404, "effect_not_found")
    message = error_of(await post({"name": "note", "args": {"text": 5}}), 422, "invalid_args")
    assert "note" in message and "text" in message
    error_of(await post({"name": "note", "args": {"text": "x" * 101}}), 422, "invalid_args")
    error_of(await post({"name": "ping", "args": {"x": 1}}), 422, "invalid_args")
    error_of(await post({"name": "ping", "delay_seconds": -1}), 422, "invalid_delay")
    error_of(await post({"name": "ping", "delay_seconds": "soon"}), 422, "invalid_delay")
    error_of(await post({"name": "ping", "delay_seconds": True}), 422, "invalid_delay")
    error_of(await post({"args": {}}), 400, "invalid_body")
    error_of(await post({"name": ""}), 400, "invalid_body")
    assert "when" in error_of(await post({"name": "ping", "when": 1}), 400, "invalid_body")
    error_of(await post(["ping"]), 400, "invalid_body")
    error_of(await api.client.post(path), 400, "invalid_body")
    error_of(await api.client.post(path, content=b'{"name": "ping",'), 400, "invalid_json")
    nan = b'{"name": "ping", "delay_seconds": NaN}'
    error_of(await api.client.post(path, content=nan), 400, "invalid_json")
    error_of(await api.client.post(path, content=b"\xff\xfe"), 400, "invalid_json")
    # Unknown and malformed threads.
    res = await api.client.post("/api/threads/nobody/effects", json={"name": "ping"})
    assert "nobody" in error_of(res, 404, "thread_not_found")
    res = await api.client.post("/api/threads/bad.id/effects", json={"name": "ping"})
    error_of(res, 400, "invalid_thread_id")
    # None of the refused requests stored a run.
    assert (await api.client.get(path)).json()["runs"] == []


async def test_bodies_and_args_over_the_limits_get_413(tmp_path: Path) -> None:
    async with serve_api(
        tmp_path / "data", clock=FakeClock(), max_body_bytes=4096, max_args_bytes=64
    ) as api:
        tid = await api.new_thread()
        path = f"/api/threads/{tid}/effects"
        big_args = {"name": "note", "args": {"text": "y" * 80}}
        message = error_of(await api.client.post(path, json=big_args), 413, "args_too_large")
        assert "64 bytes" in message
        huge = {"name": "note", "args": {"text": "z" * 5000}}
        message = error_of(await api.client.post(path, json=huge), 413, "body_too_large")
        assert "4096" in message

        async def chunks() -> Any:  # no Content-Length: the limit holds while reading
            for _ in range(10):
                yield b" " * 1000

        res = await api.client.post(path, content=chunks())
        error_of(res, 413, "body_too_large")
        res = await api.client.post("/api/threads", content=b"[" + b" " * 5000 + b"]")
        error_of(res, 413, "body_too_large")
        assert (await api.client.get(path)).json()["runs"] == []


@pytest.mark.every_backend
async def test_get_run_errors(api: Api) -> None:
    tid = await api.new_thread()
    res = await api.client.get(f"/api/threads/{tid}/effects/0123456789abcdef")
    assert "0123456789abcdef" in error_of(res, 404, "run_not_found")
    error_of(await api.client.get("/api/threads/ghost/effects"), 404, "thread_not_found")
    error_of(await api.client.get("/api/threads/ghost/effects/x"), 404, "thread_not_found")
    error_of(await api.client.get("/api/threads/a%20b/effects"), 400, "invalid_thread_id")


# -------------------------------------------------------------------- run actions


@pytest.mark.every_backend
async def test_run_now_runs_a_pending_run(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "note", {"text": "later"}, delay_seconds=3600)
    await api.rt.wait_idle()
    assert (await api.run(tid, run_id))["status"] == "pending"
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/run")
    assert res.status_code == 200
    assert res.json() == {"id": run_id, "status": "pending"}
    await api.rt.wait_idle()
    assert (await api.run(tid, run_id))["status"] == "completed"
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/run")
    assert "completed" in error_of(res, 409, "run_state_conflict")
    res = await api.client.post(f"/api/threads/{tid}/effects/feed/run")
    error_of(res, 404, "run_not_found")


@pytest.mark.every_backend
async def test_cancel_a_pending_run(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "ping", delay_seconds=3600)
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/cancel")
    assert res.status_code == 200 and res.json() == {"canceled": True}
    run = await api.run(tid, run_id)
    assert run["status"] == "canceled" and run["finishedAt"] is not None
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/cancel")
    assert res.status_code == 200 and res.json() == {"canceled": False}
    res = await api.client.post(f"/api/threads/{tid}/effects/unknown-run/cancel")
    error_of(res, 404, "run_not_found")
    res = await api.client.post(f"/api/threads/ghost/effects/{run_id}/cancel")
    error_of(res, 404, "thread_not_found")
    assert api.clock is not None
    api.clock.advance(3600)
    await api.rt.wait_idle()
    assert (await api.run(tid, run_id))["status"] == "canceled"  # and it never ran


@pytest.mark.every_backend
async def test_replay_makes_a_linked_run_with_the_same_args(api: Api) -> None:
    tid = await api.new_thread()
    original = await api.schedule(tid, "boom", {"message": "again"})
    await api.rt.wait_idle()
    res = await api.client.post(f"/api/threads/{tid}/effects/{original}/replay")
    assert res.status_code == 201
    new_id = res.json()["id"]
    assert new_id != original
    await api.rt.wait_idle()
    replayed = await api.run(tid, new_id)
    assert replayed["replayOf"] == original
    assert replayed["args"] == {"message": "again"}
    assert replayed["status"] == "failed" and replayed["error"] == "ValueError: again"

    pending = await api.schedule(tid, "ping", delay_seconds=60)
    res = await api.client.post(f"/api/threads/{tid}/effects/{pending}/replay")
    assert "pending" in error_of(res, 409, "run_state_conflict")
    res = await api.client.post(f"/api/threads/{tid}/effects/nope/replay")
    error_of(res, 404, "run_not_found")


@pytest.mark.every_backend
async def test_actions_on_a_running_run(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "hold", {"key": "running"})
    for _ in range(100):  # the run starts within a few loop iterations
        if (await api.run(tid, run_id))["status"] == "running":
            break
    assert (await api.run(tid, run_id))["status"] == "running"
    base = f"/api/threads/{tid}/effects/{run_id}"
    assert "running" in error_of(await api.client.post(f"{base}/run"), 409, "run_state_conflict")
    error_of(await api.client.post(f"{base}/replay"), 409, "run_state_conflict")
    # An async run is canceled cooperatively (a sync one: 409, tests/test_runs.py).
    res = await api.client.post(f"{base}/cancel")
    assert res.status_code == 200 and res.json() == {"canceled": True}
    await api.rt.wait_idle()
    run = await api.run(tid, run_id)
    assert (run["status"], run["canceledBy"]) == ("canceled", "http")
    res = await api.client.post(f"{base}/cancel")
    assert res.status_code == 200 and res.json() == {"canceled": False}


@pytest.mark.every_backend
async def test_deleting_a_thread_discards_its_runs(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "ping", delay_seconds=10)
    assert (await api.client.delete(f"/api/threads/{tid}")).status_code == 200
    error_of(await api.client.get(f"/api/threads/{tid}/effects"), 404, "thread_not_found")
    error_of(await api.client.get(f"/api/threads/{tid}/effects/{run_id}"), 404, "thread_not_found")
    error_of(await api.client.delete("/api/threads/bad!id"), 400, "invalid_thread_id")


async def test_a_corrupt_thread_file_is_a_500_and_other_threads_keep_working(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with serve_api(data, clock=FakeClock()) as api:
        await api.new_thread(id="broken")
        await api.new_thread(id="healthy")
        await api.schedule("healthy", "ping")
        await api.rt.wait_idle()
        path = api.rt.settings.data_dir / "threads" / "broken.sqlite"

    def corrupt() -> None:
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        path.write_bytes(b"this is not a database" * 100)

    await anyio.to_thread.run_sync(corrupt)

    async with serve_api(data, clock=FakeClock()) as api:
        res = await api.client.get("/api/threads/broken/effects")
        message = error_of(res, 500, "thread_storage_error")
        assert "broken" in message
        res = await api.client.post("/api/threads/broken/effects", json={"name": "ping"})
        error_of(res, 500, "thread_storage_error")
        run_id = await api.schedule("healthy", "note", {"text": "still fine"})
        await api.rt.wait_idle()
        assert (await api.run("healthy", run_id))["status"] == "completed"
        assert len((await api.client.get("/api/threads")).json()["threads"]) == 2


# ------------------------------------------------------------ routes, guards, pane


async def test_unknown_paths_and_methods_are_json_errors(api: Api) -> None:
    error_of(await api.client.get("/api/nothing-here"), 404, "not_found")
    res = await api.client.put("/api/threads")
    error_of(res, 405, "method_not_allowed")
    assert "GET" in res.headers["allow"]


async def test_an_api_token_guards_every_api_call(tmp_path: Path) -> None:
    async with serve_api(
        tmp_path / "data", clock=FakeClock(), api_token="s3cret", web_dir=DEFAULT_WEB_DIR
    ) as api:
        client = api.client
        for method, path in [
            ("GET", "/api/threads"),
            ("POST", "/api/threads"),
            ("GET", "/api/effects"),
            ("GET", "/api/threads/x/effects"),
            ("DELETE", "/api/threads/x"),
            ("POST", "/api/threads/x/effects/y/cancel"),
        ]:
            res = await client.request(method, path)
            assert "token" in error_of(res, 401, "unauthorized")
            assert res.headers["www-authenticate"] == "Bearer"
        res = await client.get("/api/threads", headers={"Authorization": "Bearer wrong"})
        assert "wrong" in error_of(res, 401, "unauthorized")
        res = await client.get("/api/threads", headers={"Authorization": "Basic s3cret"})
        error_of(res, 401, "unauthorized")
        good = {"Authorization": "Bearer s3cret"}
        res = await client.post("/api/threads", json={}, headers=good)
        assert res.status_code == 201
        assert (await client.get("/api/threads", headers=good)).status_code == 200
        # The pane's files hold no data and load without the token.
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/web/app.js")).status_code == 200


async def test_with_a_token_unknown_paths_outside_the_api_are_404(tmp_path: Path) -> None:
    async def hook(request: Request) -> JSONResponse:
        return JSONResponse({"hooked": True})

    async with serve_api(
        tmp_path / "data", clock=FakeClock(), api_token="s3cret", web_dir=DEFAULT_WEB_DIR,
        extra_routes=[Route("/hooks/paid", hook, methods=["POST"])],
    ) as api:
        client = api.client
        # Not a pane file, not a route: a plain JSON 404, whatever the token.
        for path in ("/style.css", "/app.js", "/nope", "/apix", "/web/missing.js"):
            res = await client.get(path)
            assert "No such path" in error_of(res, 404, "not_found"), path
            assert "www-authenticate" not in res.headers
        res = await client.post("/nope", json={})
        error_of(res, 404, "not_found")
        # Everything under /api/ still needs it, served or not.
        for path in ("/api/nope", "/api", "/api/threads/x/stream"):
            error_of(await client.get(path), 401, "unauthorized")
        # So does a route the host mounted elsewhere, even with the wrong method.
        error_of(await client.post("/hooks/paid"), 401, "unauthorized")
        error_of(await client.get("/hooks/paid"), 401, "unauthorized")
        res = await client.post("/hooks/paid", headers={"Authorization": "Bearer s3cret"})
        assert res.json() == {"hooked": True}


def test_an_empty_api_token_is_refused(tmp_path: Path) -> None:
    from runtime.http import create_app

    with pytest.raises(ValueError, match="api_token"):
        create_app(data_dir=tmp_path, app_dir=SERVER_APP, api_token="")


async def test_cross_origin_writes_are_refused(api: Api) -> None:
    res = await api.client.post(
        "/api/threads", json={}, headers={"Origin": "http://evil.example"}
    )
    assert "evil.example" in error_of(res, 403, "forbidden_origin")
    assert (await api.client.get("/api/threads")).json()["threads"] == []
    res = await api.client.post("/api/threads", json={}, headers={"Origin": "http://testserver"})
    assert res.status_code == 201
    # Reads do not change anything; a browser cannot read them cross-origin without CORS.
    res = await api.client.get("/api/threads", headers={"Origin": "http://evil.example"})
    assert res.status_code == 200


async def test_trusted_hosts_refuse_other_host_names(tmp_path: Path) -> None:
    async with serve_api(
        tmp_path / "data", clock=FakeClock(), trusted_hosts=["127.0.0.1", "localhost"]
    ) as api:
        res = await api.client.get("/api/threads")  # Host: testserver
        assert "testserver" in error_of(res, 400, "untrusted_host")
        res = await api.client.get("/api/threads", headers={"Host": "localhost:8000"})
        assert res.status_code == 200


async def test_the_pane_is_served(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", web_dir=DEFAULT_WEB_DIR) as api:
        res = await api.client.get("/")
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/html")
        assert 'data-testid="conn-state"' in res.text
        assert res.headers["x-frame-options"] == "DENY"
        for name in ("app.js", "api.js", "style.css"):
            res = await api.client.get(f"/web/{name}")
            assert res.status_code == 200, name
        assert "javascript" in (await api.client.get("/web/app.js")).headers["content-type"]
        error_of(await api.client.get("/web/missing.js"), 404, "not_found")


async def test_a_host_route_mounted_with_extra_routes_schedules_effects(tmp_path: Path) -> None:
    async def payment_webhook(request: Request) -> JSONResponse:
        rt: Runtime = request.app.state.runtime
        event = await request.json()
        thread = await rt.get_thread(event["thread_id"])
        run_id = await thread.schedule_effect("note", {"text": "paid"}, delay=60)
        return JSONResponse({"scheduled": run_id})

    async with serve_api(
        tmp_path / "data", clock=FakeClock(),
        extra_routes=[Route("/webhooks/payment", payment_webhook, methods=["POST"])],
    ) as api:
        tid = await api.new_thread()
        res = await api.client.post("/webhooks/payment", json={"thread_id": tid})
        assert res.status_code == 200, res.text
        run = await api.run(tid, res.json()["scheduled"])
        assert run["name"] == "note" and run["status"] == "pending"
        # Runtime errors raised in a host route answer as the API's own do.
        error_of(await api.client.post("/webhooks/payment", json={"thread_id": "nope"}),
                 404, "thread_not_found")


async def test_a_request_cut_off_by_shutdown_gets_a_json_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entered = asyncio.Event()

    async def forever(request: Request) -> Response:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = await anyio.to_thread.run_sync(
        lambda: make_app(tmp_path / "data", extra_routes=[Route("/slow", forever)])
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        app, lifespan="on", log_config=None, log_level="warning",
        timeout_graceful_shutdown=0.2,
    ))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            request = asyncio.create_task(client.get("/slow"))
            await entered.wait()
            server.should_exit = True  # what SIGTERM does
            res = await request
    finally:
        server.should_exit = True
        await task
        sock.close()
    message = error_of(res, 503, "shutting_down")
    assert "GET /slow was interrupted" in message
    assert res.headers["retry-after"] == "5"
    assert not any("Exception in ASGI application" in r.getMessage() for r in caplog.records)


@pytest.mark.every_backend
async def test_run_at_outside_the_storable_range_is_refused(api: Api) -> None:
    tid = await api.new_thread()
    path = f"/api/threads/{tid}/effects"
    # Year 1 at +14:00 is 0000-12-31T10:00:00Z in UTC: no datetime can hold it.
    for early in ("0001-01-01T00:00:00+14:00", "0001-01-01T13:59:59+14:00"):
        message = error_of(
            await api.client.post(path, json={"name": "ping", "run_at": early}),
            422, "invalid_delay",
        )
        assert "run_at" in message and "0001-01-01T00:00:00Z" in message, message
    # The first storable instant is accepted, runs at once and lists like any run.
    res = await api.client.post(path, json={"name": "ping", "run_at": "0001-01-01T14:00:00+14:00"})
    assert res.status_code == 201, res.text
    run_id = res.json()["id"]
    await api.rt.wait_idle()
    run = await api.run(tid, run_id)
    assert run["status"] == "completed" and run["runAt"] == "0001-01-01T00:00:00Z"
    res = await api.client.get(path)
    assert res.status_code == 200, res.text
    assert [r["id"] for r in res.json()["runs"]] == [run_id]
    res = await api.client.get("/api/runs", params={"thread_id": tid})
    assert res.status_code == 200, res.text
    assert [r["id"] for r in res.json()["runs"]] == [run_id]
    # Query bounds outside the range are refused as well, naming the bound.
    for key in ("since", "until"):
        message = error_of(
            await api.client.get("/api/runs", params={key: "0001-01-01T00:00:00+14:00"}),
            400, "invalid_parameter",
        )
        assert key in message and "0001-01-01T00:00:00Z" in message, message


async def test_a_date_time_with_a_control_character_is_refused_and_lowercase_z_read(
    api: Api,
) -> None:
    tid = await api.new_thread()
    path = f"/api/threads/{tid}/effects"
    # CPython's fromisoformat stops at a NUL: "...Z\x00x" must not be read as "...Z".
    for bad in ("2026-12-01T09:00:00.5Z\u0000x", "2026-12-01T09:00:00+03:00\u0000",
                "2026-12-01T09:00:00Z\u0001"):
        message = error_of(
            await api.client.post(path, json={"name": "ping", "run_at": bad}),
            422, "invalid_delay",
        )
        assert "run_at must be an RFC 3339 date-time" in message, message
        error_of(await api.client.get("/api/runs", params={"since": bad}),
                 400, "invalid_parameter")
    assert (await api.client.get(path)).json()["runs"] == []
    # RFC 3339 (5.6, NOTE) allows a lowercase t and z.
    res = await api.client.post(
        path, json={"name": "ping", "run_at": "2027-12-01t09:00:00.5z"})
    assert res.status_code == 201, res.text
    assert (await api.run(tid, res.json()["id"]))["runAt"] == "2027-12-01T09:00:00.500000Z"


@pytest.mark.every_backend
async def test_runs_stored_before_year_one_still_list(
    api: Api, storage_kind: str, request: pytest.FixtureRequest
) -> None:
    # Before run_at was checked, a run due at 0000-12-31T10:00:00Z could be stored; the
    # thread's listing, the run and GET /api/runs must still answer (at the first instant).
    tid = await api.new_thread()
    run_id = (await api.client.post(
        f"/api/threads/{tid}/effects", json={"name": "ping", "run_at": "2000-01-01T00:00:00Z"}
    )).json()["id"]
    await api.rt.wait_idle()
    before_year_one = -62135596800.0 - 14 * 3600

    def corrupt() -> None:
        if storage_kind == "postgres":
            import psycopg

            from runtime.storage.postgres import split_schema

            url, schema = split_schema(request.getfixturevalue("pg_url"))
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"UPDATE {schema}.effect_runs SET run_at = %s, created_at = %s "
                             "WHERE id = %s", (before_year_one, before_year_one, run_id))
                conn.execute(f"UPDATE {schema}.run_index SET run_at = %s, created_at = %s "
                             "WHERE run_id = %s", (before_year_one, before_year_one, run_id))
            return
        import sqlite3

        data = api.rt.settings.data_dir
        with contextlib.closing(sqlite3.connect(data / "threads" / f"{tid}.sqlite")) as db:
            db.execute("UPDATE effect_runs SET run_at = ?, created_at = ? WHERE id = ?",
                       (before_year_one, before_year_one, run_id))
            db.commit()
        with contextlib.closing(sqlite3.connect(data / "runtime.sqlite")) as db:
            db.execute("UPDATE run_index SET run_at = ?, created_at = ? WHERE run_id = ?",
                       (before_year_one, before_year_one, run_id))
            db.commit()

    await anyio.to_thread.run_sync(corrupt)
    res = await api.client.get(f"/api/threads/{tid}/effects")
    assert res.status_code == 200, res.text
    [listed] = res.json()["runs"]
    assert listed["id"] == run_id and listed["runAt"] == "0001-01-01T00:00:00Z"
    assert listed["createdAt"] == "0001-01-01T00:00:00Z"
    assert (await api.run(tid, run_id))["runAt"] == "0001-01-01T00:00:00Z"
    res = await api.client.get("/api/runs", params={"thread_id": tid})
    assert res.status_code == 200, res.text
    assert [r["id"] for r in res.json()["runs"]] == [run_id]
