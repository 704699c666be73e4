"""Effect tools driven by real pydantic-ai agents on a scripted `FunctionModel`.

Outside the runtime: `wrap_tools_for_run` with the standalone stores.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from runtime import (
    EffectRecordStatus,
    EffectRecordStore,
    EffectToolContext,
    EffectToolSettings,
    Execution,
    InMemoryEffectStore,
    SqliteEffectStore,
    ToolRunState,
    default_effect_key,
    define_effect_tool,
    define_tool,
    effect_marker,
    find_effect_markers,
    wrap_tools_for_run,
)
from runtime.effect_tools import EffectToolValue

FAST = EffectToolSettings(poll_interval_seconds=0.01)

Step = list[ToolCallPart] | str


def scripted(*steps: Step) -> FunctionModel:
    """A model that answers the n-th request with the n-th step (tool calls, or text)."""
    count = 0

    def next_step() -> Step:
        nonlocal count
        step = steps[min(count, len(steps) - 1)]
        count += 1
        return step

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = next_step()
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=list(step))

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        step = next_step()
        if isinstance(step, str):
            yield step
            return
        yield {i: DeltaToolCall(p.tool_name, p.args_as_json_str(), tool_call_id=p.tool_call_id)
               for i, p in enumerate(step)}

    return FunctionModel(answer, stream_function=stream)


def call(tool: str, args: dict[str, Any], call_id: str) -> ToolCallPart:
    return ToolCallPart(tool, args, tool_call_id=call_id)


def returns(messages: list[ModelMessage]) -> list[Any]:
    """What the model saw from each tool call, in order."""
    return [
        p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


class Comment(BaseModel):
    issue: int
    body: str


def comment_tool(applied: list[Comment], **hooks: Any) -> Any:
    async def post_comment(state: ToolRunState, args: Comment) -> dict[str, Any]:
        applied.append(args)
        await anyio.sleep(0.02)  # two calls in one step overlap while this one applies
        return {"comment": len(applied), "issue": args.issue}

    return define_effect_tool("Posts a comment on the issue.", Comment, post_comment, **hooks)


async def run(tools: list[Any], model: FunctionModel, store: EffectRecordStore,
              run_id: str = "run-1", **kwargs: Any) -> list[ModelMessage]:
    ctx = EffectToolContext(run_id=run_id, agent="assistant", trigger="test", thread_id="t1",
                            settings=kwargs.pop("settings", FAST))
    agent = Agent(model, toolsets=[wrap_tools_for_run(tools, ctx, store)])
    result = await agent.run("go", **kwargs)
    return result.all_messages()


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, no_blocking: None
) -> AsyncIterator[EffectRecordStore]:
    """Each store; nothing in a test that uses it may block the event loop (blockbuster)."""
    backend: EffectRecordStore = (
        InMemoryEffectStore() if request.param == "memory"
        else SqliteEffectStore(tmp_path / "records.sqlite")
    )
    yield backend
    await backend.close()


async def test_the_same_call_twice_in_one_run_applies_once(store: EffectRecordStore) -> None:
    applied: list[Comment] = []
    args = {"issue": 7, "body": "Fixed in #9."}
    messages = await run(
        [comment_tool(applied)],
        scripted([call("post_comment", args, "c1")], [call("post_comment", args, "c2")], "done"),
        store,
    )
    assert len(applied) == 1
    assert returns(messages) == [{"comment": 1, "issue": 7}, {"comment": 1, "issue": 7}]
    key = default_effect_key("run-1", "post_comment", Comment(**args))
    record = await store.get("t1", key)
    assert record is not None and record.status is EffectRecordStatus.APPLIED
    assert record.result == {"comment": 1, "issue": 7}
    assert (record.tool_name, record.run_id) == ("post_comment", "run-1")


async def test_two_identical_calls_in_one_response_apply_once_and_both_return_it(
    store: EffectRecordStore,
) -> None:
    applied: list[Comment] = []
    args = {"issue": 7, "body": "Same."}
    messages = await run(
        [comment_tool(applied)],
        scripted([call("post_comment", args, "c1"), call("post_comment", args, "c2")], "done"),
        store,
    )
    assert len(applied) == 1
    assert returns(messages) == [{"comment": 1, "issue": 7}] * 2


async def test_a_new_run_with_the_same_args_applies_again(store: EffectRecordStore) -> None:
    applied: list[Comment] = []
    tool = comment_tool(applied)
    args = {"issue": 7, "body": "Again."}
    for run_id in ("run-1", "run-2"):
        await run([tool], scripted([call("post_comment", args, "c1")], "done"), store, run_id)
    assert len(applied) == 2
    assert len((await store.list("t1")).records) == 2


async def test_a_custom_key_that_ignores_the_body_applies_once_for_two_bodies(
    store: EffectRecordStore,
) -> None:
    applied: list[Comment] = []
    seen: list[Execution] = []

    def key_of(args: Comment, execution: Execution) -> str:
        seen.append(execution)
        return f"{execution.run_id}:comment:{args.issue}"

    messages = await run(
        [comment_tool(applied, effect_key=key_of)],
        scripted([call("post_comment", {"issue": 7, "body": "One."}, "c1")],
                 [call("post_comment", {"issue": 7, "body": "Two."}, "c2")], "done"),
        store,
    )
    assert [c.body for c in applied] == ["One."]
    assert returns(messages) == [{"comment": 1, "issue": 7}] * 2
    assert [e.tool_call_id for e in seen] == ["c1", "c2"]
    record = await store.get("t1", "run-1:comment:7")
    assert record is not None and record.result == {"comment": 1, "issue": 7}


async def test_already_applied_returning_a_value_skips_execute(
    store: EffectRecordStore,
) -> None:
    applied: list[Comment] = []
    remote = [f"Earlier text {effect_marker('run-1:comment:7')}"]
    looked: list[str] = []

    async def find_comment(key: str, args: Comment) -> dict[str, Any] | None:
        looked.append(key)
        for i, text in enumerate(remote):
            if key in find_effect_markers(text):
                return {"comment": i + 100, "issue": args.issue, "found": True}
        return None

    tool = comment_tool(applied, effect_key=lambda a, e: f"{e.run_id}:comment:{a.issue}",
                        already_applied=find_comment)
    messages = await run(
        [tool],
        scripted([call("post_comment", {"issue": 7, "body": "x"}, "c1")],
                 [call("post_comment", {"issue": 8, "body": "y"}, "c2")], "done"),
        store,
    )
    assert [c.issue for c in applied] == [8]  # issue 7 was found remotely
    assert looked == ["run-1:comment:7", "run-1:comment:8"]
    assert returns(messages) == [
        {"comment": 100, "issue": 7, "found": True}, {"comment": 1, "issue": 8}]
    record = await store.get("t1", "run-1:comment:7")
    assert record is not None and record.result == {"comment": 100, "issue": 7, "found": True}


async def test_a_raising_execute_records_nothing_and_the_next_call_applies(
    store: EffectRecordStore,
) -> None:
    attempts: list[str] = []

    def send_sms(state: ToolRunState, args: Comment) -> str:  # sync: runs in a worker thread
        attempts.append(args.body)
        if len(attempts) == 1:
            raise ConnectionError("gateway timeout")
        return f"sent {args.body}"

    tool = define_effect_tool("Sends an SMS.", Comment, send_sms)
    args = {"issue": 1, "body": "hi"}
    messages = await run(
        [tool],
        scripted([call("send_sms", args, "c1")], [call("send_sms", args, "c2")],
                 [call("send_sms", args, "c3")], "done"),
        store,
    )
    assert attempts == ["hi", "hi"]
    seen = returns(messages)
    assert "ConnectionError: gateway timeout" in str(seen[0])
    assert seen[1:] == ["sent hi", "sent hi"]


async def test_key_order_at_every_depth_does_not_change_the_key(
    store: EffectRecordStore,
) -> None:
    class Order(BaseModel):
        lines: list[dict[str, Any]]
        meta: dict[str, Any]

    applied: list[Order] = []

    async def place(state: ToolRunState, args: Order) -> str:
        applied.append(args)
        return "placed"

    one = {"meta": {"b": {"y": 2, "x": 1}, "a": [1, {"q": 1, "p": 2}]},
           "lines": [{"sku": "A", "qty": 1}]}
    two = {"lines": [{"qty": 1, "sku": "A"}],
           "meta": {"a": [1, {"p": 2, "q": 1}], "b": {"x": 1, "y": 2}}}
    await run(
        [define_effect_tool("Places an order.", Order, place)],
        scripted([call("place", one, "c1")], [call("place", two, "c2")], "done"),
        store,
    )
    assert len(applied) == 1
    assert default_effect_key("r", "place", one) == default_effect_key("r", "place", two)
    assert default_effect_key("r", "place", Order(**one)) == default_effect_key("r", "place", two)


async def test_the_key_is_computed_before_execute_so_mutating_args_cannot_change_it(
    store: EffectRecordStore,
) -> None:
    applied: list[str] = []

    async def post(state: ToolRunState, args: Comment) -> str:
        applied.append(args.body)
        args.body = "changed by the handler"
        return "posted"

    args = {"issue": 2, "body": "original"}
    messages = await run(
        [define_effect_tool("Posts.", Comment, post)],
        scripted([call("post", args, "c1")], [call("post", args, "c2")], "done"), store,
    )
    assert applied == ["original"] and returns(messages) == ["posted", "posted"]
    key = default_effect_key("run-1", "post", Comment(**args))
    assert [r.key for r in (await store.list("t1")).records] == [key]


async def test_a_streaming_tool_records_its_last_value_and_a_replay_yields_only_it(
    store: EffectRecordStore,
) -> None:
    produced: list[int] = []

    async def progress(state: ToolRunState, args: Comment) -> AsyncIterator[dict[str, int]]:
        for done in (1, 2, 3):
            produced.append(done)
            yield {"done": done, "of": 3}

    events: list[tuple[Any, bool]] = []

    async def handler(ctx: Any, stream: AsyncIterable[Any]) -> None:
        async for event in stream:
            if isinstance(event, EffectToolValue):
                events.append((event.value, event.replayed))

    args = {"issue": 1, "body": "go"}
    messages = await run(
        [define_effect_tool("Reports progress.", Comment, progress)],
        scripted([call("progress", args, "c1")], [call("progress", args, "c2")], "done"),
        store, event_stream_handler=handler,
    )
    assert produced == [1, 2, 3]
    last = {"done": 3, "of": 3}
    assert events == [({"done": 1, "of": 3}, False), ({"done": 2, "of": 3}, False),
                      (last, False), (last, True)]
    assert returns(messages) == [last, last]
    key = default_effect_key("run-1", "progress", Comment(**args))
    record = await store.get("t1", key)
    assert record is not None and record.result == last


async def test_the_first_call_returns_exactly_what_a_replay_returns(
    store: EffectRecordStore,
) -> None:
    from datetime import UTC, datetime

    class Receipt(BaseModel):
        at: datetime
        pair: tuple[int, int]

    async def charge(state: ToolRunState, args: Comment) -> Any:
        return {"receipt": Receipt(at=datetime(2024, 5, 1, 12, tzinfo=UTC), pair=(1, 2))}

    args = {"issue": 1, "body": "go"}
    messages = await run(
        [define_effect_tool("Charges.", Comment, charge)],
        scripted([call("charge", args, "c1")], [call("charge", args, "c2")], "done"),
        store,
    )
    first, replay = returns(messages)
    assert first == replay == {"receipt": {"at": "2024-05-01T12:00:00Z", "pair": [1, 2]}}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"nan": float("nan")}, "Tool odd returned a value of type dict that cannot be "
                                "recorded as JSON"),
        (object(), "Tool odd returned a value of type object that cannot be recorded"),
        (b"\xff\xfe", "Tool odd returned a value of type bytes that cannot be recorded"),
        ("x" * 2000, "Tool odd returned 2002 bytes of JSON, over the recorded-result limit of "
                     "1000 bytes (EffectToolSettings.max_result_bytes)"),
        ({"a": "\ud800"}, "Tool odd returned a string with a lone surrogate (U+D800)"),
    ],
)
async def test_an_unrecordable_result_is_recorded_as_an_error_and_never_applied_again(
    store: EffectRecordStore, value: Any, message: str,
) -> None:
    applied: list[int] = []

    async def odd(state: ToolRunState, args: Comment) -> Any:
        applied.append(args.issue)
        return value

    settings = EffectToolSettings(max_result_bytes=1000, poll_interval_seconds=0.01)
    same = {"issue": 1, "body": ""}
    messages = await run(
        [define_effect_tool("Odd.", Comment, odd)],
        scripted([call("odd", same, "c1")], [call("odd", same, "c2")], "done"),
        store, settings=settings,
    )
    first, retry = (str(r) for r in returns(messages))
    assert message in first and message in retry
    assert "it is not applied again" in retry
    assert applied == [1]  # the retry returned the recorded error: no second application
    (record,) = (await store.list("t1")).records
    assert record.status is EffectRecordStatus.APPLIED
    assert message in record.result["$effectResultError"]


async def test_waiters_on_a_claim_share_a_raising_execute_error_a_later_call_applies(
    store: EffectRecordStore,
) -> None:
    executions: list[int] = []

    async def flaky(state: ToolRunState, args: Comment) -> dict[str, int]:
        executions.append(args.issue)
        await anyio.sleep(0.2)
        if len(executions) == 1:
            raise RuntimeError("timeout talking to remote")
        return {"n": len(executions)}

    args = {"issue": 1, "body": "b"}
    messages = await run(
        [define_effect_tool("Flaky.", Comment, flaky)],
        scripted([call("flaky", args, f"c{i}") for i in range(3)],
                 [call("flaky", args, "later")], "done"),
        store,
    )
    seen = [str(r) for r in returns(messages)]
    assert all("RuntimeError: timeout talking to remote" in r for r in seen[:3]), seen
    assert len(executions) == 2  # the three waiting calls ran execute once; the later call
    assert seen[3] == str({"n": 2})  # applied again, as a raising execute recorded nothing


async def test_a_lease_shorter_than_execute_is_renewed_so_it_applies_once(
    store: EffectRecordStore,
) -> None:
    executions: list[int] = []

    async def slow(state: ToolRunState, args: Comment) -> str:
        executions.append(args.issue)
        await anyio.sleep(3)
        return "done slowly"

    settings = EffectToolSettings(lease_seconds=1, poll_interval_seconds=0.05,
                                  wait_timeout_seconds=10)
    args = {"issue": 1, "body": "b"}
    messages = await run(
        [define_effect_tool("Slow.", Comment, slow)],
        scripted([call("slow", args, "c1"), call("slow", args, "c2")], "done"),
        store, settings=settings,
    )
    assert executions == [1]
    assert returns(messages) == ["done slowly", "done slowly"]


async def test_a_call_waiting_on_a_held_key_gives_up_with_a_clear_error(
    store: EffectRecordStore,
) -> None:
    applied: list[Comment] = []
    args = Comment(issue=3, body="b")
    key = default_effect_key("run-1", "post_comment", args)
    held = await store.begin("t1", key, tool_name="post_comment", run_id="run-1",
                             owner="another-process", lease_seconds=600)
    assert held.claimed
    settings = EffectToolSettings(wait_timeout_seconds=0.2, poll_interval_seconds=0.02)
    messages = await run(
        [comment_tool(applied)],
        scripted([call("post_comment", args.model_dump(), "c1")], "done"), store,
        settings=settings,
    )
    assert applied == []
    (error,) = returns(messages)
    assert f"Tool post_comment: effect key {key!r} is still being applied by another call" in (
        str(error))


async def test_an_expired_lease_is_taken_over_through_already_applied() -> None:
    from runtime.testing import FakeClock

    clock = FakeClock(start=1_700_000_000.0)
    store = InMemoryEffectStore(clock=clock.now)
    applied: list[Comment] = []
    looked: list[str] = []

    def find(key: str, args: Comment) -> None:
        looked.append(key)

    args = Comment(issue=3, body="b")
    key = default_effect_key("run-1", "post_comment", args)
    await store.begin("t1", key, tool_name="post_comment", run_id="run-1", owner="died",
                      lease_seconds=60)
    clock.advance(61)
    messages = await run([comment_tool(applied, already_applied=find)],
                         scripted([call("post_comment", args.model_dump(), "c1")], "done"),
                         store)
    assert looked == [key] and len(applied) == 1
    assert returns(messages) == [{"comment": 1, "issue": 3}]


async def test_a_record_that_fails_after_the_effect_still_returns_the_result(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "records.sqlite"
    store = SqliteEffectStore(path, busy_timeout_seconds=0.05)
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    applied: list[Comment] = []

    async def post(state: ToolRunState, args: Comment) -> str:
        applied.append(args)
        # Another writer takes the database: the record after the effect cannot be written.
        blocker.execute("BEGIN IMMEDIATE")
        return "posted"

    caplog.set_level(logging.ERROR, logger="runtime.effect_tools")
    args = Comment(issue=5, body="b")
    messages = await run([define_effect_tool("Posts.", Comment, post)],
                         scripted([call("post", args.model_dump(), "c1")], "done"), store)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert returns(messages) == ["posted"] and len(applied) == 1
    key = default_effect_key("run-1", "post", args)
    assert any(key in r.getMessage() and "could not be recorded" in r.getMessage()
               for r in caplog.records)
    record = await store.get("t1", key)
    assert record is not None and record.status is EffectRecordStatus.IN_PROGRESS
    await store.close()


async def test_plain_tools_pass_through_and_names_are_checked(store: EffectRecordStore) -> None:
    calls: list[str] = []

    def tell(state: ToolRunState) -> str:
        calls.append(state.execution.run_id)
        return "noon"

    plain = define_tool("Tells the time.", tell)
    messages = await run(
        [plain],
        scripted([call("tell", {}, "c1")], [call("tell", {}, "c2")], "done"), store,
    )
    assert calls == ["run-1", "run-1"] and returns(messages) == ["noon", "noon"]
    assert (await store.list("t1")).records == []
    ctx = EffectToolContext(run_id="r")
    with pytest.raises(ValueError, match="two tools are named 'tell'"):
        wrap_tools_for_run([plain, define_effect_tool("Again.", tell)], ctx, store)
    with pytest.raises(ValueError, match="pass name="):
        wrap_tools_for_run([define_tool("Lambda.", lambda s: 1)], ctx, store)
    with pytest.raises(TypeError, match="expected tool definitions"):
        wrap_tools_for_run([tell], ctx, store)
    named = define_effect_tool("Named.", lambda s: 1, name="ping")
    assert wrap_tools_for_run([named], ctx, store).tools.keys() == {"ping"}


def test_define_effect_tool_checks_its_arguments() -> None:
    async def fn(state: Any, args: Comment) -> None: ...

    with pytest.raises(ValueError, match="define_effect_tool: description"):
        define_effect_tool(" ", Comment, fn)
    with pytest.raises(TypeError, match="define_effect_tool: args_schema"):
        define_effect_tool("x", dict, fn)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="define_effect_tool: already_applied must be callable"):
        define_effect_tool("x", Comment, fn, already_applied="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snake_case"):
        define_effect_tool("x", Comment, fn, name="Post Comment")
    with pytest.raises(ValueError, match="run_id"):
        EffectToolContext(run_id="")
    with pytest.raises(ValueError, match="lease_seconds"):
        EffectToolSettings(lease_seconds=0)


def test_sync_hooks_run_in_a_worker_thread_async_ones_on_the_loop() -> None:
    from runtime.effect_tools import _call_hook

    threads: list[bool] = []

    def sync_hook(key: str, args: Any) -> None:
        import threading

        threads.append(threading.current_thread() is threading.main_thread())

    anyio.run(_call_hook, sync_hook, "k", None)
    assert threads == [False]




CHILD = Path(__file__).parent / "_effect_tool_child.py"
ROOT = Path(__file__).resolve().parent.parent


def child(db: Path, world: Path, run_id: str, mode: str, go: Path | None = None) -> Any:
    import subprocess
    import sys

    argv = [sys.executable, str(CHILD), str(db), str(world), run_id, mode]
    return subprocess.Popen([*argv, *([str(go)] if go else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def tool_returns(proc: Any) -> list[Any]:
    import json

    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result: list[Any] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.slow
async def test_a_process_killed_between_execute_and_record_is_reconciled_on_retry(
    tmp_path: Path,
) -> None:
    import signal

    db, world = tmp_path / "records.sqlite", tmp_path / "world.txt"
    first = child(db, world, "run-1", "hang")
    assert first.stdout.readline().strip() == "APPLIED", first.stderr.read()
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)  # reaps it and closes its pipes
    assert first.returncode == -signal.SIGKILL
    store = SqliteEffectStore(db)
    record = await store.get("", "run-1:note:release")
    assert record is not None and record.status is EffectRecordStatus.IN_PROGRESS

    retry = child(db, world, "run-1", "apply")  # the same turn again (same run id)
    assert tool_returns(retry) == [{"note": 1, "found": True}]
    assert len(world.read_text().splitlines()) == 1  # applied once, by the killed process
    record = await store.get("", "run-1:note:release")
    assert record is not None and record.status is EffectRecordStatus.APPLIED
    assert record.result == {"note": 1, "found": True}
    await store.close()


@pytest.mark.slow
def test_two_processes_racing_on_one_key_apply_it_once(tmp_path: Path) -> None:
    db, world, go = tmp_path / "records.sqlite", tmp_path / "world.txt", tmp_path / "go"
    procs = [child(db, world, "run-1", "race", go) for _ in range(2)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    go.touch()
    results = [tool_returns(proc) for proc in procs]
    assert len(world.read_text().splitlines()) == 1
    assert results[0] == results[1] == [{"note": 1, "found": False}]


EFFECT_TOOL_FILE = (
    "from pydantic import BaseModel\n"
    "from runtime import define_effect_tool\n"
    "class Note(BaseModel):\n    text: str\n"
    "async def post_note(state, args):\n    return args.text\n"
    "tool = define_effect_tool('Posts a note.', Note, post_note{extra})\n"
)


def test_discovery_accepts_an_effect_tool_and_checks_its_name(tmp_path: Path) -> None:
    from runtime import AgentDefinitionError
    from runtime.agents import load_agent_app
    from runtime.effect_tools import EffectToolDefinition

    app = tmp_path / "app"
    (app / "tools").mkdir(parents=True)
    (app / "tools" / "post_note.py").write_text(
        EFFECT_TOOL_FILE.format(extra=", name='post_note', effect_key=lambda a, e: a.text"))
    loaded = load_agent_app(app)
    tool = loaded.tools["post_note"]
    assert isinstance(tool, EffectToolDefinition) and tool.name == "post_note"
    assert tool.effect_key is not None

    (app / "tools" / "post_note.py").write_text(EFFECT_TOOL_FILE.format(extra=", name='other'"))
    with pytest.raises(AgentDefinitionError, match=(
        r"post_note.py: the tool's name is 'other' but its file is 'post_note.py'")):
        load_agent_app(app)
    (app / "tools" / "post_note.py").write_text(
        "from runtime import define_tool\n"
        "def run(state):\n    return 1\n"
        "tool = define_tool('Plain.', run, name='poster')\n")
    with pytest.raises(AgentDefinitionError, match="the tool's name is 'poster'"):
        load_agent_app(app)
