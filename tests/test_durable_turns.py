"""Durable turns inside the runtime: every turn is journaled in its thread's store.

The app (tests/apps/durable_turns) has an agent ``shop`` whose tool ``charge`` appends a
line to a "world" file (``SHOP_WORLD``: the card's statement). Scripted pydantic-ai
``FunctionModel`` s drive the turns; a turn is interrupted by cancelling it (what a
shutdown does) and a restart is a new `Runtime` on the same storage. Every test runs on
every storage backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from conftest import serve_api
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime import MessageRole, RetentionPolicy, Runtime, ThreadState, TurnFailed
from runtime.errors import TurnRunIdConflict
from runtime.storage.base import StorageBackend
from runtime.testing import FakeClock, override_model
from runtime.turns import content_hash, interrupted_text, load_turns, resume_thread_turns
from tests.storage.backends import BACKENDS, make_backend

pytestmark = pytest.mark.usefixtures("no_blocking")
APP = Path(__file__).parent / "apps" / "durable_turns"
START = 1_800_000_000.0


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "world.txt"
    monkeypatch.setenv("SHOP_WORLD", str(path))
    monkeypatch.delenv("SHOP_HANG_FILE", raising=False)
    return path


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StorageBackend:
    return make_backend(request.param, tmp_path / "data")


@asynccontextmanager
async def running(tmp_path: Path, backend: StorageBackend, clock: FakeClock,
                  **options: Any) -> AsyncIterator[Runtime]:
    async with Runtime(data_dir=tmp_path / "data", app_dir=APP, clock=clock,
                       storage=backend, load_packages=False, **options) as rt:
        yield rt


async def charges(world: Path) -> list[str]:
    def read() -> list[str]:
        return world.read_text().splitlines() if world.exists() else []

    return await anyio.to_thread.run_sync(read)


def charging(then: Callable[[], Any]) -> FunctionModel:
    """Step 1 charges order 42; step 2 runs ``then`` (raise, hang) or answers."""

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("charge", {"order": 42})])
        outcome = then()
        if asyncio.iscoroutine(outcome):
            await outcome
        return ModelResponse(parts=[TextPart(f"Done: {returns[0].content}.")])

    return FunctionModel(answer)


def fail() -> None:
    raise RuntimeError("the model is down")


def answer() -> None:
    return None


async def conversation(thread: ThreadState) -> list[tuple[str, str]]:
    page = await thread.get_messages(limit=500)
    return [
        (str(m.role), m.content) for m in page.messages
        if m.content and m.role is not MessageRole.TOOL
    ]


async def test_a_failed_turn_resumed_with_its_run_id_does_not_charge_again(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        thread = await rt.create_thread(agent_id="shop")
        with override_model(rt, charging(fail)), pytest.raises(TurnFailed):
            await thread.send_message("charge order 42", run_id="turn-1")
        assert await charges(world) == ["charged order 42"]
        [row] = (await load_turns(rt, thread.thread_id)).values()
        assert (row.status, row.attempts) == ("failed", 1)
        assert "the model is down" in (row.error or "")

        with override_model(rt, charging(answer)):
            result = await thread.send_message("charge order 42", run_id="turn-1")
        assert await charges(world) == ["charged order 42"]
        assert result.run_id == "turn-1"
        assert result.reply is not None
        assert result.reply.content == "Done: order 42 charged."
        # One user message; the failed attempt's completed step (the call and its result)
        # is not stored twice; one final answer.
        messages = (await thread.get_messages(limit=500)).messages
        assert [m.role for m in messages] == [
            MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.ASSISTANT
        ]
        assert [m.id for m in result.messages] == [m.id for m in messages]
        [row] = (await load_turns(rt, thread.thread_id)).values()
        assert (row.status, row.attempts, row.error) == ("succeeded", 2, None)


async def test_a_finished_turn_asked_again_answers_from_the_conversation(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        thread = await rt.create_thread(agent_id="shop")
        with override_model(rt, charging(answer)):
            first = await thread.send_message("charge order 42", run_id="turn-1")
            again = await thread.send_message("charge order 42", run_id="turn-1")
        assert await charges(world) == ["charged order 42"]
        assert again.to_json() == first.to_json()
        assert len((await thread.get_messages(limit=500)).messages) == 4
        # A finished turn's row keeps the message's hash, not its text.
        [row] = (await load_turns(rt, thread.thread_id)).values()
        assert (row.status, row.content, row.content_hash) == (
            "succeeded", "", content_hash("charge order 42"))
        with pytest.raises(TurnRunIdConflict, match=r"turn-1.*another message"):
            await thread.send_message("charge order 43", run_id="turn-1")
        with pytest.raises(ValueError, match="run_id must be 1-64 characters"):
            await thread.send_message("charge order 42", run_id="no spaces")
        assert await charges(world) == ["charged order 42"]


async def test_a_turn_asked_again_while_it_runs_waits_for_its_answer(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    go = asyncio.Event()
    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        thread = await rt.create_thread(agent_id="shop")
        with override_model(rt, charging(go.wait)):
            first = asyncio.create_task(thread.send_message("charge order 42", run_id="t1"))
            while not await charges(world):
                await asyncio.sleep(0.01)
            second = asyncio.create_task(thread.send_message("charge order 42", run_id="t1"))
            await asyncio.sleep(0.05)
            assert not second.done()
            go.set()
            one, two = await first, await second
        assert one.to_json() == two.to_json()
        assert await charges(world) == ["charged order 42"]


async def interrupt(rt: Runtime, thread: ThreadState, run_id: str, world: Path,
                    seen: int) -> None:
    """Start a turn that charges, then hangs; cancel it once it charged (a shutdown).

    The cancel comes once the model's next step has begun: the charge's journal record
    was written before that (a cancel between the side effect and its record would run
    the charge again on resume: the crash window, docs/durable-turns.md).
    """
    next_step = asyncio.Event()

    async def hang() -> None:
        next_step.set()
        await asyncio.Event().wait()

    with override_model(rt, charging(hang)):
        task = asyncio.create_task(thread.send_message("charge order 42", run_id=run_id))
        async with asyncio.timeout(30):  # a guard against a hang, not a measurement
            await next_step.wait()
        assert len(await charges(world)) == seen
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_an_interrupted_turn_resumes_by_itself_at_the_next_start(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    clock = FakeClock(start=START)
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.create_thread(agent_id="shop")
        tid = thread.thread_id
        await interrupt(rt, thread, "turn-1", world, 1)
        [row] = (await load_turns(rt, tid)).values()
        assert (row.status, row.attempts) == ("running", 1)
    # The agent's own model answers the resumed step (the tests' override is gone).
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.get_thread(tid)
        for _ in range(1000):
            [row] = (await load_turns(rt, tid)).values()
            if row.status != "running":
                break
            await asyncio.sleep(0.01)
        assert (row.status, row.attempts) == ("succeeded", 2)
        assert await charges(world) == ["charged order 42"]
        assert await conversation(thread) == [
            ("user", "charge order 42"), ("assistant", "Done: order 42 charged."),
        ]
        messages = (await thread.get_messages(limit=500)).messages
        assert [m.role for m in messages] == [
            MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.ASSISTANT
        ]
        assert {m.run_id for m in messages} == {"turn-1"}
        # The charge had finished before the interruption: its result came from the journal.
        assert [(r.content, r.from_journal) for r in messages[2].tool_results] == [
            ("order 42 charged", True)
        ]


async def test_the_third_interruption_fails_the_turn_with_a_message(
    tmp_path: Path, backend: StorageBackend, world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(start=START)
    # Resumed at every start, the turn hangs again in its second step.
    hang = tmp_path / "hang"
    hang.touch()
    monkeypatch.setenv("SHOP_HANG_FILE", str(hang))
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.create_thread(agent_id="shop")
        tid = thread.thread_id
        await interrupt(rt, thread, "turn-1", world, 1)
    for attempt in (2, 3):
        async with running(tmp_path, backend, clock) as rt:
            for _ in range(1000):
                [row] = (await load_turns(rt, tid)).values()
                if row.attempts == attempt and rt.turns.running(tid) is not None:
                    break
                await asyncio.sleep(0.01)
            assert (row.status, row.attempts) == ("running", attempt)
            await asyncio.sleep(0.05)
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.get_thread(tid)
        for _ in range(1000):
            [row] = (await load_turns(rt, tid)).values()
            if row.status != "running":
                break
            await asyncio.sleep(0.01)
        assert (row.status, row.attempts) == ("failed", 3)
        assert row.error == "interrupted 3 times"
        assert await conversation(thread) == [
            ("user", "charge order 42"), ("assistant", interrupted_text(3)),
        ]
        assert await charges(world) == ["charged order 42"]


async def test_the_journal_goes_with_retention_and_with_the_thread(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    clock = FakeClock(start=START)
    retention = RetentionPolicy(effect_records_seconds=3600)
    async with running(tmp_path, backend, clock, retention=retention) as rt:
        thread = await rt.create_thread(agent_id="shop")
        tid = thread.thread_id
        with override_model(rt, charging(answer)):
            await thread.send_message("charge order 42", run_id="old")
            assert await rt.effect_records.get(tid, "durable:run:old:model:1") is not None
            clock.advance(7200)
            await thread.send_message("charge order 43", run_id="new")
        # The turn's records are the journal, not effect records: not listed.
        assert (await thread.list_effect_records()).records == []
        assert await rt.effect_records.get(tid, "durable:run:old:model:1") is None
        assert await rt.effect_records.get(tid, "durable:run:new:model:1") is not None
        assert await rt.delete_thread(tid)
        other = await rt.create_thread(agent_id="shop", thread_id=tid)
        assert await rt.effect_records.get(other.thread_id, "durable:run:new:model:1") is None


async def test_the_same_run_id_posted_twice_over_http_is_one_turn(
    tmp_path: Path, world: Path
) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(start=START), app_dir=APP) as api:
        tid = await api.new_thread(agent_id="shop")
        body = {"content": "charge order 42", "run_id": "client-7"}
        first = await api.client.post(f"/api/threads/{tid}/messages", json=body)
        again = await api.client.post(f"/api/threads/{tid}/messages", json=body)
        assert first.status_code == again.status_code == 200, first.text
        assert again.json() == first.json()
        assert first.json()["runId"] == "client-7"
        assert first.json()["reply"]["content"] == "Done: order 42 charged."
        assert await charges(world) == ["charged order 42"]
        listed = (await api.client.get(f"/api/threads/{tid}/messages")).json()["messages"]
        assert [m["role"] for m in listed] == ["user", "assistant", "tool", "assistant"]
        turns = (await api.client.get(f"/api/threads/{tid}/turns")).json()["turns"]
        assert [(t["runId"], t["status"], t["attempts"], t["resumed"]) for t in turns] == [
            ("client-7", "succeeded", 1, False)
        ]
        conflict = await api.client.post(f"/api/threads/{tid}/messages",
                                         json={"content": "charge order 9", "run_id": "client-7"})
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "run_id_conflict"
        bad = await api.client.post(f"/api/threads/{tid}/messages",
                                    json={"content": "hi", "run_id": "x" * 65})
        assert bad.status_code == 400
        assert "run_id must be 1-64 characters" in bad.json()["error"]["message"]


@pytest.mark.parametrize("fails", [False, True], ids=["answers", "fails"])
async def test_the_same_run_id_posted_at_once_waits_for_the_one_turn(
    tmp_path: Path, world: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    hang = tmp_path / "hang"
    hang.touch()
    monkeypatch.setenv("SHOP_HANG_FILE", str(hang))
    if fails:
        monkeypatch.setenv("SHOP_FAIL_FILE", str(world))  # step 2 raises once it goes on
    async with serve_api(tmp_path / "data", clock=FakeClock(start=START), app_dir=APP) as api:
        tid = await api.new_thread(agent_id="shop")
        body = {"content": "charge order 42", "run_id": "client-8"}
        posts = [asyncio.ensure_future(
            api.client.post(f"/api/threads/{tid}/messages", json=body)) for _ in range(6)]
        while not await charges(world):  # the turn charged; its next step hangs
            await asyncio.sleep(0.01)
        await anyio.to_thread.run_sync(hang.unlink)
        answers = await asyncio.gather(*posts)
        if fails:
            assert [a.status_code for a in answers] == [502] * 6, [a.text for a in answers]
            assert {a.json()["error"]["code"] for a in answers} == {"turn_failed"}
        else:
            assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
            assert {a.json()["reply"]["content"] for a in answers} == {"Done: order 42 charged."}
        assert await charges(world) == ["charged order 42"]
        listed = (await api.client.get(f"/api/threads/{tid}/messages")).json()["messages"]
        assert [m["role"] for m in listed if m["role"] == "user"] == ["user"]
        turns = (await api.client.get(f"/api/threads/{tid}/turns")).json()["turns"]
        assert [(t["runId"], t["attempts"]) for t in turns] == [("client-8", 1)]


def calling(*steps: list[tuple[str, dict[str, Any]]]) -> FunctionModel:
    """Each step calls the given tools (fresh call ids every time), then answers "ok"."""
    queue = list(steps)
    ids = iter(range(1_000_000))

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not queue:
            return ModelResponse(parts=[TextPart("ok")])
        return ModelResponse(parts=[
            ToolCallPart(name, args, tool_call_id=f"call-{next(ids)}")
            for name, args in queue.pop(0)
        ])

    return FunctionModel(answer)


def results(result: Any) -> list[str]:
    return [r.content for m in result.messages for r in m.tool_results]


async def test_a_tool_with_idempotency_args_runs_once_per_arguments_in_a_turn(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    receipt = {"order": 42, "email": "a@example.com"}
    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        thread = await rt.create_thread(agent_id="shop")
        # Fresh call ids, the same arguments (in another key order): one receipt.
        model = calling([("send_receipt", receipt)],
                        [("send_receipt", {"email": "a@example.com", "order": 42})],
                        [("send_receipt", {**receipt, "order": 43})])
        with override_model(rt, model):
            result = await thread.send_message("receipts please")
        assert await charges(world) == ["receipt 42 to a@example.com",
                                        "receipt 43 to a@example.com"]
        assert results(result) == ["receipt for order 42 sent"] * 2 + [
            "receipt for order 43 sent"]
        assert [r.from_journal for m in result.messages for r in m.tool_results] == [
            False, True, False
        ]
        # A new turn sends it again: the "args" window is the turn.
        with override_model(rt, calling([("send_receipt", receipt)])):
            await thread.send_message("again")
        assert len(await charges(world)) == 3


async def test_keyed_tools_run_once_per_window(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        first = await rt.create_thread(agent_id="shop")
        second = await rt.create_thread(agent_id="shop")
        ship = ("ship", {"order": 7, "note": "fragile"})
        refund = ("refund", {"order": 7})
        with override_model(rt, calling([ship, refund], [("ship", {"order": 7})])):
            await first.send_message("ship and refund")
        with override_model(rt, calling([ship, refund])):
            again = await first.send_message("once more")
        assert results(again) == ["order 7 shipped", "order 7 refunded"]
        # "thread": once in this thread, again in another; "cross-run": once everywhere.
        with override_model(rt, calling([ship, refund])):
            await second.send_message("ship and refund")
        # (The two calls of a step run concurrently: their lines come in either order.)
        assert sorted(await charges(world)) == ["refunded order 7", "shipped order 7",
                                                "shipped order 7"]
        # The cross-run key is in the runtime database, not in a thread.
        from runtime.durable import CROSS_RUN_THREAD

        record = await rt.runtime_records.get(CROSS_RUN_THREAD, "durable:key:refund:7")
        assert record is not None and record.result == "order 7 refunded"
        assert await rt.runtime_records.get(CROSS_RUN_THREAD, "durable:key:ship:order-7") is None


def test_a_key_without_a_window_is_refused_where_the_tool_is_declared() -> None:
    from pydantic import BaseModel

    from runtime import define_tool

    class Order(BaseModel):
        order: int

    def ship_order(state: ThreadState, args: Order) -> str:
        return "shipped"

    with pytest.raises(TypeError, match="'ship_order' has an idempotency_key but no "
                                        "idempotency_window; choose a window"):
        define_tool("Ships.", Order, ship_order, idempotency_key=lambda a: str(a.order))
    with pytest.raises(ValueError, match="idempotency must be 'call' or 'args'"):
        define_tool("Ships.", Order, ship_order, idempotency="once")
    with pytest.raises(ValueError, match="idempotency_window must be"):
        define_tool("Ships.", Order, ship_order, idempotency_key=lambda a: "k",
                    idempotency_window="forever")
    with pytest.raises(TypeError, match="'ship_order': idempotency_key must be a function"):
        define_tool("Ships.", Order, ship_order, idempotency_key="fixed",  # type: ignore[arg-type]
                    idempotency_window="run")


async def test_resuming_waits_for_a_turn_the_thread_runs(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        thread = await rt.create_thread(agent_id="shop")
        tid = thread.thread_id
        await interrupt(rt, thread, "t1", world, 1)
        go = asyncio.Event()
        with override_model(rt, charging(go.wait)):
            other = asyncio.create_task(thread.send_message("charge order 42", run_id="t2"))
            while len(await charges(world)) < 2:
                await asyncio.sleep(0.01)
            resuming = asyncio.create_task(resume_thread_turns(rt, tid))
            await asyncio.sleep(0.05)
            assert not resuming.done()  # t2 holds the thread
            go.set()
            await other
            assert await resuming == 1
        rows = await load_turns(rt, tid)
        # Oldest change first: t2 ended, then t1 was resumed.
        assert [(r.run_id, r.status, r.attempts) for r in rows.values()] == [
            ("t2", "succeeded", 1), ("t1", "succeeded", 2)
        ]
        assert await charges(world) == ["charged order 42"] * 2  # t1 once, t2 once
        # Nothing is left to resume.
        assert await resume_thread_turns(rt, tid) == 0


async def test_metrics_count_a_resumed_turn_once_and_no_replayed_tool_call(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    from runtime.metrics import RuntimeMetrics

    async with running(tmp_path, backend, FakeClock(start=START)) as rt:
        metrics = RuntimeMetrics(rt)
        try:
            thread = await rt.create_thread(agent_id="shop")
            tid = thread.thread_id
            await interrupt(rt, thread, "turn-1", world, 1)
            with override_model(rt, charging(answer)):
                assert await resume_thread_turns(rt, tid) == 1
            [row] = (await load_turns(rt, tid)).values()
            assert (row.status, row.attempts) == ("succeeded", 2)
            assert await charges(world) == ["charged order 42"]
            sample = metrics.registry.get_sample_value
            # One turn (its user message, not stored again by the resumed attempt). The
            # charge's result in the conversation came from the journal: not counted (the
            # interrupted attempt that ran it stored no messages, so it is not counted
            # either).
            assert sample("thread_effects_turns_total") == 1
            assert sample("thread_effects_tool_calls_total",
                          {"tool": "charge", "outcome": "ok"}) is None
            messages = (await thread.get_messages(limit=500)).messages
            assert [r.from_journal for m in messages for r in m.tool_results] == [True]
        finally:
            metrics.close()


async def resumed_and_hanging(rt: Runtime, tid: str) -> None:
    """Wait until the turn resumed at start runs its second attempt (its model hangs)."""
    for _ in range(1000):
        rows = await load_turns(rt, tid)
        if rows["turn-1"].attempts == 2 and rt.turns.running(tid) is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the turn was not resumed")


@pytest.fixture
def hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hang"
    path.touch()
    monkeypatch.setenv("SHOP_HANG_FILE", str(path))
    return path


async def test_a_shutdown_waits_for_a_turn_resumed_at_start(
    tmp_path: Path, backend: StorageBackend, world: Path, hang: Path
) -> None:
    clock = FakeClock(start=START)
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.create_thread(agent_id="shop")
        tid = thread.thread_id
        await interrupt(rt, thread, "turn-1", world, 1)
    async with running(tmp_path, backend, clock, shutdown_grace_seconds=60) as rt:
        await resumed_and_hanging(rt, tid)
        closing = asyncio.create_task(rt.close())
        while not rt.shutting_down:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert not closing.done()  # the resumed turn holds the shutdown
        await anyio.to_thread.run_sync(hang.unlink)
        await closing
    async with running(tmp_path, backend, clock) as rt:
        [row] = (await load_turns(rt, tid)).values()
        assert (row.status, row.attempts) == ("succeeded", 2)  # finished in the grace
        assert await conversation(await rt.get_thread(tid)) == [
            ("user", "charge order 42"), ("assistant", "Done: order 42 charged."),
        ]
        assert await charges(world) == ["charged order 42"]


async def test_deleting_a_thread_cancels_its_turn_resumed_at_start(
    tmp_path: Path, backend: StorageBackend, world: Path, hang: Path
) -> None:
    clock = FakeClock(start=START)
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.create_thread("shop-1", agent_id="shop")
        await interrupt(rt, thread, "turn-1", world, 1)
    async with running(tmp_path, backend, clock) as rt:
        await resumed_and_hanging(rt, "shop-1")
        assert await rt.delete_thread("shop-1")
        assert rt.turns.running("shop-1") is None  # canceled before the delete returned
        again = await rt.create_thread("shop-1", agent_id="shop")
        assert (await again.get_messages()).messages == []
        assert await load_turns(rt, "shop-1") == {}
        assert await charges(world) == ["charged order 42"]


async def test_a_paused_thread_resumes_its_interrupted_turn_only_once_resumed(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    clock = FakeClock(start=START)
    async with running(tmp_path, backend, clock) as rt:
        thread = await rt.create_thread(agent_id="shop")
        tid = thread.thread_id
        await interrupt(rt, thread, "turn-1", world, 1)
        await rt.pause_thread(tid)
    async with running(tmp_path, backend, clock) as rt:
        assert await resume_thread_turns(rt, tid) == 0  # paused: left for later
        [row] = (await load_turns(rt, tid)).values()
        assert (row.status, row.attempts) == ("running", 1)
        await rt.resume_thread(tid)
    async with running(tmp_path, backend, clock) as rt:
        for _ in range(1000):
            [row] = (await load_turns(rt, tid)).values()
            if row.status != "running":
                break
            await asyncio.sleep(0.01)
        assert (row.status, row.attempts) == ("succeeded", 2)
        assert await charges(world) == ["charged order 42"]


async def test_runtime_level_records_renew_only_the_owners_live_lease(
    tmp_path: Path, backend: StorageBackend, world: Path
) -> None:
    clock = FakeClock(start=START)
    async with running(tmp_path, backend, clock) as rt:
        store = rt.runtime_records
        claim = await store.begin("scope", "k", tool_name="refund", run_id=None, owner="a",
                                  lease_seconds=10)
        assert claim.claimed
        clock.advance(8)
        assert await store.renew("scope", "k", owner="a", lease_seconds=10)
        clock.advance(8)  # 16 s after the claim: alive only because it was renewed
        assert not (await store.begin("scope", "k", tool_name="refund", run_id=None,
                                      owner="b", lease_seconds=10)).claimed
        assert not await store.renew("scope", "k", owner="b", lease_seconds=10)
        clock.advance(2)
        assert (await store.begin("scope", "k", tool_name="refund", run_id=None, owner="b",
                                  lease_seconds=10)).took_over
        assert not await store.renew("scope", "k", owner="a", lease_seconds=10)  # lost it
        with pytest.raises(ValueError, match="lease"):
            await store.renew("scope", "k", owner="b", lease_seconds=0)
