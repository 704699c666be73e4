"""Effect tools inside the runtime's turns: records in the thread's own store.

The app (tests/apps/effect_tools) has an agent ``notes`` whose effect tool ``post_note``
appends a line with ``effect_marker(key)`` to a "world" file (``NOTES_WORLD``) under the key
``note:<topic>``, and a streaming effect tool ``count_up`` with the default key. A scripted
pydantic-ai ``FunctionModel`` drives each turn. Every test runs on every storage backend.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from conftest import serve_api
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime import Runtime, ThreadState
from runtime.events import EffectRecordChanged, MessageCreated
from runtime.testing import FakeClock, override_model
from tests.storage.backends import BACKENDS, make_backend

pytestmark = pytest.mark.usefixtures("no_blocking")
APP = Path(__file__).parent / "apps" / "effect_tools"
DAY = 86_400.0


def scripted(*calls: list[dict[str, Any]]) -> FunctionModel:
    """Each model step calls ``post_note`` with the given args (several: in one response)."""
    steps = list(calls)

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in last.parts
        ) and not steps:
            return ModelResponse(parts=[TextPart("done")])
        if not steps:
            return ModelResponse(parts=[TextPart("nothing to do")])
        step = steps.pop(0)
        return ModelResponse(parts=[
            ToolCallPart("post_note", args, tool_call_id=f"c{len(steps)}-{i}")
            for i, args in enumerate(step)
        ])

    return FunctionModel(answer)


async def lines(path: Path) -> list[str]:
    def read() -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    return await anyio.to_thread.run_sync(read)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "world.txt"
    monkeypatch.setenv("NOTES_WORLD", str(path))
    monkeypatch.delenv("NOTES_HANG_FILE", raising=False)
    return path


@pytest.fixture(params=BACKENDS)
async def rt(request: pytest.FixtureRequest, tmp_path: Path, world: Path) -> AsyncIterator[Runtime]:
    storage = make_backend(request.param, tmp_path / "data")
    clock = FakeClock(start=1_800_000_000.0)
    async with Runtime(data_dir=tmp_path / "data", app_dir=APP, clock=clock, storage=storage,
                       load_packages=False) as runtime:
        yield runtime


async def turn(thread: ThreadState, model: FunctionModel, text: str = "post it") -> Any:
    with override_model(thread.runtime, model):
        return await thread.send_message(text)


NOTE = {"topic": "release", "text": "Shipped 1.2"}


async def test_two_identical_calls_in_one_step_of_a_turn_apply_once(
    rt: Runtime, world: Path
) -> None:
    thread = await rt.create_thread(agent_id="notes")
    async with thread.subscribe() as events:
        result = await turn(thread, scripted([NOTE, NOTE]))
        # Frames reach a subscriber after the call that made them returns (on PostgreSQL
        # through the database): wait for them as a client does, up to the frame of the
        # turn's last message (stored after both calls ended).
        last = result.messages[-1].id
        frames = []
        async with asyncio.timeout(30):  # a guard against a hang, not a measurement
            async for event in events:
                if isinstance(event, EffectRecordChanged):
                    frames.append(event.to_frame())
                elif isinstance(event, MessageCreated) and event.message.id == last:
                    break
    assert len(await lines(world)) == 1
    returned = [
        (r.is_error, json.loads(r.content)) for m in result.messages for r in m.tool_results
    ]
    assert returned == [(False, {"note": 1, "reconciled": False})] * 2
    page = await thread.list_effect_records()
    [record] = page.records
    assert record.key == "note:release" and record.tool_name == "post_note"
    assert record.status.value == "applied" and record.result == {"note": 1, "reconciled": False}
    assert record.run_id == result.run_id
    # The frames: one claim, one application (the second call waited and read the record).
    assert [(f["eventType"], f["data"]["change"], f["data"]["status"]) for f in frames] == [
        ("effect_record_changed", "claimed", "in_progress"),
        ("effect_record_changed", "applied", "applied"),
    ]
    assert frames[-1]["data"]["key"] == "note:release"
    assert frames[-1]["data"]["result"] == {"note": 1, "reconciled": False}
    assert "threadId" not in frames[-1]["data"] and frames[-1]["threadId"] == thread.thread_id
    # Hooks wrap effect tools as any tool: both calls succeeded, with the recorded result.
    seen = rt.agents.hooks["count_calls"].execute.__globals__["SEEN"]
    mine = [s for s in seen if s[2] == result.run_id]
    assert mine == [("post_note", {"note": 1, "reconciled": False}, result.run_id)] * 2


async def test_a_later_turn_with_the_same_key_applies_nothing(rt: Runtime, world: Path) -> None:
    thread = await rt.create_thread(agent_id="notes")
    await turn(thread, scripted([NOTE]))
    await turn(thread, scripted([{"topic": "release", "text": "Shipped 1.2, again"}]))
    assert len(await lines(world)) == 1
    # Another thread has its own records: there the key is not recorded, so the call asks
    # already_applied, which finds the note in the (shared) world and applies nothing.
    other = await rt.create_thread(agent_id="notes")
    await turn(other, scripted([NOTE]))
    assert len(await lines(world)) == 1
    [record] = (await other.list_effect_records()).records
    assert record.result == {"note": 1, "reconciled": True}


async def test_a_key_in_progress_of_a_dead_holder_is_reconciled_through_already_applied(
    rt: Runtime, world: Path
) -> None:
    thread = await rt.create_thread(agent_id="notes")
    # What a killed process leaves: the note in the world, the key in progress under it.
    key = "note:release"
    from runtime import effect_marker

    await anyio.to_thread.run_sync(world.write_text, f"Shipped 1.2 {effect_marker(key)}\n")
    claim = await rt.effect_records.begin(
        thread.thread_id, key, tool_name="post_note", run_id="dead-turn", owner="dead",
        lease_seconds=rt.settings.effect_tool_lease_seconds,
    )
    assert claim.claimed
    rt.clock.advance(rt.settings.effect_tool_lease_seconds + 1)  # type: ignore[attr-defined]
    await turn(thread, scripted([NOTE]))
    assert len(await lines(world)) == 1  # applied nothing
    [record] = (await thread.list_effect_records()).records
    assert record.status.value == "applied" and record.result == {"note": 1, "reconciled": True}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_after_a_restart_a_key_left_in_progress_is_taken_over_at_once(
    backend: str, tmp_path: Path, world: Path
) -> None:
    from runtime import effect_marker

    storage = make_backend(backend, tmp_path / "data")
    clock = FakeClock(start=1_800_000_000.0)

    def runtime() -> Runtime:
        return Runtime(data_dir=tmp_path / "data", app_dir=APP, clock=clock, storage=storage,
                       load_packages=False)

    async with runtime() as rt:
        thread = await rt.create_thread("t1", agent_id="notes")
        # A call of another (now dead) process: the note applied, the key in progress.
        await anyio.to_thread.run_sync(
            world.write_text, f"Shipped 1.2 {effect_marker('note:release')}\n"
        )
        claim = await rt.effect_records.begin(
            "t1", "note:release", tool_name="post_note", run_id="dead-turn",
            owner="gone-host:1:abc", lease_seconds=3600.0,
        )
        assert claim.claimed
    async with runtime() as rt:
        thread = await rt.get_thread("t1")
        # No clock advance: opening the thread ended the dead process's lease.
        await turn(thread, scripted([NOTE]))
        assert len(await lines(world)) == 1
        [record] = (await thread.list_effect_records()).records
        assert record.status.value == "applied"
        assert record.result == {"note": 1, "reconciled": True}


async def test_deleting_the_thread_deletes_its_records(rt: Runtime, world: Path) -> None:
    thread = await rt.create_thread("t1", agent_id="notes")
    await turn(thread, scripted([NOTE]))
    assert len((await thread.list_effect_records()).records) == 1
    assert await rt.delete_thread("t1")
    again = await rt.create_thread("t1", agent_id="notes")
    assert (await again.list_effect_records()).records == []
    await turn(again, scripted([NOTE]))  # a new thread: no record, reconciled from the world
    assert len(await lines(world)) == 1
    [record] = (await again.list_effect_records()).records
    assert record.result == {"note": 1, "reconciled": True}


async def test_records_past_retention_are_purged_on_the_write_path(
    rt: Runtime, world: Path
) -> None:
    thread = await rt.create_thread(agent_id="notes")
    await turn(thread, scripted([NOTE]))
    clock: FakeClock = rt.clock  # type: ignore[assignment]
    clock.advance(rt.settings.retention.effect_records_seconds + DAY)
    assert len((await thread.list_effect_records()).records) == 1  # reads never delete
    await turn(thread, scripted([{"topic": "launch", "text": "Launched"}]))
    assert [r.key for r in (await thread.list_effect_records()).records] == ["note:launch"]


async def test_records_are_listed_over_http_newest_first_in_pages(
    tmp_path: Path, world: Path
) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(start=1_800_000_000.0),
                         app_dir=APP) as api:
        tid = await api.new_thread(agent_id="notes")
        thread = await api.rt.get_thread(tid)
        await turn(thread, scripted([NOTE]))
        api.clock.advance(1)  # type: ignore[union-attr]
        await turn(thread, scripted([{"topic": "launch", "text": "Launched"}]))
        res = await api.client.get(f"/api/threads/{tid}/effect-records", params={"limit": 1})
        assert res.status_code == 200, res.text
        body = res.json()
        [first] = body["records"]
        assert first["key"] == "note:launch" and first["toolName"] == "post_note"
        assert first["status"] == "applied" and first["result"] == {"note": 2,
                                                                    "reconciled": False}
        assert first["createdAt"].endswith("Z") and first["runId"]
        res = await api.client.get(f"/api/threads/{tid}/effect-records",
                                   params={"limit": 1, "cursor": body["nextCursor"]})
        assert [r["key"] for r in res.json()["records"]] == ["note:release"]
        assert res.json()["nextCursor"] is None
        res = await api.client.get(f"/api/threads/{tid}/effect-records",
                                   params={"status": "in_progress"})
        assert res.json() == {"records": [], "nextCursor": None}
        res = await api.client.get(f"/api/threads/{tid}/effect-records",
                                   params={"status": "done"})
        assert res.status_code == 400 and "in_progress, applied" in res.text
        res = await api.client.get(f"/api/threads/{tid}/effect-records",
                                   params={"cursor": "x"})
        assert res.status_code == 400 and "cursor" in res.text
        for limit in ("0", "1001", "many"):
            res = await api.client.get(f"/api/threads/{tid}/effect-records",
                                       params={"limit": limit})
            assert res.status_code == 400 and "from 1 to 1000" in res.text, res.text
        res = await api.client.get(f"/api/threads/{tid}/effect-records",
                                   params={"limit": "1000"})
        assert res.status_code == 200
        res = await api.client.get("/api/threads/nope/effect-records")
        assert res.status_code == 404
        res = await api.client.delete(f"/api/threads/{tid}")
        assert res.status_code == 200
        res = await api.client.get(f"/api/threads/{tid}/effect-records")
        assert res.status_code == 404


async def test_the_runtime_store_purges_by_age_across_threads_and_per_thread(
    rt: Runtime, world: Path
) -> None:
    from datetime import UTC, datetime

    first = await rt.create_thread(agent_id="notes")
    second = await rt.create_thread(agent_id="notes")
    await turn(first, scripted([NOTE]))
    await turn(second, scripted([{"topic": "launch", "text": "Launched"}]))
    clock: FakeClock = rt.clock  # type: ignore[assignment]
    clock.advance(10)
    await turn(second, scripted([{"topic": "later", "text": "Later"}]))
    cutoff = datetime.fromtimestamp(clock.now() - 5, UTC)
    # Two effect records, and the journal of the two turns (two model steps and one tool
    # call each: docs/durable-turns.md), which lives and is purged beside them.
    assert await rt.effect_records.purge(older_than=cutoff) == 2 + 2 * 3
    assert (await first.list_effect_records()).records == []
    assert [r.key for r in (await second.list_effect_records()).records] == ["note:later"]
    assert await rt.effect_records.purge_thread(second.thread_id) == 1 + 3
    assert (await second.list_effect_records()).records == []
    with pytest.raises(ValueError, match="timezone-aware"):
        await rt.effect_records.purge(older_than=datetime(2026, 1, 1))


async def test_a_streaming_effect_tool_records_its_last_value_in_a_turn(rt: Runtime) -> None:
    thread = await rt.create_thread(agent_id="notes")
    calls = rt.agents.tools["count_up"].execute.__globals__["CALLS"]
    calls.clear()

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[
            ToolCallPart("count_up", {"n": 3}, tool_call_id="a"),
            ToolCallPart("count_up", {"n": 3}, tool_call_id="b"),
        ])

    result = await turn(thread, FunctionModel(answer))
    returned = [json.loads(r.content) for m in result.messages for r in m.tool_results]
    assert returned == [{"at": 3}, {"at": 3}]
    assert calls == [3]  # two identical calls in one step: one application
    [record] = (await thread.list_effect_records()).records
    assert record.tool_name == "count_up" and record.result == {"at": 3}
    assert record.key.startswith(f"{result.run_id}:count_up:")  # the default key


async def test_listings_cut_large_results_and_the_single_record_route_serves_them_in_full(
    tmp_path: Path,
) -> None:
    import json

    async with serve_api(tmp_path / "data", clock=FakeClock(start=1_800_000_000.0),
                         app_dir=APP) as api:
        tid = await api.new_thread(agent_id="notes")
        records = api.rt.effect_records
        big = {"text": "x" * 5000}
        for key, result in (("run-1:big/one?", big), ("run-1:small", {"ok": True})):
            await records.begin(tid, key, tool_name="post_note", run_id="run-1", owner="o",
                                lease_seconds=60)
            await records.complete(tid, key, owner="o", result_json=json.dumps(result))
        listed = (await api.client.get(f"/api/threads/{tid}/effect-records")).json()
        by_key = {r["key"]: r for r in listed["records"]}
        cut = by_key["run-1:big/one?"]
        assert cut["resultTruncated"] is True and cut["result"] is None
        assert cut["resultChars"] == len(json.dumps(big))
        assert cut["resultPreview"] == json.dumps(big)[:2000] + "…"
        small = by_key["run-1:small"]
        assert small["resultTruncated"] is False and small["result"] == {"ok": True}
        assert "resultPreview" not in small

        from urllib.parse import quote

        res = await api.client.get(
            f"/api/threads/{tid}/effect-records/{quote('run-1:big/one?', safe='')}")
        assert res.status_code == 200, res.text
        full = res.json()
        assert full["result"] == big and full["resultTruncated"] is False
        assert full["key"] == "run-1:big/one?" and full["status"] == "applied"
        res = await api.client.get(f"/api/threads/{tid}/effect-records/run-1:nope")
        assert res.status_code == 404
        assert res.json()["error"]["code"] == "effect_record_not_found"
        assert "run-1:nope" in res.json()["error"]["message"]
        res = await api.client.get("/api/threads/nope/effect-records/k")
        assert res.status_code == 404 and res.json()["error"]["code"] == "thread_not_found"
