"""Appends a note carrying ``effect_marker(key)`` to the world file (``NOTES_WORLD``).

One note per topic and thread (the key is the topic, a stable name the user gave). With
``NOTES_HANG_FILE`` naming an existing file, the call prints ``APPLIED`` and hangs after the
note is written and before it is recorded (a crash test kills the process there).
"""

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from runtime import define_effect_tool, effect_marker, find_effect_markers


class Note(BaseModel):
    topic: str
    text: str


def key_of(args: Note, execution) -> str:
    return f"note:{args.topic}"


def _world() -> Path:
    return Path(os.environ["NOTES_WORLD"])


def find_note(key: str, args: Note):
    world = _world()
    lines = world.read_text().splitlines() if world.exists() else []
    for number, line in enumerate(lines, 1):
        if key in find_effect_markers(line):
            return {"note": number, "reconciled": True}
    return None


async def post_note(state, args: Note) -> dict:
    key = key_of(args, state.execution)

    def append() -> int:
        with _world().open("a") as f:
            f.write(f"{args.text} {effect_marker(key)}\n")
        return len(_world().read_text().splitlines())

    number = await asyncio.to_thread(append)
    hang = os.environ.get("NOTES_HANG_FILE")
    if hang and await asyncio.to_thread(Path(hang).exists):
        print("APPLIED", flush=True)
        await asyncio.Event().wait()
    await asyncio.sleep(0)
    return {"note": number, "reconciled": False}


tool = define_effect_tool("Posts a note on a topic.", Note, post_note, effect_key=key_of,
                          already_applied=find_note)
