"""Completes at once; its args have a schema (for 413/422 tests)."""

from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Note(BaseModel):
    text: str = Field(max_length=100)


async def note(state: ThreadState, args: Note) -> None:
    return None


effect = define_effect("Takes a note (does nothing else).", Note, note)
