"""Thread endpoints and the messages routes over HTTP: file-based routing, params, errors,
collisions, and a message that leads to an effect that posts back into the thread."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest

from runtime import AgentDefinitionError, Runtime
from runtime.endpoints import discover_thread_endpoints
from runtime.http import thread_endpoint_routes
from runtime.testing import FakeClock, override_model
from tests.conftest import DEMO_APP, serve_api
from tests.test_turns import APP, Script, call, text


@asynccontextmanager
async def serve(tmp_path: Path, clock: FakeClock, app_dir: Path = APP) -> AsyncIterator[
    tuple[httpx.AsyncClient, Runtime]
]:
    """The real app (create_app, its error mapping and lifespan) on the turns test app."""
    async with serve_api(tmp_path / "data", clock=clock, app_dir=app_dir) as api:
        yield api.client, api.rt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
async def served(tmp_path: Path, clock: FakeClock) -> AsyncIterator[
    tuple[httpx.AsyncClient, Runtime]
]:
    async with serve(tmp_path, clock) as pair:
        yield pair


async def test_file_routes_static_nested_params_and_rest(
    served: tuple[httpx.AsyncClient, Runtime],
) -> None:
    client, rt = served
    tid = (await rt.create_thread("t1")).thread_id

    status = await client.get(f"/api/threads/{tid}/status")
    assert status.status_code == 200
    assert status.json() == {"thread": "t1", "agent": "helper", "execution": "None", "params": {}}

    index = await client.get(f"/api/threads/{tid}/notes")
    assert index.json() == {"route": "notes index", "params": {}}
    special = await client.get(f"/api/threads/{tid}/notes/special")
    assert special.json() == {"route": "notes special", "params": {}}
    one = await client.get(f"/api/threads/{tid}/notes/n-42")
    assert one.json() == {"route": "one note", "params": {"note_id": "n-42"}}
    deep = await client.get(f"/api/threads/{tid}/files/a/b/c.txt")
    assert deep.status_code == 200 and deep.text == "file a/b/c.txt"

    # Method suffixes: notes/[note_id].delete.py answers DELETE (None -> 204); GET-only
    # files refuse other methods.
    deleted = await client.delete(f"/api/threads/{tid}/notes/n-42")
    assert deleted.status_code == 204
    assert (await client.post(f"/api/threads/{tid}/status")).status_code == 405
    assert (await client.get(f"/api/threads/{tid}/_helpers")).status_code == 404


async def test_unknown_thread_is_404_and_a_raising_handler_a_json_500(
    served: tuple[httpx.AsyncClient, Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    client, rt = served
    missing = await client.get("/api/threads/nope/status")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "thread_not_found"
    bad_id = await client.get("/api/threads/bad.id/status")
    assert bad_id.status_code == 400
    assert bad_id.json()["error"]["code"] == "invalid_thread_id"

    tid = (await rt.create_thread()).thread_id
    boom = await client.get(f"/api/threads/{tid}/boom")
    assert boom.status_code == 500
    body = boom.json()
    assert body["error"]["code"] == "endpoint_error"
    assert "boom.py" in body["error"]["message"]
    assert "Traceback" not in boom.text and "/etc/passwd" not in boom.text
    assert any("secret internals" in (r.exc_text or "") for r in caplog.records)


async def test_an_endpoint_schedules_an_effect_that_posts_into_the_thread(
    served: tuple[httpx.AsyncClient, Runtime], clock: FakeClock
) -> None:
    client, rt = served
    tid = (await rt.create_thread()).thread_id
    res = await client.post(f"/api/threads/{tid}/export", json={"text": "exported", "delay": 5})
    assert res.status_code == 202
    run_id = res.json()["scheduled"]
    thread = await rt.get_thread(tid)
    assert [r.id for r in await thread.get_scheduled_effects()] == [run_id]
    clock.advance(5)
    await rt.wait_idle()
    listed = (await client.get(f"/api/threads/{tid}/messages")).json()
    assert [m["content"] for m in listed["messages"]] == ["note: exported"]
    assert listed["messages"][0]["injected"] is True


async def test_messages_over_http(
    served: tuple[httpx.AsyncClient, Runtime], clock: FakeClock
) -> None:
    client, rt = served
    tid = (await rt.create_thread()).thread_id
    script = Script(call("schedule_note", {"text": "tea", "delay_seconds": 60}), text("Sure."))
    with override_model(rt, script.model):
        res = await client.post(f"/api/threads/{tid}/messages", json={"content": "tea in 1 min"})
    assert res.status_code == 200, res.text
    turn = res.json()
    assert turn["reply"]["content"] == "Sure." and turn["reply"]["role"] == "assistant"
    assert [m["role"] for m in turn["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert turn["messages"][1]["toolCalls"][0]["name"] == "schedule_note"
    assert turn["messages"][2]["toolResults"][0]["isError"] is False
    assert {m["runId"] for m in turn["messages"]} == {turn["runId"]}

    page = (await client.get(f"/api/threads/{tid}/messages", params={"limit": 3})).json()
    assert [m["content"] for m in page["messages"]] == ["tea in 1 min", "", turn["messages"][2][
        "content"]]
    rest = (await client.get(
        f"/api/threads/{tid}/messages", params={"after": page["nextCursor"]}
    )).json()
    assert [m["content"] for m in rest["messages"]] == ["Sure."] and rest["nextCursor"] is None

    clock.advance(60)
    await rt.wait_idle()
    newest = (await client.get(
        f"/api/threads/{tid}/messages", params={"after": rest["messages"][-1]["id"]}
    )).json()
    assert [m["content"] for m in newest["messages"]] == ["note: tea"]
    one = await client.get(f"/api/threads/{tid}/messages/{newest['messages'][0]['id']}")
    assert one.json()["content"] == "note: tea"


async def test_messages_errors_over_http(served: tuple[httpx.AsyncClient, Runtime]) -> None:
    client, rt = served
    tid = (await rt.create_thread()).thread_id

    def code(res: httpx.Response) -> tuple[int, str]:
        body: dict[str, Any] = res.json()
        return res.status_code, body["error"]["code"]

    url = f"/api/threads/{tid}/messages"
    assert code(await client.post("/api/threads/nope/messages", json={"content": "x"})) == (
        404, "thread_not_found")
    assert code(await client.post(url, content=b"{not json")) == (400, "invalid_json")
    assert code(await client.post(url, json={"content": ""})) == (400, "invalid_body")
    assert code(await client.post(url, json={"text": "x"})) == (400, "invalid_body")
    assert code(await client.post(url, json={"content": "x" * 100_001})) == (
        413, "content_too_large")
    assert code(await client.get(url, params={"after": "zzz"})) == (400, "invalid_parameter")
    assert code(await client.get(url, params={"limit": "many"})) == (400, "invalid_parameter")
    assert code(await client.get(f"{url}/nope")) == (404, "message_not_found")

    def broken(messages: Any, info: Any) -> Any:
        raise ConnectionError("model down")

    from pydantic_ai.models.function import FunctionModel

    with override_model(rt, FunctionModel(broken)):
        failed = await client.post(url, json={"content": "hi"})
    assert code(failed) == (502, "turn_failed") and "model down" in failed.text

    free = (await rt.create_thread(agent_id="plain")).thread_id
    rt.agents.agents.pop("plain")  # the app no longer has the thread's agent
    assert code(await client.post(f"/api/threads/{free}/messages", json={"content": "x"})) == (
        409, "no_agent")


async def test_a_malformed_thread_id_is_400_on_every_thread_route(tmp_path: Path) -> None:
    async with serve_api(tmp_path, app_dir=APP) as api:
        bad = "/api/threads/bad%20id"
        answers = [
            await api.client.get(f"{bad}/messages"),
            await api.client.post(f"{bad}/messages", json={"content": "hi"}),
            await api.client.get(f"{bad}/messages/m1"),
            await api.client.get(f"{bad}/status"),
            await api.client.get(f"{bad}/notes/n1"),
            await api.client.get(f"{bad}/effects"),
            await api.client.post(f"{bad}/effects", json={"name": "note"}),
            await api.client.get(f"{bad}/effects/r1"),
            await api.client.delete(bad),
        ]
    for res in answers:
        assert res.status_code == 400, (res.request.url, res.text)
        error = res.json()["error"]
        assert error["code"] == "invalid_thread_id"
        assert '"bad id"' in error["message"] and "^[A-Za-z0-9_-]{1,64}$" in error["message"]


async def test_message_text_that_is_not_unicode_is_400_and_stores_nothing(
    served: tuple[httpx.AsyncClient, Runtime],
) -> None:
    client, rt = served
    thread = await rt.create_thread()
    url = f"/api/threads/{thread.thread_id}/messages"
    res = await client.post(url, content=rb'{"content": "hi \ud800"}')
    assert res.status_code == 400
    error = res.json()["error"]
    assert error["code"] == "invalid_json" and "lone surrogate \\ud800" in error["message"]
    assert "content" in error["message"]
    assert (await client.get(url)).json()["messages"] == []
    # The runtime API refuses it too, before anything is stored.
    from runtime import InvalidArgument

    with pytest.raises(InvalidArgument, match="lone surrogate"):
        await thread.send_message("hi \ud800")
    with pytest.raises(InvalidArgument, match="lone surrogate"):
        await thread.inject_message("\udfff")
    assert (await thread.get_messages()).messages == []


async def test_a_message_during_a_turn_gets_409(
    served: tuple[httpx.AsyncClient, Runtime],
) -> None:
    import asyncio

    from pydantic_ai.models.function import FunctionModel

    client, rt = served
    tid = (await rt.create_thread()).thread_id
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(messages: Any, info: Any) -> Any:
        entered.set()
        await release.wait()
        return text("done")

    url = f"/api/threads/{tid}/messages"
    with override_model(rt, FunctionModel(slow)):
        first = asyncio.create_task(client.post(url, json={"content": "one"}))
        await entered.wait()
        second = await client.post(url, json={"content": "two"})
        release.set()
        assert (await first).status_code == 200
    assert second.status_code == 409 and second.json()["error"]["code"] == "turn_in_progress"


async def test_a_paused_thread_runs_no_turn_409_thread_paused_and_nothing_stored(
    served: tuple[httpx.AsyncClient, Runtime],
) -> None:
    from runtime import ThreadPaused

    client, rt = served
    thread = await rt.create_thread()
    tid = thread.thread_id
    script = Script(call("echo", {"text": "tool ran"}), text("answered"))
    assert (await client.post(f"/api/threads/{tid}/pause")).status_code == 200
    with override_model(rt, script.model):
        refused = await client.post(f"/api/threads/{tid}/messages", json={"content": "hi"})
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "thread_paused"
        assert f"Thread {tid} is paused" in error["message"]
        with pytest.raises(ThreadPaused, match="runs no turn until resumed"):
            await thread.send_message("hi")
        assert len(script.steps) == 2  # the model was never asked: no tool ran
        listed = await client.get(f"/api/threads/{tid}/messages")
        assert listed.json()["messages"] == []

        assert (await client.post(f"/api/threads/{tid}/resume")).status_code == 200
        ok = await client.post(f"/api/threads/{tid}/messages", json={"content": "hi"})
        assert ok.status_code == 200 and ok.json()["reply"]["content"] == "answered"


@pytest.mark.parametrize(
    ("files", "bad", "message"),
    [
        ({"effects.py": 1}, "effects.py", "collides with the built-in route"),
        ({"messages/extra.post.py": 1}, "messages/extra.post.py",
         "collides with the built-in route /api/threads/{tid}/messages"),
        ({"stream/index.py": 1}, "stream/index.py", "collides with the built-in route"),
        ({"index.py": 1}, "index.py", "routes to /api/threads/{tid} itself"),
        ({"[a].py": 1, "[b].py": 1}, "[b].py", "collides with"),
        ({"q/[*].py": 1, "q/[*].get.py": 1}, "q/[*].py", "collides with"),
        ({"x.py": 1, "x.get.py": 1}, "x.py", "collides with"),
        ({"report.fetch.py": 1}, "report.fetch.py", "unknown method suffix 'fetch'"),
        ({"[*]/x.py": 1}, "[*]/x.py", "must be last"),
        ({"[tid].py": 1}, "[tid].py", "reserved"),
        ({"a b.py": 1}, "a b.py", "must be letters, digits"),
        ({"nothing.py": 0}, "nothing.py", "defines no thread endpoint"),
    ],
)
def test_bad_endpoint_files_stop_startup_naming_the_file(
    tmp_path: Path, files: dict[str, int], bad: str, message: str
) -> None:
    endpoint = (
        "from runtime import define_thread_endpoint\n"
        "endpoint = define_thread_endpoint(lambda request, state, params: None)\n"
    )
    for rel, good in files.items():
        path = tmp_path / "api" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(endpoint if good else "x = 1\n")
    with pytest.raises(AgentDefinitionError) as caught:
        thread_endpoint_routes(tmp_path)
    assert str(tmp_path / "api" / bad) in str(caught.value)
    assert message in str(caught.value)


async def test_static_beats_a_param_which_beats_the_rest_at_one_level(
    tmp_path: Path, clock: FakeClock
) -> None:
    def write() -> None:
        labels = {"q/static.py": "static", "q/[a].py": "param", "q/[*].py": "rest"}
        for rel, label in labels.items():
            path = tmp_path / "app" / "api" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                "from runtime import define_thread_endpoint\n"
                f"async def run(request, state, params):\n"
                f"    return {{'route': {label!r}, 'params': params}}\n"
                "endpoint = define_thread_endpoint(run)\n"
            )

    await anyio.to_thread.run_sync(write)
    async with serve(tmp_path, clock, app_dir=tmp_path / "app") as (client, rt):
        tid = (await rt.create_thread()).thread_id
        got = {
            path: (await client.get(f"/api/threads/{tid}/q/{path}")).json()
            for path in ("static", "x", "x/y/z")
        }
    assert got == {
        "static": {"route": "static", "params": {}},
        "x": {"route": "param", "params": {"a": "x"}},
        "x/y/z": {"route": "rest", "params": {"*": "x/y/z"}},
    }


def test_routes_are_ordered_most_specific_first() -> None:
    paths = [(e.method, e.path) for e in discover_thread_endpoints(APP)]
    assert paths == [
        ("GET", "/boom"),
        ("POST", "/export"),
        ("GET", "/files/{_rest:path}"),
        ("GET", "/notes"),
        ("GET", "/notes/special"),
        ("DELETE", "/notes/{note_id}"),
        ("GET", "/notes/{note_id}"),
        ("GET", "/status"),
    ]
    assert discover_thread_endpoints(None) == []


async def test_the_demo_server_reminds_over_http(tmp_path: Path, clock: FakeClock) -> None:
    """The server app on the demo folder, offline: a reminder set in a turn shows up later."""
    async with serve_api(tmp_path / "data", clock=clock, app_dir=DEMO_APP) as api:
        client = api.client
        unknown = await client.post("/api/threads", json={"agent_id": "nobody"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "agent_not_found"
        created = await client.post("/api/threads", json={"user_id": "ada"})
        assert created.status_code == 201 and created.json()["agentId"] == "assistant"
        tid = created.json()["id"]

        greeting = (await client.get(f"/api/threads/{tid}/messages")).json()["messages"]
        assert [m["injected"] for m in greeting] == [True]

        turn = await client.post(
            f"/api/threads/{tid}/messages", json={"content": "remind me in 2 seconds to stretch"}
        )
        assert turn.status_code == 200, turn.text
        assert turn.json()["reply"]["content"] == "OK, I'll remind you to stretch in 2 seconds."
        status = (await client.get(f"/api/threads/{tid}/status")).json()
        assert [e["name"] for e in status["pendingEffects"]] == ["send_reminder"]
        run_at = status["pendingEffects"][0]["runAt"]
        assert run_at.endswith("Z") and "+00:00" not in run_at  # as every other time

        clock.advance(2)
        await api.rt.wait_idle()
        newest = (await client.get(
            f"/api/threads/{tid}/messages", params={"after": turn.json()["reply"]["id"]}
        )).json()["messages"]
        assert len(newest) == 1 and newest[0]["injected"] and newest[0]["role"] == "assistant"
        assert "Reminder" in newest[0]["content"] and "stretch" in newest[0]["content"]
        runs = (await client.get(f"/api/threads/{tid}/effects")).json()["runs"]
        assert [(r["name"], r["status"]) for r in runs] == [("send_reminder", "completed")]

        export = await client.post(f"/api/threads/{tid}/export")
        assert export.status_code == 202


async def test_the_demo_digest_counts_the_other_runs_not_itself(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with serve_api(tmp_path / "data", clock=clock, app_dir=DEMO_APP) as api:
        tid = await api.new_thread()
        await api.schedule(tid, "send_reminder", {"text": "stretch"})
        await api.schedule(tid, "fail_on_purpose", None)
        await api.rt.wait_idle()
        digest_id = await api.schedule(tid, "thread_digest")
        await api.rt.wait_idle()
        assert (await api.run(tid, digest_id))["status"] == "completed"

        def read() -> str:
            return (tmp_path / "data" / "digests" / f"{tid}.txt").read_text()

        line = (await anyio.to_thread.run_sync(read)).strip()
        assert line.endswith("  completed 1, failed 1"), line
