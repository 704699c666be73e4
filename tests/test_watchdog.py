"""The loop watchdog: a blocking async effect is named in one warning; a sync one is not."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from runtime import Runtime

BLOCKING = '''
import time
from pydantic import BaseModel
from runtime import ThreadState, define_effect

class Block(BaseModel):
    seconds: float

async def block(state: ThreadState, args: Block) -> None:
    time.sleep(args.seconds)  # the mistake the watchdog is for

def block_sync(state: ThreadState, args: Block) -> None:
    time.sleep(args.seconds)  # fine: a sync effect runs in a worker thread
'''


def app(tmp_path: Path) -> Path:
    effects = tmp_path / "app" / "effects"
    effects.mkdir(parents=True)
    (effects / "block.py").write_text(
        BLOCKING + 'effect = define_effect("Blocks the loop.", Block, block)\n'
    )
    (effects / "block_sync.py").write_text(
        BLOCKING +
        'effect = define_effect("Blocks its worker thread.", Block, block_sync)\n'
    )
    return tmp_path / "app"


def stall_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "event loop was blocked" in r.getMessage()]


async def test_a_blocking_async_effect_is_named_once_per_stall(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runtime")
    async with Runtime(
        app_dir=app(tmp_path), data_dir=tmp_path / "data", load_packages=False,
        loop_stall_warning_seconds=0.3,
    ) as rt:
        thread = await rt.create_thread("t")
        run_id = await thread.schedule_effect("block", {"seconds": 1.5})
        await rt.wait_idle()
        async with asyncio.timeout(30):
            while not stall_warnings(caplog):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a few more beats: still one warning for the one stall
    [warning] = stall_warnings(caplog)
    assert f"by effect block (thread t, run {run_id})" in warning
    assert re.search(r"blocked for \d+\.\d s", warning)
    assert "Never block in an async effect" in warning


async def test_a_sync_effect_that_sleeps_does_not_stall_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runtime")
    async with Runtime(
        app_dir=app(tmp_path), data_dir=tmp_path / "data", load_packages=False,
        loop_stall_warning_seconds=1.0,
    ) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("block_sync", {"seconds": 1.5})
        await rt.wait_idle()
    assert stall_warnings(caplog) == []


async def test_the_watchdog_can_be_switched_off(tmp_path: Path) -> None:
    async with Runtime(
        data_dir=tmp_path, load_packages=False, loop_stall_warning_seconds=None
    ) as rt:
        assert rt.watchdog is None


BLOCKING_TOOL = '''
import time
from runtime import ThreadState, define_tool

async def block_tool(state: ThreadState) -> str:
    time.sleep(1.2)  # the mistake the watchdog is for, in a tool
    return "slept"

tool = define_tool("Blocks the loop.", block_tool)
'''


async def test_a_blocking_async_tool_is_named_with_its_thread_and_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.testing import override_model

    root = tmp_path / "app"
    (root / "tools").mkdir(parents=True)
    (root / "agents").mkdir()
    (root / "tools" / "block_tool.py").write_text(BLOCKING_TOOL)
    (root / "agents" / "blocker.py").write_text(
        "from runtime import define_agent\n\n"
        "agent = define_agent('blocker', 'You block.', tools=['block_tool'])\n"
    )

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("block_tool", {}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("done")])

    caplog.set_level(logging.WARNING, logger="runtime")
    async with Runtime(
        app_dir=root, data_dir=tmp_path / "data", load_packages=False,
        loop_stall_warning_seconds=0.3,
    ) as rt:
        thread = await rt.create_thread("t")
        with override_model(rt, FunctionModel(answer)):
            result = await thread.send_message("block")
        async with asyncio.timeout(30):
            while not stall_warnings(caplog):
                await asyncio.sleep(0.05)
    [warning] = stall_warnings(caplog)
    assert f"by tool block_tool (thread t, turn run {result.run_id})" in warning
    assert "Never block in an async tool" in warning
    assert "sync tool runs in a worker thread" in warning
