"""The pluggable interfaces of the runtime's lowest layer: the clock and its timer.

The storage contract (`runtime.storage.base`: `StorageBackend`, `ThreadStore`,
`RuntimeStore`) and the conversation layer's extension point (`runtime.extension`) are
declared next to the code that uses them; this module holds what every layer may import.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class RunSync(Protocol):
    """Runs a blocking call off the event loop: ``await run_sync(fn, *args)``."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]:
        """What ``fn(*args)`` returns (its exception is raised when awaited)."""
        ...


AlarmCallback = Callable[[str], None]
"""Called on the event loop with the thread id whose alarm went off."""


class AlarmTimer(Protocol):
    """An in-process timer with at most one pending alarm per thread."""

    def start(self) -> None:
        """Begin firing (call on the running event loop)."""

    def arm(self, thread_id: str, due_at: float) -> None:
        """Fire for ``thread_id`` at ``due_at`` (epoch seconds), replacing its earlier alarm."""

    def disarm(self, thread_id: str) -> None:
        """Forget the thread's alarm, if any."""

    def shutdown(self) -> None:
        """Stop firing."""


class Clock(Protocol):
    """Where the runtime reads the time and gets its timer from."""

    def now(self) -> float:
        """Seconds since the Unix epoch (UTC)."""
        ...

    def create_timer(self, callback: AlarmCallback) -> AlarmTimer:
        """A timer that calls ``callback(thread_id)`` when an alarm is due by this clock."""
        ...
