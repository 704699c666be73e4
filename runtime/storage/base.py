"""The storage contract every backend implements.

Two stores, both synchronous (the runtime calls them from worker threads, never from the
event loop, and never calls one `ThreadStore` from two threads at once):

- `ThreadStore`: one thread's runs. Every method is one transaction: it either commits
  whole or changes nothing.
- `RuntimeStore`: the thread registry and the durable alarm index.
- `StorageBackend`: the factory of both, owning where they live (SQLite: the data
  directory, its files and its lock).

Times are seconds since the Unix epoch (UTC), as floats.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.config import RetentionPolicy
from runtime.effects import EffectRun, EffectStatus
from runtime.messages import Message


@dataclass(frozen=True, slots=True)
class Finish:
    """A run's terminal outcome, to be written."""

    run_id: str
    status: EffectStatus
    error: str | None
    finished_at: float


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A registry entry.

    Attributes:
        id: The thread id.
        created_at_ts: Creation time, seconds since the epoch (UTC).
        agent_id: The agent that serves the thread, if any.
        user_id: The user it belongs to, if any.
        tags: Free-form labels.
    """

    id: str
    created_at_ts: float
    agent_id: str | None = None
    user_id: str | None = None
    tags: tuple[str, ...] = ()


class ThreadStore(ABC):
    """One thread's runs."""

    @abstractmethod
    def insert_run(self, run: EffectRun) -> None:
        """Store a new pending run. Durable when this returns (per ``synchronous``)."""

    @abstractmethod
    def finish_and_claim(
        self, finish: Finish | None, now: float, *, claim: bool = True
    ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
        """Record one outcome and claim the next due run, in one transaction.

        Args:
            finish: The outcome of the run that just ended, or None. Applied only if that
                run is still ``running``.
            now: The current time; runs with ``run_at <= now`` are due.
            claim: Whether to claim the next due run at all.

        Returns:
            ``(finished, claimed, next_due)``: the finished run as written (or None), the
            claimed run (status ``running``, ``attempts`` incremented, ``started_at =
            now``; the earliest due by ``run_at`` then insertion order) or None, and, when
            nothing was claimed, the ``run_at`` of the earliest pending run (or None).
        """

    @abstractmethod
    def recover_interrupted(
        self, now: float, max_attempts: int, run_ids: Sequence[str] | None = None
    ) -> list[EffectRun]:
        """Return interrupted ``running`` runs to ``pending`` (due ``now``), or fail them.

        A run that already started ``max_attempts`` times becomes ``failed`` with an error
        saying it was interrupted that many times.

        Args:
            now: The current time.
            max_attempts: The attempt limit.
            run_ids: Only these runs; None = every ``running`` run (startup recovery).

        Returns:
            The changed runs, as written.
        """

    @abstractmethod
    def cancel(self, run_id: str, now: float) -> EffectRun | None:
        """Cancel a pending run; None when no pending run has that id."""

    @abstractmethod
    def run_now(self, run_id: str, now: float) -> EffectRun | None:
        """Make a pending run due now; None when no pending run has that id."""

    @abstractmethod
    def get_run(self, run_id: str, now: float, retention: RetentionPolicy) -> EffectRun | None:
        """One run with its args, or None (unknown or pruned)."""

    @abstractmethod
    def list_runs(
        self,
        now: float,
        retention: RetentionPolicy,
        *,
        statuses: Sequence[EffectStatus] | None = None,
        name: str | None = None,
        limit: int = 50,
        before_seq: int | None = None,
    ) -> tuple[list[EffectRun], int | None]:
        """Runs newest first (by scheduling order), filtered; pruned runs never appear.

        Returns:
            ``(runs, next_before_seq)``: a page and the cursor for the next page (None at
            the end).
        """

    @abstractmethod
    def count_runs(
        self, now: float, retention: RetentionPolicy, *, name: str | None = None
    ) -> dict[EffectStatus, int]:
        """How many visible (unpruned) runs there are in each status, of one name or all."""

    @abstractmethod
    def pending_runs(self, name: str | None = None) -> list[EffectRun]:
        """Runs that have not started yet, in due order."""

    @abstractmethod
    def prune(self, now: float, retention: RetentionPolicy) -> int:
        """Delete finished runs past retention; returns how many were deleted."""

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None:
        """Set one ``key = value`` entry of the thread's metadata (replacing it)."""

    @abstractmethod
    def insert_messages(self, messages: Sequence[Message]) -> None:
        """Append messages to the conversation, in order, in one transaction."""

    @abstractmethod
    def list_messages(
        self,
        *,
        limit: int = 50,
        after_id: str | None = None,
        before_id: str | None = None,
        latest: bool = False,
    ) -> tuple[list[Message], str | None, str | None] | None:
        """A page of messages, oldest first: ``(messages, next_cursor, prev_cursor)``.

        None when ``after_id`` or ``before_id`` names no message of the thread.
        """

    @abstractmethod
    def get_message(self, message_id: str) -> Message | None:
        """One message, or None."""

    @abstractmethod
    def all_messages(self) -> list[Message]:
        """The whole conversation, oldest first."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (idempotent)."""


class RuntimeStore(ABC):
    """The thread registry and the durable alarm index."""

    @abstractmethod
    def add_thread(self, info: ThreadInfo) -> bool:
        """Register a thread; False if the id is taken."""

    @abstractmethod
    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """The registry entry, or None."""

    @abstractmethod
    def list_threads(
        self, limit: int, after: tuple[float, str] | None
    ) -> tuple[list[ThreadInfo], tuple[float, str] | None]:
        """Threads newest first; returns a page and the cursor for the next one."""

    @abstractmethod
    def delete_thread(self, thread_id: str) -> bool:
        """Remove a thread and its alarm in one transaction; False if it did not exist."""

    @abstractmethod
    def set_alarm(self, thread_id: str, due_at: float | None) -> None:
        """Set the thread's alarm to ``due_at`` (None removes it)."""

    @abstractmethod
    def lower_alarm(self, thread_id: str, due_at: float) -> None:
        """Set the alarm to ``min(current, due_at)``, creating it when missing."""

    @abstractmethod
    def move_alarms(
        self, changes: Sequence[tuple[str, float | None, float | None]]
    ) -> list[tuple[str, float | None]]:
        """Apply ``(thread_id, expected, target)`` alarm moves in one transaction.

        Each move is a compare-and-set: the row goes to ``target`` (None removes it) only
        if it still holds ``expected``; with ``expected`` None the row is only ever
        created or lowered. Returns the moves applied, as ``(thread_id, target)``.
        """

    @abstractmethod
    def load_alarms(self) -> list[tuple[str, float]]:
        """Every alarm as ``(thread_id, due_at)``."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (idempotent)."""


class StorageBackend(ABC):
    """Where a runtime keeps its registry, alarms and every thread's store (a factory)."""

    @abstractmethod
    def open(self) -> RuntimeStore:
        """Take exclusive use of the backend, create what is missing, migrate.

        Returns:
            The runtime store (registry + alarms).

        Raises:
            DataDirLocked: another process holds the backend (SQLite: the data-dir lock).
            RuntimeStorageError: the runtime database is unusable or corrupt, or missing or
                empty while thread stores exist.
        """

    @abstractmethod
    def create_thread_store(self, info: ThreadInfo) -> ThreadStore:
        """A new, empty store for a thread, with its meta written.

        Leftovers of a crashed create or delete of the same id are discarded first.

        Raises:
            ThreadStorageError: the store cannot be made (nothing of it is left behind).
        """

    @abstractmethod
    def open_thread_store(self, thread_id: str) -> ThreadStore:
        """The existing store of a registered thread.

        Raises:
            ThreadStorageError: it is missing, empty, corrupt or of a newer schema.
        """

    @abstractmethod
    def remove_thread_store(self, thread_id: str) -> None:
        """Delete everything the thread holds here (its files); idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Release what `open` took (the lock). Idempotent."""
