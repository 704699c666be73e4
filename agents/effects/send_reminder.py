"""Demo: post a reminder into the thread, and log it to ``<data_dir>/reminders/<thread_id>.txt``.

Scheduled by the ``set_reminder`` tool (or by hand from the pane or the API). Like every
effect it may run a second time after a crash, so a reminder can then arrive twice.
"""

from datetime import UTC, datetime
from pathlib import Path

import anyio.to_thread
from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Reminder(BaseModel):
    text: str = Field(min_length=1, max_length=2000, description="What to remind of.")


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


async def send_reminder(state: ThreadState, args: Reminder) -> None:
    await state.inject_message(f"Reminder: {args.text}")
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    path = state.runtime.settings.data_dir / "reminders" / f"{state.thread_id}.txt"
    await anyio.to_thread.run_sync(_append, path, f"{now}  {args.text}")


effect = define_effect(
    "Posts a reminder into the thread (and logs it to data/reminders/<thread>.txt).",
    Reminder,
    send_reminder,
)
