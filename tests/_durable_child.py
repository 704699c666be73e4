"""A real process running a durable turn, for the crash test.

Usage:
    python tests/_durable_child.py JOURNAL_DB WORLD RUN_ID MODE

The tool ``charge`` appends a line to the WORLD file (the card's statement). The model
calls ``charge`` and then answers with what the tool returned. MODE:
    hang    after ``charge`` ran (and was journaled), print "CHARGED" and hang in the next
            model step (to be killed with SIGKILL)
    finish  run the turn to the end and print its output as JSON on one line
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.durable import SqliteJournal, run_durable


def main(db: str, world_path: str, run_id: str, mode: str) -> None:
    world = Path(world_path)

    def charge(order: int) -> str:
        """Charges the card for an order."""
        with world.open("a") as f:
            f.write(f"charged order {order}\n")
        return f"order {order} charged"

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("charge", {"order": 42})])
        if mode == "hang":
            print("CHARGED", flush=True)
            await asyncio.Event().wait()  # killed here: charged and journaled, no answer yet
        return ModelResponse(parts=[TextPart(f"Done: {returns[0].content}.")])

    async def run() -> str:
        journal = SqliteJournal(db)
        agent = Agent(FunctionModel(answer), tools=[charge])
        try:
            result = await run_durable(agent, "charge order 42", run_id=run_id,
                                       journal=journal)
        finally:
            await journal.close()
        output: str = result.output
        return output

    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
