"""A sync effect that appends to <data_dir>/notes.log (sync: runs in a worker thread)."""

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Note(BaseModel):
    text: str


def note(state: ThreadState, args: Note) -> None:
    with open(state.runtime.settings.data_dir / "notes.log", "a") as f:
        f.write(f"{state.thread_id} {args.text}\n")


effect = define_effect("Appends a note (sync).", Note, note)
