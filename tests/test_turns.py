"""Turns as a user sees them: replies, stored messages, tools that schedule effects, effects
that post into the conversation, one turn at a time, failures, and the offline demo."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime import (
    EffectStatus,
    Execution,
    MessageNotFound,
    MessageRole,
    ModelNotAvailable,
    Runtime,
    ThreadState,
    TurnFailed,
    TurnInProgress,
)
from runtime.storage.models import (
    THREAD_MIGRATION_COLUMNS,
    THREAD_MIGRATION_MODELS,
    migration_ddl,
)
from runtime.storage.sqlite import THREAD_SCHEMA_VERSION
from runtime.testing import FakeClock, demo_model, override_model, parse_reminder
from tests.storage.backends import BACKENDS, make_backend

pytestmark = pytest.mark.usefixtures("no_blocking")
APP = Path(__file__).parent / "apps" / "turns"
DEMO_APP = Path(__file__).resolve().parent.parent / "agents"

Step = ModelResponse | Callable[[list[ModelMessage], AgentInfo], ModelResponse]


class Script:
    """A FunctionModel that answers the n-th model request with the n-th step."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.seen: list[list[ModelMessage]] = []
        self.model = FunctionModel(self._answer)

    def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        step = self.steps.pop(0)
        return step(messages, info) if callable(step) else step


def call(tool: str, args: dict[str, Any], call_id: str = "call-1") -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=call_id)])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


def user_texts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(p.content)
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]


def module_list(rt: Runtime, kind: str, name: str, var: str = "SEEN") -> list[Any]:
    if kind == "tool":
        fn: Any = rt.agents.tools[name].execute
    elif kind == "hook":
        fn = rt.agents.hooks[name].execute
    else:
        fn = rt.registry.app[name].fn
    seen: list[Any] = fn.__globals__[var]
    return seen


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
async def rt(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Runtime]:
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False) as r:
        yield r


async def test_tool_schedules_an_effect_that_posts_into_the_thread_after_the_turn(
    rt: Runtime, clock: FakeClock
) -> None:
    thread = await rt.create_thread()
    script = Script(call("schedule_note", {"text": "stretch", "delay_seconds": 10}), text("Noted."))
    with override_model(rt, script.model):
        result = await thread.send_message("note stretch in 10 s")

    assert result.reply is not None and result.reply.content == "Noted."
    assert [m.role for m in result.messages] == [
        MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.ASSISTANT,
    ]
    tool_msg = result.messages[2]
    assert tool_msg.tool_results[0].tool_name == "schedule_note"
    assert not tool_msg.tool_results[0].is_error
    (pending,) = await thread.get_scheduled_effects()
    assert pending.name == "note" and pending.args == {"text": "stretch"}
    assert pending.run_at_ts == clock.now() + 10
    assert json.loads(tool_msg.tool_results[0].content) == {"run_id": pending.id}

    # The turn is over; nothing was posted yet.
    before = (await thread.get_messages()).messages
    assert [m.content for m in before][-1] == "Noted."

    clock.advance(10)
    await rt.wait_idle()
    after = (await thread.get_messages()).messages
    assert len(after) == len(before) + 1
    reminder = after[-1]
    assert reminder.role is MessageRole.ASSISTANT
    assert reminder.content == "note: stretch"
    assert reminder.injected and reminder.run_id is None
    assert (await thread.get_run(pending.id)).status is EffectStatus.COMPLETED


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_model_sees_the_stored_history_also_after_a_restart(
    tmp_path: Path, clock: FakeClock, backend: str
) -> None:
    storage = make_backend(backend, tmp_path)
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        thread = await rt.create_thread("t1")
        script = Script(text("one"), call("echo", {"text": "x"}), text("two"))
        with override_model(rt, script.model):
            await thread.send_message("first")
            await thread.send_message("second")
        assert user_texts(script.seen[0]) == ["first"]
        assert user_texts(script.seen[1]) == ["first", "second"]
        # The second turn's model saw the first answer too.
        assert any(
            isinstance(m, ModelResponse) and m.text == "one" for m in script.seen[1]
        )

    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        thread = await rt.get_thread("t1")
        script = Script(text("three"))
        with override_model(rt, script.model):
            result = await thread.send_message("third")
        seen = script.seen[0]
        assert user_texts(seen) == ["first", "second", "third"]
        returns = [p for m in seen if isinstance(m, ModelRequest) for p in m.parts
                   if isinstance(p, ToolReturnPart)]
        assert [r.content for r in returns] == ["[x]"]  # decorate_echo's result was stored
        assert result.reply is not None and result.reply.content == "three"
        contents = [m.content for m in (await thread.get_messages()).messages]
        assert contents == ["first", "one", "second", "", "[x]", "two", "third", "three"]


