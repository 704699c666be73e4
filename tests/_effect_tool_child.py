"""A real process running an agent with an effect tool, for crash and race tests.

Usage:
    python tests/_effect_tool_child.py RECORDS_DB WORLD RUN_ID MODE [GO_FILE]

The effect tool ``post_note`` appends a line carrying ``effect_marker(key)`` to the WORLD
file (the "remote" system); its ``already_applied`` looks for that marker there. MODE:
    hang   print "APPLIED" after the effect and hang before it is recorded (to be killed)
    apply  run the turn and print the tool returns as JSON on one line
    race   like apply, but start only once GO_FILE exists (several processes at once)
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

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
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime import (
    EffectToolContext,
    EffectToolSettings,
    Execution,
    SqliteEffectStore,
    ToolRunState,
    define_effect_tool,
    effect_marker,
    find_effect_markers,
    wrap_tools_for_run,
)


class Note(BaseModel):
    topic: str
    text: str


def main(db: str, world_path: str, run_id: str, mode: str, go: str | None) -> None:
    world = Path(world_path)

    def key_of(args: Note, execution: Execution) -> str:
        return f"{execution.run_id}:note:{args.topic}"

    def find_note(key: str, args: Note) -> dict[str, Any] | None:
        lines = world.read_text().splitlines() if world.exists() else []
        for number, line in enumerate(lines, 1):
            if key in find_effect_markers(line):
                return {"note": number, "found": True}
        return None

    async def post_note(state: ToolRunState, args: Note) -> dict[str, Any]:
        key = key_of(args, state.execution)
        with world.open("a") as f:
            f.write(f"{args.text} {effect_marker(key)}\n")
        number = len(world.read_text().splitlines())
        if mode == "hang":
            print("APPLIED", flush=True)
            await asyncio.Event().wait()  # killed here: applied, not recorded
        await asyncio.sleep(0.3)  # widen the window for racing processes
        return {"note": number, "found": False}

    tool = define_effect_tool("Posts a note.", Note, post_note, effect_key=key_of,
                              already_applied=find_note)

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            args = {"topic": "release", "text": "Shipped 1.2"}
            return ModelResponse(parts=[ToolCallPart("post_note", args, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("done")])

    async def run() -> list[Any]:
        store = SqliteEffectStore(db)
        # A crashed holder's lease must run out quickly for the retry ("hang"); racing live
        # processes must not lose theirs to a slow disk while they apply ("race").
        lease = 30.0 if mode == "race" else 1.0
        settings = EffectToolSettings(lease_seconds=lease, poll_interval_seconds=0.02)
        ctx = EffectToolContext(run_id=run_id, agent="notes", trigger="test", settings=settings)
        agent = Agent(FunctionModel(answer), toolsets=[wrap_tools_for_run([tool], ctx, store)])
        if go is not None:
            print("READY", flush=True)
            while not Path(go).exists():
                await asyncio.sleep(0.005)
        result = await agent.run("post the release note")
        await store.close()
        return [p.content for m in result.all_messages() if isinstance(m, ModelRequest)
                for p in m.parts if isinstance(p, ToolReturnPart)]

    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5], sys.argv[5] if len(sys.argv) > 5 else None)
