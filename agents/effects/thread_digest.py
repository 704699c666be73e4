"""Demo: an effect without arguments that summarizes the thread's runs into a digest file.

Appends one line to ``<data_dir>/digests/<thread_id>.txt`` with the run counts by status.
"""

from collections import Counter
from datetime import UTC, datetime

import anyio

from runtime import ThreadState, define_effect


async def thread_digest(state: ThreadState) -> None:
    counts: Counter[str] = Counter()
    cursor = None
    while True:
        page = await state.list_runs(limit=500, cursor=cursor)
        # A thread runs one run at a time: the running digest is this run, not counted.
        counts.update(
            str(run.status)
            for run in page.runs
            if not (run.status == "running" and run.name == "thread_digest")
        )
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    folder = anyio.Path(state.runtime.settings.data_dir) / "digests"
    await folder.mkdir(parents=True, exist_ok=True)
    async with await (folder / f"{state.thread_id}.txt").open("a", encoding="utf-8") as f:
        await f.write(f"{now}  {summary}\n")


effect = define_effect(
    "Writes the thread's run counts to data/digests/<thread>.txt.", thread_digest
)