async def test_a_second_message_during_a_turn_is_refused_and_injections_wait(
    rt: Runtime,
) -> None:
    thread = await rt.create_thread()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await release.wait()
        return text("slow answer")

    with override_model(rt, FunctionModel(slow)):
        turn = asyncio.create_task(thread.send_message("take your time"))
        await entered.wait()
        with pytest.raises(TurnInProgress, match="already running a turn"):
            await thread.send_message("are you there?")
        injected = asyncio.create_task(thread.inject_message("from an effect"))
        await asyncio.sleep(0.05)
        assert not injected.done()  # waits for the turn, never interleaves with it
        release.set()
        result = await turn
        await injected

    contents = [m.content for m in (await thread.get_messages()).messages]
    assert contents == ["take your time", "slow answer", "from an effect"]
    assert result.reply is not None and result.reply.content == "slow answer"
    # The refused message was not stored, and the thread takes messages again.
    with override_model(rt, Script(text("again")).model):
        assert (await thread.send_message("now?")).reply is not None


async def test_a_raising_tool_is_a_tool_error_the_model_sees(rt: Runtime) -> None:
    thread = await rt.create_thread()
    script = Script(
        call("explode", {}),
        call("schedule_note", {"text": "x", "delay_seconds": -5}, "call-2"),
        text("recovered"),
    )
    with override_model(rt, script.model):
        result = await thread.send_message("try the tools")

    assert result.reply is not None and result.reply.content == "recovered"
    failures = [r for m in result.messages for r in m.tool_results]
    assert [(f.tool_name, f.is_error) for f in failures] == [
        ("explode", True), ("schedule_note", True),
    ]
    assert failures[0].content == "RuntimeError: kaboom"
    assert "delay_seconds" in failures[1].content and "greater than or equal" in failures[1].content
    # What the model saw after the failure is the error, marked as failed.
    (seen_return,) = [p for p in script.seen[1][-1].parts if isinstance(p, ToolReturnPart)]
    assert seen_return.outcome == "failed" and "kaboom" in str(seen_return.content)
    assert await thread.get_scheduled_effects() == []


