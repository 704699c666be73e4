"""Hooks as a user sees them: they run at their point for the agents that list them, may
schedule effects and change data, and a raising hook never breaks a turn."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

from runtime import EffectStatus, Execution, HookPoint, Runtime, define_hook
from runtime.testing import FakeClock, override_model
from tests.test_turns import APP, Script, call, text, user_texts


def seen(rt: Runtime, hook_id: str, var: str = "SEEN") -> list[Any]:
    values: list[Any] = rt.agents.hooks[hook_id].execute.__globals__[var]
    return values


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    clock = FakeClock(start=1_800_000_000.0)
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False) as r:
        yield r


async def test_after_thread_created_schedules_an_effect(rt: Runtime) -> None:
    thread = await rt.create_thread("greeted", agent_id="greeter")
    assert seen(rt, "greet_effect") == [None]  # not in a turn
    (run,) = (await thread.list_runs()).runs
    assert run.name == "note" and run.args == {"text": "welcome to greeted"}
    await rt.wait_idle()
    assert (await thread.get_run(run.id)).status is EffectStatus.COMPLETED
    assert [m.content for m in (await thread.get_messages()).messages] == [
        "note: welcome to greeted"
    ]


async def test_an_undeclared_hook_never_runs(rt: Runtime) -> None:
    for agent_id in ("helper", "greeter", "plain"):
        thread = await rt.create_thread(agent_id=agent_id)
        with override_model(rt, Script(text("fine")).model):
            await thread.send_message("hello")
    await rt.wait_idle()
    assert seen(rt, "undeclared", "RAN") == []
    # And the hooks of one agent do not run for another agent's threads.
    assert len(seen(rt, "greet_effect")) == 1
    plain_roles = [r for r, _, e in seen(rt, "watch_messages")]
    assert plain_roles == ["user", "assistant"]  # helper's turn only


async def test_after_tool_call_failure_sees_the_failing_tool(rt: Runtime) -> None:
    thread = await rt.create_thread()
    script = Script(call("explode", {}, "c-boom"), text("sorry"))
    with override_model(rt, script.model):
        result = await thread.send_message("explode please")
    ((tool_call, error, execution),) = seen(rt, "watch_failures")
    assert (tool_call.id, tool_call.name, tool_call.args) == ("c-boom", "explode", {})
    assert error == "RuntimeError: kaboom"
    assert execution == Execution(result.run_id, step=1, tool_call_id="c-boom")
    assert result.reply is not None and result.reply.content == "sorry"


async def test_after_tool_call_success_may_replace_the_result(rt: Runtime) -> None:
    thread = await rt.create_thread()
    script = Script(call("echo", {"text": "hi"}), text("done"))
    with override_model(rt, script.model):
        result = await thread.send_message("echo hi")
    (tool_msg,) = [m for m in result.messages if m.tool_results]
    assert tool_msg.tool_results[0].content == "[hi]"
    assert seen(rt, "watch_failures") == []


async def test_a_raising_hook_does_not_break_the_turn(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    thread = await rt.create_thread()
    # "raise" makes raise_before (before_create_message) and raise_after
    # (after_create_message) raise, for the user message and for the reply.
    script = Script(text("I will not raise"))
    with caplog.at_level(logging.ERROR, logger="runtime.hooks"), override_model(rt, script.model):
        result = await thread.send_message("please raise an error")
    assert result.reply is not None and result.reply.content == "I will not raise"
    stored = [m.content for m in (await thread.get_messages()).messages]
    assert stored == ["please raise an error", "I will not raise"]
    failed = [r.getMessage() for r in caplog.records]
    assert sum("raise_before" in m for m in failed) == 2
    assert sum("raise_after" in m for m in failed) == 2
    assert all("continuing with the original data" in m for m in failed)
    # The other hooks still ran for both messages.
    assert [c for _, c, _ in seen(rt, "watch_messages")] == stored


async def test_before_create_message_changes_what_is_stored_and_what_the_model_sees(
    rt: Runtime,
) -> None:
    thread = await rt.create_thread()
    script = Script(text("your password is hunter2"), text("ok"))
    with override_model(rt, script.model):
        first = await thread.send_message("my password is hunter2")
        await thread.send_message("what is it?")
    assert first.messages[0].content == "my password is [redacted]"
    assert first.reply is not None and first.reply.content == "your password is [redacted]"
    stored = [m.content for m in (await thread.get_messages()).messages]
    assert not any("hunter2" in c for c in stored)
    second_view = script.seen[1]
    assert user_texts(second_view)[0] == "my password is [redacted]"
    assert any(
        isinstance(m, ModelResponse) and m.text == "your password is [redacted]"
        for m in second_view
    )


async def test_filter_messages_changes_what_the_model_sees_not_what_is_stored(
    rt: Runtime,
) -> None:
    thread = await rt.create_thread()
    script = Script(text("a"), text("b"), text("c"))
    with override_model(rt, script.model):
        await thread.send_message("one")
        await thread.send_message("two")
        await thread.send_message("now forget everything")
    assert user_texts(script.seen[1]) == ["one", "two"]
    assert user_texts(script.seen[2]) == ["now forget everything"]
    assert len(script.seen[2]) == 1
    stored = [m.content for m in (await thread.get_messages()).messages]
    assert stored == ["one", "a", "two", "b", "now forget everything", "c"]
    assert [n for n, _ in seen(rt, "watch_history")] == [1, 3, 5]


async def test_hooks_may_inject_messages_during_a_turn(tmp_path: Path) -> None:
    app = tmp_path / "app"
    (app / "agents").mkdir(parents=True)
    (app / "hooks").mkdir()
    (app / "tools").mkdir()
    (app / "agents" / "a.py").write_text(
        "from runtime import define_agent\n"
        "agent = define_agent('a', 'x', tools=['poke'], hooks=['echo_user'])\n"
    )
    (app / "tools" / "poke.py").write_text(
        "from runtime import define_tool\n"
        "async def poke(state):\n"
        "    await state.inject_message('poked during the turn', role='system')\n"
        "    # A state without the turn's context (as host code would get) must not wait\n"
        "    # for the turn it is part of.\n"
        "    fresh = await state.runtime.get_thread(state.thread_id)\n"
        "    await fresh.inject_message('poked again')\n"
        "    return 'poked'\n"
        "tool = define_tool('Pokes.', poke)\n"
    )
    (app / "hooks" / "echo_user.py").write_text(
        "from runtime import define_hook\n"
        "async def echo_user(state, message):\n"
        "    if message.role == 'user':\n"
        "        await state.inject_message('saw: ' + message.content)\n"
        "hook = define_hook('after_create_message', 'echo_user', echo_user)\n"
    )
    async with Runtime(app_dir=app, data_dir=tmp_path / "data", load_packages=False) as rt:
        thread = await rt.create_thread()
        script = Script(
            ModelResponse(parts=[TextPart("poking"), ToolCallPart("poke", {})]), text("done")
        )
        with override_model(rt, script.model):
            result = await thread.send_message("hi")
        stored = [(str(m.role), m.content) for m in (await thread.get_messages()).messages]
    assert stored == [
        ("user", "hi"),
        ("assistant", "poking"),
        ("tool", "poked"),
        ("assistant", "done"),
        ("assistant", "saw: hi"),
        ("system", "poked during the turn"),
        ("assistant", "poked again"),
    ]
    assert result.reply is not None and result.reply.content == "done"
    # Messages injected inside the turn carry its run id; the model never saw them mid-turn.
    assert {m.run_id for m in result.messages} == {result.run_id}


def test_define_hook_checks_its_arguments() -> None:
    async def noop(state: object) -> None:
        return None

    assert define_hook("filter_messages", "x", noop).hook is HookPoint.FILTER_MESSAGES
    with pytest.raises(ValueError, match="unknown hook point 'before_everything'"):
        define_hook("before_everything", "x", noop)
    with pytest.raises(ValueError, match="id"):
        define_hook("after_thread_created", "", noop)
    with pytest.raises(TypeError, match="callable"):
        define_hook("after_thread_created", "x", "noop")  # type: ignore[arg-type]
