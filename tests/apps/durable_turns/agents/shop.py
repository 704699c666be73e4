"""An agent whose scripted model charges an order, then says it was charged.

Step 1 calls ``charge`` with the order in the user's message ("charge order 42"); step 2
answers with what the tool returned. While the file named by ``SHOP_HANG_FILE`` exists,
step 2 prints ``CHARGED`` and waits (a process to kill between the tool's side effect and
the model's next step); while ``SHOP_FAIL_FILE`` exists, step 2 raises. A message with
"receipt" in it sends the same receipt twice (``idempotency="args"``).
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


async def _exists(variable: str) -> bool:
    path = os.environ.get(variable)
    return bool(path) and await asyncio.to_thread(Path(str(path)).exists)


async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = [
        str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)
    ][-1]
    order = int(re.findall(r"\d+", prompt)[-1])
    returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if "receipt" in prompt:  # the same receipt twice, with fresh call ids
        turn = max(i for i, m in enumerate(messages)
                   if any(isinstance(p, UserPromptPart) for p in m.parts))
        sent = sum(1 for m in messages[turn:] for p in m.parts if isinstance(p, ToolReturnPart))
        if sent < 2:
            receipt = {"order": order, "email": "a@example.com"}
            return ModelResponse(parts=[ToolCallPart("send_receipt", receipt)])
        return ModelResponse(parts=[TextPart("Receipt sent.")])
    if not returns:
        return ModelResponse(parts=[ToolCallPart("charge", {"order": order})])
    if await _exists("SHOP_HANG_FILE"):
        print("CHARGED", flush=True)
        while await _exists("SHOP_HANG_FILE"):
            await asyncio.sleep(0.05)
    if await _exists("SHOP_FAIL_FILE"):
        raise RuntimeError("the model is down")
    return ModelResponse(parts=[TextPart(f"Done: {returns[0].content}.")])


agent = define_agent("shop", "Charge the orders the user asks for.",
                     tools=["charge", "send_receipt", "ship", "refund"],
                     model=FunctionModel(script))