async def test_a_tool_result_that_is_not_json_is_a_tool_error_the_model_sees(
    tmp_path: Path, clock: FakeClock
) -> None:
    files = {
        "tools/odd.py": (
            "from runtime import define_tool\n"
            "async def run(state):\n    return object()\n"
            "tool = define_tool('Returns something odd.', run)\n"
        ),
        "tools/fine.py": (
            "from runtime import define_tool\n"
            "async def run(state):\n    return {'ok': True}\n"
            "tool = define_tool('Returns JSON.', run)\n"
        ),
        "hooks/on_success.py": (
            "from runtime import define_hook\n"
            "SEEN = []\n"
            "async def run(state, call, result):\n"
            "    SEEN.append(call.name)\n"
            "    return object() if call.name == 'fine' else None\n"
            "hook = define_hook('after_tool_call_success', 'on_success', run)\n"
        ),
        "hooks/on_failure.py": (
            "from runtime import define_hook\n"
            "SEEN = []\n"
            "async def run(state, call, error):\n    SEEN.append((call.name, error))\n"
            "hook = define_hook('after_tool_call_failure', 'on_failure', run)\n"
        ),
        "agents/a.py": (
            "from runtime import define_agent\n"
            "agent = define_agent('a', 'x', tools=['odd', 'fine'],\n"
            "                     hooks=['on_success', 'on_failure'])\n"
        ),
    }

    def write() -> None:
        for rel, content in files.items():
            (tmp_path / "app" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "app" / rel).write_text(content)

    await anyio.to_thread.run_sync(write)
    async with Runtime(app_dir=tmp_path / "app", data_dir=tmp_path / "data", clock=clock,
                       load_packages=False) as rt:
        thread = await rt.create_thread()
        script = Script(call("odd", {}), call("fine", {}, "call-2"), text("recovered"))
        with override_model(rt, script.model):
            result = await thread.send_message("call the odd tool")

        assert result.reply is not None and result.reply.content == "recovered"
        odd, fine = [r for m in result.messages for r in m.tool_results]
        assert odd.is_error and odd.tool_name == "odd"
        assert odd.content.startswith(
            "Tool odd returned a value of type object that cannot be sent to the model"
        )
        (seen_return,) = [p for p in script.seen[1][-1].parts if isinstance(p, ToolReturnPart)]
        assert seen_return.outcome == "failed" and "Tool odd returned" in str(seen_return.content)
        # Success hooks never saw the odd result; failure hooks did.
        assert module_list(rt, "hook", "on_success") == ["fine"]
        assert [(n, e[:16]) for n, e in module_list(rt, "hook", "on_failure")] == [
            ("odd", "Tool odd returne")
        ]
        # A success hook's replacement that is not JSON is ignored: the result stays.
        assert not fine.is_error and json.loads(fine.content) == {"ok": True}
        assert len((await thread.get_messages()).messages) == 6


async def test_execution_is_set_in_tools_and_hooks_and_none_in_effects(
    rt: Runtime, clock: FakeClock
) -> None:
    thread = await rt.create_thread()
    script = Script(call("schedule_note", {"text": "x", "delay_seconds": 0}, "tc-9"), text("ok"))
    with override_model(rt, script.model):
        result = await thread.send_message("go")
    await rt.wait_idle()

    (tool_exec,) = module_list(rt, "tool", "schedule_note")
    assert tool_exec == Execution(run_id=result.run_id, step=1, tool_call_id="tc-9")
    history_execs = [e for _, e in module_list(rt, "hook", "watch_history")]
    assert history_execs == [
        Execution(run_id=result.run_id, step=1), Execution(run_id=result.run_id, step=2),
    ]
    stored = [(role, e) for role, _, e in module_list(rt, "hook", "watch_messages")]
    assert stored[0] == ("user", Execution(run_id=result.run_id, step=0))
    assert all(isinstance(e, Execution) and e.run_id == result.run_id for _, e in stored[1:4])
    # The effect the tool scheduled ran outside the turn; its injected message's hooks too.
    assert module_list(rt, "effect", "note") == [None]
    assert stored[-1] == ("assistant", None)
    assert [m.run_id for m in result.messages] == [result.run_id] * 4


async def test_a_failing_model_keeps_the_user_message_and_frees_the_thread(rt: Runtime) -> None:
    thread = await rt.create_thread()

    def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ConnectionError("model unreachable")

    with override_model(rt, FunctionModel(broken)), pytest.raises(TurnFailed) as caught:
        await thread.send_message("hello?")
    assert "model unreachable" in str(caught.value)
    assert [m.content for m in (await thread.get_messages()).messages] == ["hello?"]

    script = Script(text("back"))
    with override_model(rt, script.model):
        result = await thread.send_message("hello again")
    assert result.reply is not None and result.reply.content == "back"
    assert user_texts(script.seen[0]) == ["hello?", "hello again"]


