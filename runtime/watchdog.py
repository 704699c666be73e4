"""The loop watchdog: warns when something blocks the event loop, and names it.

Python cannot preempt code that blocks the loop (``time.sleep``, blocking I/O or a long
computation in an async effect): every thread, request and stream then waits. The runtime
can see it, though. The loop beats every `BEAT_SECONDS` (a timer callback noting the
time); a daemon thread looks at the last beat as often. When the beat is older than the
threshold, the thread notes which task the loop is running (for an effect: the effect,
its thread and its run; for a tool: the tool, its thread and its turn's run id, noted by
`running_tool`); when the loop is back, its next beat logs ONE warning per stall
with that name and how long the loop was held. The cost is one timer callback per beat,
nothing per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["BEAT_SECONDS", "LoopWatchdog", "describe_tool", "running_tool"]

log = logging.getLogger("runtime")

BEAT_SECONDS = 0.1
"""How often the loop beats and the watchdog thread looks (at most a quarter of the
threshold)."""


_tools: dict[asyncio.Task[object], tuple[str, str, str]] = {}
"""The tool each task runs now: ``task -> (tool, thread, turn run id)``."""


@contextlib.contextmanager
def running_tool(tool_name: str, thread_id: str, run_id: str) -> Iterator[None]:
    """Note that the current task runs a tool of a turn, so a stall it causes names it.

    Args:
        tool_name: The tool.
        thread_id: The thread whose turn calls it.
        run_id: The turn's run id.
    """
    try:
        task: asyncio.Task[object] | None = asyncio.current_task()
    except RuntimeError:  # no running loop
        task = None
    if task is None:
        yield
        return
    before = _tools.get(task)
    _tools[task] = (tool_name, thread_id, run_id)
    try:
        yield
    finally:
        if before is None:
            _tools.pop(task, None)
        else:
            _tools[task] = before


def describe_tool(task: asyncio.Task[object]) -> str | None:
    """``"tool t (thread x, turn run r)"`` when ``task`` runs a tool now, else None."""
    entry = _tools.get(task)
    if entry is None:
        return None
    tool_name, thread_id, run_id = entry
    return f"tool {tool_name} (thread {thread_id}, turn run {run_id})"


_EFFECT_ADVICE = ("Never block in an async effect (time.sleep, blocking I/O, long "
                  "computations): await instead, or make it a sync effect (it runs in a "
                  "worker thread)")
_TOOL_ADVICE = ("Never block in an async tool (time.sleep, blocking I/O, long computations): "
                "await instead (asyncio.sleep, an async client), or define the tool's "
                "function with plain def (a sync tool runs in a worker thread)")


class LoopWatchdog:
    """Warns once per event-loop stall longer than ``threshold_seconds``, naming the holder.

    Args:
        threshold_seconds: A loop that has not beaten for this long is stalled (seconds, > 0).
        describe: What a task is, for the warning: ``"effect f (thread t, run r)"`` for an
            effect's task; called from the watchdog thread with the task the loop was
            running when the stall was seen (None: a plain callback, not a task).
    """

    def __init__(
        self,
        threshold_seconds: float,
        describe: Callable[[asyncio.Task[object] | None], str],
    ) -> None:
        if not threshold_seconds > 0:
            raise ValueError(f"threshold_seconds must be > 0, got {threshold_seconds!r}")
        self.threshold_seconds = threshold_seconds
        self._describe = describe
        self._beat_seconds = min(BEAT_SECONDS, threshold_seconds / 4)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_beat = 0.0
        self._holder: str | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start beating on the running loop and watching from a daemon thread."""
        self._loop = asyncio.get_running_loop()
        self._last_beat = time.monotonic()
        self._handle = self._loop.call_later(self._beat_seconds, self._beat)
        self._stop = threading.Event()  # a new one: a stopped thread may still be looking
        self._thread = threading.Thread(
            target=self._watch, args=(self._stop,), name="thread-effects-loop-watchdog",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and watching (idempotent; never blocks the loop).

        The thread is not joined: it ends at its next look, within a beat.
        """
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop.set()
        self._thread = None

    def _beat(self) -> None:
        now = time.monotonic()
        stalled = now - self._last_beat - self._beat_seconds
        holder, self._holder = self._holder, None
        self._last_beat = now
        # A holder noted just as a shorter stall ended is dropped with it.
        if holder is not None and stalled >= self.threshold_seconds / 2:
            advice = _TOOL_ADVICE if holder.startswith("tool ") else _EFFECT_ADVICE
            log.warning(
                "The event loop was blocked for %.1f s by %s: nothing else ran meanwhile. %s",
                stalled, holder, advice,
            )
        assert self._loop is not None
        self._handle = self._loop.call_later(self._beat_seconds, self._beat)

    def _watch(self, stop: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        while not stop.wait(self._beat_seconds):
            if self._holder is not None:
                continue  # this stall is already named; the loop's next beat reports it
            if time.monotonic() - self._last_beat > self.threshold_seconds:
                try:
                    task = asyncio.current_task(loop)
                    self._holder = self._describe(task)
                except Exception:  # never let the watchdog die of a description
                    self._holder = "an unknown task"
