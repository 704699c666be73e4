"""An agent whose scripted model charges an order, then says it was charged.

Step 1 calls ``charge`` with the order in the user's message ("charge order 42"); step 2
answers with what the tool returned. While the file named by ``SHOP_HANG_FILE`` exists,
step 2 prints ``CHARGED`` and hangs (a process to kill between the tool's side effect and
the model's next step).
"""

import asyncio
import os
import re
from pathlib import Path

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime import define_agent


async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        prompt = next(p for p in last.parts if isinstance(p, UserPromptPart))
        order = int(re.findall(r"\d+", str(prompt.content))[0])
        return ModelResponse(parts=[ToolCallPart("charge", {"order": order})])
    hang = os.environ.get("SHOP_HANG_FILE")
    if hang and await asyncio.to_thread(Path(hang).exists):
        print("CHARGED", flush=True)
        await asyncio.Event().wait()
    return ModelResponse(parts=[TextPart(f"Done: {returns[0].content}.")])


agent = define_agent("shop", "Charge the orders the user asks for.", tools=["charge"],
                     model=FunctionModel(script))