async def test_a_turn_failing_after_a_tool_keeps_the_tool_step_and_its_effect(
    rt: Runtime, clock: FakeClock
) -> None:
    thread = await rt.create_thread()

    def model_down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ConnectionError("model unreachable")

    script = Script(
        call("schedule_note", {"text": "stretch", "delay_seconds": 10}, "c-1"), model_down
    )
    with override_model(rt, script.model), pytest.raises(TurnFailed, match="unreachable"):
        await thread.send_message("note stretch in 10 s")

    # The conversation explains the scheduled effect: the call and its result are stored.
    stored = (await thread.get_messages()).messages
    assert [m.role for m in stored] == [MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL]
    assert stored[1].tool_calls[0].name == "schedule_note"
    (pending,) = await thread.get_scheduled_effects()
    assert json.loads(stored[2].tool_results[0].content) == {"run_id": pending.id}
    assert len({m.run_id for m in stored}) == 1

    # The effect is not rolled back: it runs when due.
    clock.advance(10)
    await rt.wait_idle()
    assert (await thread.get_messages()).messages[-1].content == "note: stretch"

    # The stored history is valid for the next turn, which sees the earlier tool step.
    again = Script(text("sorry about that"))
    with override_model(rt, again.model):
        result = await thread.send_message("still there?")
    assert result.reply is not None and result.reply.content == "sorry about that"
    seen_returns = [p for m in again.seen[0] if isinstance(m, ModelRequest) for p in m.parts
                    if isinstance(p, ToolReturnPart)]
    assert [r.tool_call_id for r in seen_returns] == ["c-1"]


def test_a_step_whose_tool_calls_did_not_all_return_is_not_kept() -> None:
    from runtime.turns import completed_steps

    user = ModelRequest(parts=[UserPromptPart("hi")], run_id="r")
    first = ModelResponse(parts=[ToolCallPart("a", {}, tool_call_id="1")], run_id="r")
    first_done = ModelRequest(parts=[ToolReturnPart("a", "ok", tool_call_id="1")], run_id="r")
    second = ModelResponse(
        parts=[ToolCallPart("a", {}, tool_call_id="2"), ToolCallPart("b", {}, tool_call_id="3")],
        run_id="r",
    )
    half = ModelRequest(parts=[ToolReturnPart("a", "ok", tool_call_id="2")], run_id="r")
    older = ModelRequest(parts=[UserPromptPart("before")], run_id="old")
    captured: list[ModelMessage] = [older, user, first, first_done, second, half]
    assert completed_steps(captured, "r") == [first, first_done]
    assert completed_steps([older, user], "r") == []


async def test_messages_page_oldest_first_and_single_lookup(rt: Runtime) -> None:
    thread = await rt.create_thread(agent_id="plain")
    for i in range(5):
        await thread.inject_message(f"m{i}", role="system" if i == 4 else "assistant")
    first = await thread.get_messages(limit=2)
    assert [m.content for m in first.messages] == ["m0", "m1"]
    assert first.next_cursor == first.messages[-1].id
    second = await thread.get_messages(limit=2, after=first.next_cursor)
    third = await thread.get_messages(limit=2, after=second.next_cursor)
    assert [m.content for m in second.messages + third.messages] == ["m2", "m3", "m4"]
    assert third.next_cursor is None
    assert third.messages[-1].role is MessageRole.SYSTEM
    # Polling after the newest message gives nothing new.
    assert (await thread.get_messages(after=third.messages[-1].id)).messages == []

    assert (await thread.get_message(second.messages[0].id)).content == "m2"
    with pytest.raises(MessageNotFound, match="no-such-id"):
        await thread.get_message("no-such-id")
    with pytest.raises(ValueError, match="Invalid cursor"):
        await thread.get_messages(after="no-such-id")
    with pytest.raises(ValueError, match="limit"):
        await thread.get_messages(limit=0)
    with pytest.raises(ValueError, match="empty"):
        await thread.inject_message("   ")
    with pytest.raises(ValueError, match="tool"):
        await thread.inject_message("x", role="tool")
    with pytest.raises(ValueError, match="empty"):
        await thread.send_message("")
    assert second.prev_cursor == second.messages[0].id and first.prev_cursor is None


