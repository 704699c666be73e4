"""Durable turns outside the runtime: `run_durable`, `durable_tool`, `args_hash`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    RunContext,
    Tool,
    ToolDenied,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from runtime import EffectRecordStatus
from runtime.durable import (
    DurableContext,
    InMemoryJournal,
    Journal,
    SqliteJournal,
    ToolCallReplayed,
    call_key,
    durable_tool,
    durable_tools,
    run_durable,
)
from runtime.keys import NO_ARGS_HASH, args_hash

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).parent / "_durable_child.py"


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path,
                  no_blocking: None) -> AsyncIterator[Journal]:
    """Each journal; nothing a durable run does may block the event loop."""
    backend: Journal = (InMemoryJournal() if request.param == "memory"
                        else SqliteJournal(tmp_path / "journal.sqlite"))
    yield backend
    await backend.close()


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


@dataclass
class Script:
    """A scripted model: step n answers ``steps[n-1]``; counts its requests."""

    steps: list[Any]
    requests: int = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        step = sum(1 for m in messages if isinstance(m, ModelResponse))
        answer = self.steps[step]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            answer = answer(messages)
        return ModelResponse(parts=answer if isinstance(answer, list) else [answer])


def final_from_returns(messages: list[ModelMessage]) -> TextPart:
    return TextPart("Done: " + "; ".join(str(p.content) for p in tool_returns(messages)))


# --- the charge example ----------------------------------------------------------------


async def test_a_resumed_run_does_not_charge_again(journal: Journal) -> None:
    charges = 0

    def charge(order: int) -> str:
        """Charges the card for an order."""
        nonlocal charges
        charges += 1
        return f"order {order} charged"

    script = Script([ToolCallPart("charge", {"order": 42}), RuntimeError("model unavailable")])
    agent = Agent(FunctionModel(script), tools=[charge])
    with pytest.raises(RuntimeError, match="model unavailable"):
        await run_durable(agent, "charge order 42", run_id="run-1", journal=journal)
    assert charges == 1 and script.requests == 2

    script.steps[1] = final_from_returns
    result = await run_durable(agent, "charge order 42", run_id="run-1", journal=journal)
    assert charges == 1
    assert result.output == "Done: order 42 charged"
    assert script.requests == 3  # step 1 came from the journal, step 2 was asked again
    call_ids = [p.tool_call_id for p in tool_returns(result.all_messages())]
    assert len(call_ids) == 1
    record = await journal.get(call_key("run-1", call_ids[0]))
    assert record is not None and record.status is EffectRecordStatus.SUCCEEDED

    again = await run_durable(agent, "charge order 42", run_id="run-2", journal=journal)
    assert charges == 2 and again.output == "Done: order 42 charged"  # a new turn charges


async def test_a_finished_run_replays_without_model_requests_or_tools(journal: Journal) -> None:
    charges = 0

    def charge(order: int) -> str:
        nonlocal charges
        charges += 1
        return f"order {order} charged"

    script = Script([ToolCallPart("charge", {"order": 7}), final_from_returns])
    agent = Agent(FunctionModel(script), tools=[charge])
    first = await run_durable(agent, "charge", run_id="run-1", journal=journal)
    second = await run_durable(agent, "charge", run_id="run-1", journal=journal)
    assert (charges, script.requests) == (1, 2)
    assert second.output == first.output == "Done: order 7 charged"
    assert [p.tool_call_id for p in tool_returns(second.all_messages())] == [
        p.tool_call_id for p in tool_returns(first.all_messages())
    ]


async def test_a_failed_call_runs_again_on_resume(journal: Journal) -> None:
    attempts = 0

    def ship(order: int) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("carrier unreachable")
        return f"order {order} shipped"

    script = Script([ToolCallPart("ship", {"order": 5}), final_from_returns])
    agent = Agent(FunctionModel(script), tools=[ship])
    with pytest.raises(ConnectionError):
        await run_durable(agent, "ship", run_id="run-1", journal=journal)
    page = await journal.store.list("", status=EffectRecordStatus.FAILED)
    assert [r.tool_name for r in page.records] == ["ship"]
    assert "carrier unreachable" in page.records[0].result["error"]

    result = await run_durable(agent, "ship", run_id="run-1", journal=journal)
    assert attempts == 2 and result.output == "Done: order 5 shipped"
    assert script.requests == 2  # the tool call came from the journal, not a new request


async def test_model_retry_is_not_journaled_as_a_result(journal: Journal) -> None:
    seen: list[int] = []

    def pick(n: int) -> str:
        seen.append(n)
        if n < 2:
            raise ModelRetry("n must be at least 2")
        return f"picked {n}"

    script = Script([ToolCallPart("pick", {"n": 1}), ToolCallPart("pick", {"n": 2}),
                     final_from_returns])
    agent = Agent(FunctionModel(script), tools=[pick])
    result = await run_durable(agent, "pick", run_id="run-1", journal=journal)
    assert seen == [1, 2] and result.output.endswith("picked 2")


async def test_tools_passed_to_the_run_and_toolsets_are_journaled(journal: Journal) -> None:
    from pydantic_ai.toolsets import FunctionToolset

    runs = 0

    def note(text: str) -> str:
        nonlocal runs
        runs += 1
        return "noted"

    script = Script([ToolCallPart("note", {"text": "x"}), RuntimeError("crash")])
    agent = Agent(FunctionModel(script))
    with pytest.raises(RuntimeError):
        await run_durable(agent, "n", run_id="r", journal=journal,
                          toolsets=[FunctionToolset([note])])
    script.steps[1] = final_from_returns
    result = await run_durable(agent, "n", run_id="r", journal=journal,
                               toolsets=[FunctionToolset([note])])
    assert runs == 1 and result.output == "Done: noted"


async def test_a_streamed_run_replays_its_journaled_steps(journal: Journal) -> None:
    charges = 0
    stream_requests = 0
    crash = True

    def charge(order: int) -> str:
        nonlocal charges
        charges += 1
        return f"order {order} charged"

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        nonlocal stream_requests
        stream_requests += 1
        returns = tool_returns(messages)
        if not returns:
            yield {0: DeltaToolCall(name="charge", json_args='{"order": 9}', tool_call_id="c9")}
            return
        if crash:
            raise RuntimeError("stream broke")
        yield f"Done: {returns[0].content}"

    events: list[Any] = []

    async def handler(ctx: RunContext[Any], stream_events: AsyncIterator[Any]) -> None:
        async for event in stream_events:
            events.append(event)

    agent = Agent(FunctionModel(stream_function=stream), tools=[charge])
    with pytest.raises(RuntimeError, match="stream broke"):
        await run_durable(agent, "charge", run_id="s1", journal=journal,
                          event_stream_handler=handler)
    assert not [e for e in events if isinstance(e, ToolCallReplayed)]
    crash = False
    result = await run_durable(agent, "charge", run_id="s1", journal=journal,
                               event_stream_handler=handler)
    assert charges == 1 and stream_requests == 3
    assert result.output == "Done: order 9 charged"
    replayed = [e for e in events if isinstance(e, ToolCallReplayed)]
    assert [(e.tool_name, e.tool_call_id, e.status, e.key, e.run_id) for e in replayed] == [
        ("charge", "c9", "succeeded", call_key("s1", "c9"), "s1")]


# --- idempotency="args" and args_hash ---------------------------------------------------


async def test_calls_with_fresh_call_ids_and_the_same_args_run_once(journal: Journal) -> None:
    sent: list[str] = []

    def send_sms(to: str, text: str) -> dict[str, Any]:
        sent.append(to)
        return {"sms": len(sent)}

    script = Script([
        ToolCallPart("send_sms", {"to": "+1555", "text": "hi"}, tool_call_id="a"),
        ToolCallPart("send_sms", {"text": "hi", "to": "+1555"}, tool_call_id="b"),
        ToolCallPart("send_sms", {"to": "+1666", "text": "hi"}, tool_call_id="c"),
        final_from_returns,
    ])
    agent = Agent(FunctionModel(script), tools=[durable_tool(send_sms, idempotency="args")])
    result = await run_durable(agent, "sms", run_id="run-1", journal=journal)
    assert sent == ["+1555", "+1666"]
    assert [p.content for p in tool_returns(result.all_messages())] == [
        {"sms": 1}, {"sms": 1}, {"sms": 2}]


async def test_a_tool_without_arguments_keys_on_the_reserved_token(journal: Journal) -> None:
    pings = 0

    def ping() -> str:
        nonlocal pings
        pings += 1
        return "pong"

    script = Script([ToolCallPart("ping", {}), ToolCallPart("ping", None), final_from_returns])
    agent = Agent(FunctionModel(script), tools=[durable_tool(ping, idempotency="args")])
    result = await run_durable(agent, "ping", run_id="run-1", journal=journal)
    assert pings == 1 and result.output == "Done: pong; pong"
    record = await journal.get(f"durable:run:run-1:args:ping:{NO_ARGS_HASH}")
    assert record is not None and record.result == "pong"


def test_args_hash_is_order_free_for_mappings_and_sets() -> None:
    assert args_hash({"b": 2, "a": 1}) == args_hash({"a": 1, "b": 2})
    assert args_hash({"x": {"q": [1, {"z": 1, "y": 2}]}, "w": 0}) == args_hash(
        {"w": 0, "x": {"q": [1, {"y": 2, "z": 1}]}})
    assert args_hash({"tags": {"b", "a", "c"}}) == args_hash({"tags": {"c", "a", "b"}})
    assert args_hash({1: "a", "1": "b"}) == args_hash({"1": "b", 1: "a"})
    assert args_hash({"a": [1, 2]}) != args_hash({"a": [2, 1]})  # lists keep their order


@pytest.mark.parametrize(("one", "other"), [
    (datetime(2024, 1, 1, tzinfo=UTC), "2024-01-01T00:00:00+00:00"),
    ({1, 2}, [1, 2]),
    ((1, 2), [1, 2]),
    (frozenset({1}), {1}),
    (True, 1),
    (False, 0),
    (Decimal("1"), 1),
    (b"abc", "abc"),
    (None, "None"),
    (1, "1"),
    (1, 1.0),
    ({"a": 1}, [("a", 1)]),
])
def test_args_hash_is_type_tagged(one: Any, other: Any) -> None:
    assert args_hash({"v": one}) != args_hash({"v": other})


def test_one_and_one_point_zero_share_a_key_only_through_a_float_field() -> None:
    """The documented rule: 1 and 1.0 differ; a ``float`` field validates both to 1.0."""
    assert args_hash({"amount": 1}) != args_hash({"amount": 1.0})

    class Charge(BaseModel):
        amount: float

    as_int = Charge.model_validate({"amount": 1})
    as_float = Charge.model_validate_json('{"amount": 1.0}')
    assert args_hash({"c": as_int}) == args_hash({"c": as_float})


def test_args_hash_of_no_arguments_and_of_models() -> None:
    assert args_hash({}) == args_hash(None) == NO_ARGS_HASH
    assert args_hash({"a": None}) != NO_ARGS_HASH and len(args_hash({"a": None})) == 64

    class A(BaseModel):
        x: int

    class B(BaseModel):
        x: int

    assert args_hash({"m": A(x=1)}) == args_hash({"m": A(x=1)})
    assert args_hash({"m": A(x=1)}) != args_hash({"m": B(x=1)})
    assert args_hash({"m": A(x=1)}) != args_hash({"m": {"x": 1}})


def test_args_hash_refuses_unsupported_values_naming_itself_and_the_type() -> None:
    with pytest.raises(TypeError, match=r"args_hash: args\.f is a function of type function"):
        args_hash({"f": lambda: None})
    with pytest.raises(TypeError, match=r"args_hash: args\.o is a value of type object"):
        args_hash({"o": object()})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(TypeError, match=r"args_hash: .* cycle"):
        args_hash({"c": cyclic})


def test_args_hash_refuses_deep_nesting_naming_itself_and_the_limit() -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(TypeError, match=r"args_hash: args(\.a)+ nests containers deeper than "
                                        r"the limit of 64 levels"):
        args_hash(deep)
    shallow: dict[str, Any] = {}
    inner = shallow
    for _ in range(60):
        inner["a"] = {}
        inner = inner["a"]
    assert len(args_hash(shallow)) == 64


# --- keys with a window -------------------------------------------------------------------


def test_a_key_without_a_window_is_refused_where_the_tool_is_declared() -> None:
    def charge(order: int) -> str:
        return "ok"

    with pytest.raises(TypeError, match=r"tool 'charge'.*choose a window"):
        durable_tool(charge, idempotency_key=lambda args: str(args["order"]))
    with pytest.raises(TypeError, match=r"tool 'charge'.*no idempotency_key"):
        durable_tool(charge, idempotency_window="run")
    with pytest.raises(ValueError, match=r"tool 'charge'.*'run', 'thread' or 'cross-run'"):
        durable_tool(charge, idempotency_key=lambda a: "k", idempotency_window="day")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tool 'charge'.*idempotency must be"):
        durable_tool(charge, idempotency="once")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="durable_tool: expected"):
        durable_tool(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tool 'charge': idempotency_key must be a function"):
        durable_tool(charge, idempotency_key="fixed", idempotency_window="run")  # type: ignore[arg-type]


async def test_a_key_function_returning_no_string_is_named_idempotency_key() -> None:
    charged: list[int] = []

    def charge(order: int) -> str:
        charged.append(order)
        return "ok"

    tool = durable_tool(charge, idempotency_key=lambda args: args["order"],  # type: ignore[arg-type,return-value]
                        idempotency_window="run")
    agent = Agent(FunctionModel(Script([ToolCallPart("charge", {"order": 3}),
                                        final_from_returns])), tools=[tool])
    with pytest.raises(TypeError, match="tool charge: idempotency_key must return a string, "
                                        "got int"):
        await run_durable(agent, "charge", run_id="run-1", journal=InMemoryJournal())
    assert charged == []


@pytest.mark.parametrize("bad", ["2026-01-01", 5, datetime(2026, 1, 1)])
async def test_purge_refuses_what_is_not_an_aware_datetime(bad: Any) -> None:
    journal = InMemoryJournal(thread_id="t1")
    with pytest.raises(TypeError, match=r"Journal\.purge: older_than must be an aware datetime"):
        await journal.purge(older_than=bad)


def order_tools(shipped: list[int], window: str) -> tuple[Tool[Any], Script]:
    def ship(order: int, note: str = "") -> str:
        shipped.append(order)
        return f"order {order} shipped"

    tool = durable_tool(ship, idempotency_key=lambda args: f"order-{args['order']}",
                        idempotency_window=window)  # type: ignore[arg-type]
    script = Script([ToolCallPart("ship", {"order": 3, "note": "first"}),
                     ToolCallPart("ship", {"order": 3, "note": "rephrased"}),
                     final_from_returns])
    return tool, script


async def test_the_run_window_holds_for_one_run_and_a_new_run_does_it_again(
    journal: Journal,
) -> None:
    shipped: list[int] = []
    tool, script = order_tools(shipped, "run")
    agent = Agent(FunctionModel(script), tools=[tool])
    first = await run_durable(agent, "ship", run_id="run-1", journal=journal)
    assert shipped == [3] and first.output == "Done: order 3 shipped; order 3 shipped"
    await run_durable(agent, "ship", run_id="run-2", journal=journal)
    assert shipped == [3, 3]


async def test_the_run_window_spans_a_sub_agent(journal: Journal) -> None:
    shipped: list[int] = []
    ship, _ = order_tools(shipped, "run")
    sub_script = Script([ToolCallPart("ship", {"order": 3}), final_from_returns])
    sub_agent = Agent(FunctionModel(sub_script), tools=[ship])

    async def delegate(ctx: RunContext[Any], order: int) -> str:
        """Hands the order to the shipping agent."""
        result = await run_durable(sub_agent, f"ship order {order}",
                                   run_id=f"run-1/{ctx.tool_call_id}", journal=journal)
        output: str = result.output
        return output

    parent_script = Script([ToolCallPart("ship", {"order": 3}),
                            ToolCallPart("delegate", {"order": 3}), final_from_returns])
    parent = Agent(FunctionModel(parent_script), tools=[ship, delegate])
    result = await run_durable(parent, "ship order 3", run_id="run-1", journal=journal)
    assert shipped == [3]
    assert result.output == "Done: order 3 shipped; Done: order 3 shipped"
    assert sub_script.requests == 2

    with pytest.raises(ValueError, match="sub-agent run needs its own run_id"):
        async def same_id(ctx: RunContext[Any]) -> str:
            await run_durable(sub_agent, "x", run_id="run-2", journal=journal)
            return "never"

        looping = Agent(FunctionModel(Script([ToolCallPart("same_id", {})])), tools=[same_id])
        await run_durable(looping, "x", run_id="run-2", journal=journal)


async def test_the_thread_window_holds_across_runs_of_a_thread() -> None:
    store_journal = InMemoryJournal(thread_id="t1")
    other_thread = Journal(store_journal.store, thread_id="t2")  # one store, two threads
    shipped: list[int] = []
    tool, script = order_tools(shipped, "thread")
    agent = Agent(FunctionModel(script), tools=[tool])
    await run_durable(agent, "ship", run_id="run-1", journal=store_journal)
    await run_durable(agent, "ship", run_id="run-2", journal=store_journal)
    assert shipped == [3]
    await run_durable(agent, "ship", run_id="run-3", journal=other_thread)
    assert shipped == [3, 3]


async def test_the_cross_run_window_holds_across_threads_until_purged() -> None:
    t1 = InMemoryJournal(thread_id="t1")
    t2 = Journal(t1.store, thread_id="t2")
    shipped: list[int] = []
    tool, script = order_tools(shipped, "cross-run")
    agent = Agent(FunctionModel(script), tools=[tool])
    await run_durable(agent, "ship", run_id="run-1", journal=t1)
    await run_durable(agent, "ship", run_id="run-2", journal=t2)
    assert shipped == [3]
    await t2.purge(older_than=datetime(2999, 1, 1, tzinfo=UTC))
    await run_durable(agent, "ship", run_id="run-3", journal=t2)
    assert shipped == [3, 3]


# --- outside run_durable --------------------------------------------------------------------


async def test_durable_tools_journal_in_the_given_context(journal: Journal) -> None:
    sent: list[str] = []

    def send(to: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    ctx = DurableContext(journal=journal, run_id="manual-1")
    tools = durable_tools([durable_tool(send, idempotency="args")], ctx)
    script = Script([ToolCallPart("send", {"to": "ann"}), ToolCallPart("send", {"to": "ann"}),
                     final_from_returns])
    agent = Agent(FunctionModel(script), tools=tools)
    result = await agent.run("send")
    assert sent == ["ann"] and result.output == "Done: sent to ann; sent to ann"


async def test_a_durable_tool_without_a_run_or_context_says_so() -> None:
    def send(to: str) -> str:
        return "sent"

    agent = Agent(FunctionModel(Script([ToolCallPart("send", {"to": "ann"})])),
                  tools=[durable_tool(send)])
    with pytest.raises(RuntimeError, match="durable tool send: called outside run_durable"):
        await agent.run("send")


async def test_run_durable_checks_its_arguments() -> None:
    agent = Agent(FunctionModel(Script([TextPart("hi")])))
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        await run_durable(agent, "x", run_id="", journal=InMemoryJournal())
    with pytest.raises(TypeError, match="journal must be a Journal"):
        await run_durable(agent, "x", run_id="r", journal=object())  # type: ignore[arg-type]


# --- a real process killed with SIGKILL -----------------------------------------------------


def child(db: Path, world: Path, run_id: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), str(db), str(world), run_id, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


@pytest.mark.slow
def test_a_process_killed_after_the_charge_resumes_without_charging_again(
    tmp_path: Path,
) -> None:
    db, world = tmp_path / "journal.sqlite", tmp_path / "statement.txt"
    first = child(db, world, "run-1", "hang")
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "CHARGED", first.communicate()[1]
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()  # reaps it and closes its pipes
    assert first.returncode == -signal.SIGKILL
    assert world.read_text().splitlines() == ["charged order 42"]

    second = child(db, world, "run-1", "finish")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == "Done: order 42 charged."
    assert world.read_text().splitlines() == ["charged order 42"]


async def test_a_denied_call_is_journaled_and_never_runs_in_that_run(journal: Journal) -> None:
    refunds = 0

    def refund(order: int) -> str:
        nonlocal refunds
        refunds += 1
        return f"order {order} refunded"

    script = Script([ToolCallPart("refund", {"order": 4}, tool_call_id="r4"),
                     final_from_returns])
    agent = Agent(FunctionModel(script), tools=[Tool(refund, requires_approval=True)],
                  output_type=[str, DeferredToolRequests])
    asked = await run_durable(agent, "refund", run_id="run-1", journal=journal)
    assert isinstance(asked.output, DeferredToolRequests)
    assert [c.tool_call_id for c in asked.output.approvals] == ["r4"]

    history = asked.all_messages()
    denied = await run_durable(
        agent, None, run_id="run-2", journal=journal, message_history=history,
        deferred_tool_results=DeferredToolResults(approvals={"r4": ToolDenied("not today")}),
    )
    assert refunds == 0 and denied.output == "Done: not today"
    record = await journal.get(call_key("run-2", "r4"))
    assert record is not None and record.status is EffectRecordStatus.DENIED
    assert (record.tool_name, record.result) == ("refund", "not today")

    # A later attempt of that run that approves the call gets the denial, not a refund.
    again = await run_durable(
        agent, None, run_id="run-2", journal=journal, message_history=history,
        deferred_tool_results=DeferredToolResults(approvals={"r4": True}),
    )
    assert refunds == 0 and again.output == "Done: not today"


def test_the_module_exports_what_it_names() -> None:
    import runtime.durable as durable

    assert len(set(durable.__all__)) == len(durable.__all__)
    assert all(hasattr(durable, name) for name in durable.__all__)


async def test_a_model_set_with_agent_override_is_the_one_journaled(journal: Journal) -> None:
    script = Script([TextPart("from the override")])
    agent = Agent(FunctionModel(Script([TextPart("from the agent")])))
    with agent.override(model=FunctionModel(script)):
        result = await run_durable(agent, "hi", run_id="run-1", journal=journal)
    assert result.output == "from the override" and script.requests == 1


def test_a_durable_tool_keeps_what_the_model_sees() -> None:
    def charge(order: int, note: str = "") -> str:
        """Charges the card.

        Args:
            order: The order id.
            note: A note for the statement.
        """
        return "ok"

    plain = Tool(charge, strict=True, sequential=True)
    durable = durable_tool(plain, idempotency="args")
    before, after = plain.tool_def, durable.tool_def
    assert (after.name, after.description, after.parameters_json_schema, after.strict,
            after.sequential) == (before.name, before.description,
                                  before.parameters_json_schema, True, True)
    assert after.metadata == {"runtime.durable": {"idempotency": "args"}}
