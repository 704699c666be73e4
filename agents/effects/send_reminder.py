"""Demo: append a reminder to the thread's reminder file (a sync effect: runs in a worker thread).

The file is ``<data_dir>/reminders/<thread_id>.txt``, one line per reminder. The reminder is
also posted into the thread's conversation (``state.inject_message``, an async method, is
called from this worker thread through ``anyio.from_thread.run``).
"""

from datetime import UTC, datetime

import anyio.from_thread
from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Reminder(BaseModel):
    text: str = Field(min_length=1, max_length=2000, description="What to remind of.")


def send_reminder(state: ThreadState, args: Reminder) -> None:
    folder = state.runtime.settings.data_dir / "reminders"
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    with open(folder / f"{state.thread_id}.txt", "a", encoding="utf-8") as f:
        f.write(f"{now}  {args.text}\n")
    anyio.from_thread.run(state.inject_message, f"⏰ Reminder: {args.text}")


effect = define_effect(
    "Posts a reminder into the thread and appends it to data/reminders/<thread>.txt.",
    Reminder,
    send_reminder,
)