async def test_messages_page_back_from_the_newest(rt: Runtime) -> None:
    thread = await rt.create_thread(agent_id="plain")
    for i in range(5):
        await thread.inject_message(f"m{i}")
    newest = await thread.get_messages(limit=2, latest=True)
    assert [m.content for m in newest.messages] == ["m3", "m4"]  # still oldest first
    assert newest.next_cursor is None and newest.prev_cursor == newest.messages[0].id
    older = await thread.get_messages(limit=2, before=newest.prev_cursor)
    assert [m.content for m in older.messages] == ["m1", "m2"]
    assert older.next_cursor == older.messages[-1].id
    oldest = await thread.get_messages(limit=2, before=older.prev_cursor)
    assert [m.content for m in oldest.messages] == ["m0"]
    assert oldest.prev_cursor is None  # the start of the conversation
    # Paging forward again from a page that was reached backwards.
    again = await thread.get_messages(limit=2, after=oldest.next_cursor)
    assert [m.content for m in again.messages] == ["m1", "m2"]
    assert (await thread.get_messages(before=oldest.messages[0].id)).messages == []
    assert [m.content for m in (await thread.get_messages(latest=True)).messages] == [
        f"m{i}" for i in range(5)
    ]

    with pytest.raises(ValueError, match="Invalid cursor"):
        await thread.get_messages(before="no-such-id")
    with pytest.raises(ValueError, match="at most one"):
        await thread.get_messages(after=older.next_cursor, latest=True)
    with pytest.raises(ValueError, match="at most one"):
        await thread.get_messages(after=older.next_cursor, before=newest.prev_cursor)


async def test_a_thread_file_from_before_messages_is_migrated(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False) as rt:
        thread = await rt.create_thread("old")
        run_id = await thread.schedule_effect("note", {"text": "kept"}, delay=3600)
    path = tmp_path / "threads" / "old.sqlite"
    await anyio.to_thread.run_sync(_rewrite_as_schema_1, path)

    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False) as rt:
        thread = await rt.get_thread("old")
        assert [r.id for r in await thread.get_scheduled_effects()] == [run_id]
        with override_model(rt, Script(text("hi from v2")).model):
            result = await thread.send_message("hello")
        assert [m.content for m in result.messages] == ["hello", "hi from v2"]
    assert await anyio.to_thread.run_sync(_user_version, path) == THREAD_SCHEMA_VERSION


def _rewrite_as_schema_1(path: Path) -> None:
    """Rewrite a thread file as schema version 1 had it: no messages table."""
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT * FROM effect_runs").fetchall()
    meta = conn.execute("SELECT * FROM thread_meta").fetchall()
    conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.unlink()
    conn = sqlite3.connect(path)
    for statement in migration_ddl(0, THREAD_MIGRATION_MODELS, THREAD_MIGRATION_COLUMNS):
        conn.execute(statement)
    conn.executemany("INSERT INTO thread_meta VALUES (?, ?)", meta)
    width = len(conn.execute("SELECT * FROM effect_runs").description)
    conn.executemany(f"INSERT INTO effect_runs VALUES ({','.join('?' * width)})",
                     [row[:width] for row in rows])
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()


def _user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


async def test_the_model_setting_is_used_when_set(tmp_path: Path, clock: FakeClock) -> None:
    # "test" is pydantic-ai's built-in offline TestModel: it calls every tool once.
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, model="test"
    ) as rt:
        thread = await rt.create_thread(agent_id="plain")
        result = await thread.send_message("hi")
    calls = [c.name for m in result.messages for c in m.tool_calls]
    assert calls == ["echo"]
    assert result.reply is not None and "echo" in result.reply.content


