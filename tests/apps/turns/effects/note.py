"""Injects ``note: <text>`` into the thread; records the execution it ran with."""

from pydantic import BaseModel

from runtime import ThreadState, define_effect

SEEN: list[object] = []


class Note(BaseModel):
    text: str


async def note(state: ThreadState, args: Note) -> None:
    SEEN.append(state.execution)
    await state.inject_message(f"note: {args.text}")


effect = define_effect("Posts a note into the thread.", Note, note)
