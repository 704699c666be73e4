"""Appends one JSON line per run to <data_dir>/record.jsonl: what tests count and order."""

import json
import time

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Record(BaseModel):
    key: str
    due: float | None = None


async def record(state: ThreadState, args: Record) -> None:
    line = {"thread": state.thread_id, "key": args.key, "at": time.time(),
            "execution": state.execution is not None}
    with open(state.runtime.settings.data_dir / "record.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


effect = define_effect("Records that it ran.", Record, record)