async def test_a_model_that_cannot_be_used_stops_startup(tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailable) as caught:
        async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False,
                           model="nonsense-model"):
            pass
    message = str(caught.value)
    assert "Model 'nonsense-model' of the model setting" in message
    assert "THREAD_EFFECTS_MODEL" in message and "Unknown model: nonsense-model" in message

    agent_file = tmp_path / "app" / "agents" / "remote.py"

    def write() -> None:
        agent_file.parent.mkdir(parents=True)
        agent_file.write_text(
            "from runtime import define_agent\n"
            "agent = define_agent('remote', 'x', model='nosuchprovider:big')\n"
        )

    await anyio.to_thread.run_sync(write)
    with pytest.raises(ModelNotAvailable, match=r"Model 'nosuchprovider:big' of agent 'remote'"):
        async with Runtime(app_dir=tmp_path / "app", data_dir=tmp_path, load_packages=False):
            pass
    # The data directory was released; a resolvable model starts and is used by turns.
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False, model="test") as rt:
        assert set(rt.turns.models) == {"test"}


def test_the_demo_model_reads_reminders() -> None:
    assert parse_reminder("remind me in 10 seconds to stretch") == ("stretch", 10.0)
    assert parse_reminder("Please remind me in 2 minutes to drink water!") == ("drink water", 120.0)
    assert parse_reminder("remind me to call mom in 1 hour") == ("call mom", 3600.0)
    assert parse_reminder("remind me in 1.5 s: breathe") == ("breathe", 1.5)
    assert parse_reminder("what's the weather?") is None
    assert parse_reminder("remind me in 2 days to water the plants") == (
        "water the plants", 172_800.0)
    assert parse_reminder("remind me to stretch in 3 hours") == ("stretch", 10_800.0)
    # Nothing to be reminded of: no reminder (the demo then answers with its help text).
    for empty in ("remind me in 10 seconds to ", "remind me in 10 seconds to", "remind me in 5 s:"):
        assert parse_reminder(empty) is None, empty
    assert demo_model().model_name.endswith("thread-effects-demo")


async def test_the_demo_reminds_offline_end_to_end(tmp_path: Path, clock: FakeClock) -> None:
    async with Runtime(
        app_dir=DEMO_APP, data_dir=tmp_path, clock=clock, load_packages=False
    ) as rt:
        thread: ThreadState = await rt.create_thread()
        await rt.wait_idle()
        greeting = (await thread.get_messages()).messages
        assert len(greeting) == 1 and "remind me in 10 seconds" in greeting[0].content

        result = await thread.send_message("remind me in 2 seconds to stretch")
        assert result.reply is not None
        assert result.reply.content == "OK, I'll remind you to stretch in 2 seconds."
        (pending,) = await thread.get_scheduled_effects()
        assert pending.name == "send_reminder" and pending.run_at_ts == clock.now() + 2

        clock.advance(1.9)
        await rt.wait_idle()
        assert not any("Reminder" in m.content for m in (await thread.get_messages()).messages)
        clock.advance(0.1)
        await rt.wait_idle()
        last = (await thread.get_messages()).messages[-1]
        assert last.injected and last.role is MessageRole.ASSISTANT
        assert "stretch" in last.content and "Reminder" in last.content

        help_reply = await thread.send_message("hello")
        assert help_reply.reply is not None and "remind me in" in help_reply.reply.content

        no_text = await thread.send_message("remind me in 10 seconds to ")
        assert no_text.reply is not None and "remind me in" in no_text.reply.content
        days = await thread.send_message("remind me in 2 days to water the plants")
        assert days.reply is not None
        assert days.reply.content == "OK, I'll remind you to water the plants in 2 days."
        assert [r.run_at_ts - clock.now() for r in await thread.get_scheduled_effects()] == [
            172_800.0
        ]


