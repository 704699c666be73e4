"""Demo: an effect that always fails, so the pane shows a failed run and its error."""

from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Failure(BaseModel):
    reason: str = Field(default="this effect fails on purpose", max_length=2000)


class DemoFailure(Exception):
    pass


async def fail_on_purpose(state: ThreadState, args: Failure) -> None:
    raise DemoFailure(args.reason)


effect = define_effect(
    "Always fails with the given reason (to see a failed run).", Failure, fail_on_purpose
)
