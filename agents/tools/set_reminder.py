"""Demo tool: schedule the ``send_reminder`` effect, which posts the reminder into the thread."""

from pydantic import BaseModel, Field

from runtime import ThreadState, define_tool

MAX_DELAY_SECONDS = 7 * 24 * 3600.0


class SetReminder(BaseModel):
    text: str = Field(min_length=1, max_length=2000, description="What to remind the user of.")
    delay_seconds: float = Field(
        ge=0, le=MAX_DELAY_SECONDS, description="How many seconds from now (at most 7 days)."
    )


async def set_reminder(state: ThreadState, args: SetReminder) -> dict[str, object]:
    run_id = await state.schedule_effect(
        "send_reminder", {"text": args.text}, delay=args.delay_seconds
    )
    return {"scheduled": True, "run_id": run_id, "delay_seconds": args.delay_seconds}


tool = define_tool(
    "Remind the user of something after a delay: the reminder is posted into this thread.",
    SetReminder,
    set_reminder,
)