SLOW_TOOL = '''
import asyncio
from runtime import ThreadState, define_tool

SEEN: list[str] = []

async def slow_step(state: ThreadState) -> str:
    SEEN.append("started")
    await asyncio.sleep(30)
    SEEN.append("finished")
    await state.inject_message("the old turn's tool wrote this")
    return "done"

tool = define_tool("Takes a long step.", slow_step)
'''


async def test_deleting_a_thread_cancels_its_running_turn(tmp_path: Path) -> None:
    import asyncio

    from runtime import ThreadNotFound

    app = tmp_path / "app"

    def write_app() -> None:
        (app / "tools").mkdir(parents=True)
        (app / "agents").mkdir()
        (app / "tools" / "slow_step.py").write_text(SLOW_TOOL)
        (app / "agents" / "stepper.py").write_text(
            "from runtime import define_agent\n\n"
            "agent = define_agent('stepper', 'You step.', tools=['slow_step'])\n"
        )

    await asyncio.to_thread(write_app)
    async with Runtime(app_dir=app, data_dir=tmp_path / "data", load_packages=False) as rt:
        seen = module_list(rt, "tool", "slow_step")
        thread = await rt.create_thread("del1")
        script = Script(call("slow_step", {}), text("the old turn's answer"))
        with override_model(rt, script.model):
            turn = asyncio.create_task(thread.send_message("go"))
            async with asyncio.timeout(30):
                while not seen:
                    await asyncio.sleep(0.01)
            assert await rt.delete_thread("del1")
            with pytest.raises(ThreadNotFound):
                await turn
            again = await rt.create_thread("del1")
            assert seen == ["started"]  # the tool was stopped: it never finished
            assert (await again.get_messages()).messages == []
            assert rt.turns.running("del1") is None
            # The new thread runs its own turns.
            script.steps = [text("a fresh answer")]
            result = await again.send_message("hello")
            assert result.reply is not None and result.reply.content == "a fresh answer"


SHORT_TOOL = '''
import asyncio
from runtime import ThreadState, define_tool

SEEN: list[str] = []

async def short_step(state: ThreadState) -> str:
    SEEN.append("started")
    await asyncio.sleep(0.3)  # the shutdown begins meanwhile
    await state.inject_message("written during the grace period")
    SEEN.append("finished")
    return "done"

tool = define_tool("Takes a short step.", short_step)
'''


async def test_a_shutdown_lets_a_running_turn_finish_and_refuses_new_ones(
    tmp_path: Path,
) -> None:
    import asyncio

    from runtime import RuntimeClosed

    app = tmp_path / "app"

    def write_app() -> None:
        (app / "tools").mkdir(parents=True)
        (app / "agents").mkdir()
        (app / "tools" / "short_step.py").write_text(SHORT_TOOL)
        (app / "agents" / "stepper.py").write_text(
            "from runtime import define_agent\n\n"
            "agent = define_agent('stepper', 'You step.', tools=['short_step'])\n"
        )

    await asyncio.to_thread(write_app)
    async with Runtime(app_dir=app, data_dir=tmp_path / "data", load_packages=False,
                       shutdown_grace_seconds=10) as rt:
        seen = module_list(rt, "tool", "short_step")
        first, other = await rt.create_thread("a"), await rt.create_thread("b")
        script = Script(call("short_step", {}), text("finished in the grace period"))
        with override_model(rt, script.model):
            turn = asyncio.create_task(first.send_message("go"))
            async with asyncio.timeout(30):
                while not seen:
                    await asyncio.sleep(0.01)
            closing = asyncio.create_task(rt.close())
            while not rt.shutting_down:
                await asyncio.sleep(0)
            with pytest.raises(RuntimeClosed, match="starts no new turn") as refused:
                await other.send_message("too late")
            assert refused.value.shutting_down
            result = await turn
            await closing
    assert seen == ["started", "finished"]
    assert result.reply is not None and result.reply.content == "finished in the grace period"
    assert "written during the grace period" in [m.content for m in result.messages]
