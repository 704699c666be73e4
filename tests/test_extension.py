"""The extension point: the conversation layer plugs into the runtime; the core runs without it."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from runtime import ConversationExtension, Extension, Runtime, ThreadState
from runtime.testing import FakeClock

APP = Path(__file__).parent / "apps" / "core"
TURNS_APP = Path(__file__).parent / "apps" / "turns"


class Recorder(Extension):
    """Records every call the runtime makes into it."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def start(self, runtime: Runtime) -> None:
        self.calls.append(("start", runtime.registry.resolve("record").name))

    async def close(self, runtime: Runtime) -> None:
        self.calls.append(("close", None))

    def agent_for_new_thread(self, agent_id: str | None) -> str | None:
        self.calls.append(("agent_for_new_thread", agent_id))
        return agent_id or "chosen"

    async def thread_created(self, state: ThreadState) -> None:
        self.calls.append(("thread_created", (state.thread_id, state.agent_id)))

    def attributes(self) -> dict[str, Any]:
        return {"recorder_calls": self.calls}


async def test_a_runtime_without_extensions_runs_effects_and_has_no_conversation(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, extensions=[]
    ) as rt:
        thread = await rt.create_thread("t", agent_id="anything")
        assert thread.agent_id == "anything"  # no agents to check it against
        await thread.schedule_effect("record", {"key": "k"})
        await rt.wait_idle()
        lines = (tmp_path / "record.jsonl").read_text().splitlines()
        assert [json.loads(line)["key"] for line in lines] == ["k"]
        with pytest.raises(RuntimeError, match="no conversation layer"):
            await thread.send_message("hi")
        with pytest.raises(RuntimeError, match="no conversation layer"):
            await thread.get_messages()
        with pytest.raises(AttributeError, match="agents"):
            rt.agents  # noqa: B018


async def test_the_runtime_calls_its_extensions_at_each_point(tmp_path: Path) -> None:
    recorder = Recorder()
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, extensions=[recorder]
    ) as rt:
        assert recorder.calls == [("start", "record")]  # after effects were discovered
        await rt.create_thread("t")
        assert rt.recorder_calls is recorder.calls
    assert recorder.calls[1:] == [
        ("agent_for_new_thread", None),
        ("thread_created", ("t", "chosen")),
        ("close", None),
    ]


async def test_an_extension_that_fails_to_start_stops_the_start_and_frees_the_data_dir(
    tmp_path: Path,
) -> None:
    class Broken(Extension):
        async def start(self, runtime: Runtime) -> None:
            raise ValueError("cannot start")

    with pytest.raises(ValueError, match="cannot start"):
        await Runtime(data_dir=tmp_path, extensions=[Broken()]).start()
    async with Runtime(data_dir=tmp_path, extensions=[]):  # the lock was released
        pass


async def test_by_default_a_runtime_has_the_conversation_layer(tmp_path: Path) -> None:
    async with Runtime(app_dir=TURNS_APP, data_dir=tmp_path, load_packages=False) as rt:
        assert [type(e) for e in rt.extensions] == [ConversationExtension]
        assert rt.agents.agents  # loaded from the app's agents/
        thread = await rt.create_thread()
        assert thread.agent_id in rt.agents.agents


@pytest.mark.parametrize("freeze_gc", [False, True])
async def test_gc_freeze_happens_only_when_asked(tmp_path: Path, freeze_gc: bool) -> None:
    gc.unfreeze()
    try:
        async with Runtime(
            data_dir=tmp_path, extensions=[], load_packages=False, freeze_gc=freeze_gc
        ):
            assert (gc.get_freeze_count() > 0) is freeze_gc
    finally:
        gc.unfreeze()
