"""Schedules the ``note`` effect; records the execution it ran with."""

from pydantic import BaseModel, Field

from runtime import ThreadState, define_tool

SEEN: list[object] = []


class Args(BaseModel):
    text: str
    delay_seconds: float = Field(ge=0)


async def schedule_note(state: ThreadState, args: Args) -> dict[str, str]:
    SEEN.append(state.execution)
    run_id = await state.schedule_effect("note", {"text": args.text}, delay=args.delay_seconds)
    return {"run_id": run_id}


tool = define_tool("Schedules a note.", Args, schedule_note)
