"""The storage contract every backend implements.

Three parts, all synchronous (the runtime calls them from its storage thread pool, never
from the event loop, and never calls one `ThreadStore` from two threads at once):

- `StorageBackend`: the factory. It owns where data lives (paths, files, the data-dir
  lock of the SQLite backend) and opens the two stores below.
- `ThreadStore`: one thread's runs, conversation, effect-tool records and meta. Every
  method is one transaction: it either commits whole or changes nothing.
- `RuntimeStore`: the thread registry and the durable alarm index.

Backends: `runtime.storage.sqlite.SQLiteBackend` (one file per thread, the default),
`runtime.storage.memory.MemoryBackend` (the reference implementation, for tests) and
`runtime.storage.postgres.PostgresBackend` (one PostgreSQL database for every thread). All
pass the contract suite in ``tests/storage/``.

Times are seconds since the Unix epoch (UTC), as floats.

Ordering rules every backend keeps:

- A thread's runs have a scheduling order: the order of `ThreadStore.insert_run` calls
  (SQLite: the ``seq`` column). `ThreadStore.list_runs` pages newest first by it, and its
  cursor (``before_seq``) is a position in it.
- Due order: the earliest ``run_at`` first, ties broken by scheduling order.
- Messages keep the order of `ThreadStore.insert_messages` calls (and of each batch).
- Threads list newest first by ``created_at``, ties broken by id (descending).

Effect records (`runtime.storage.records`) of a thread live in its store, scoped to it:
the ``*_effect_record(s)`` methods keep the `EffectRecordStore` contract for that thread
(the runtime's async `runtime.effect_records.EffectRecords` calls them). Records past
``RetentionPolicy.effect_records_seconds`` are deleted on the write path (a claim, at most
once a minute, and `ThreadStore.prune`) and with the thread's store.

Retention: a finished run past `RetentionPolicy` (past its age, or older than the
``max_finished`` most recent unexpired ones) is never returned by a read, even before it
is deleted. Reads never write: deletion happens on the write path (the transactions that
finish runs, see `ThreadStore.finish_and_claim`) and in `ThreadStore.prune`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config import RetentionPolicy
from runtime.effects import EffectRun, EffectStatus, RunAttempt
from runtime.messages import Message
from runtime.recurrence import Schedule, ScheduleState
from runtime.storage.records import Claim, EffectRecord, EffectRecordPage, EffectRecordStatus


@dataclass(frozen=True, slots=True)
class Finish:
    """A run's terminal outcome, to be written."""

    run_id: str
    status: EffectStatus
    error: str | None
    finished_at: float
    canceled_by: str | None = None
    """Who canceled the run (status ``canceled`` only), or None."""
    attempt: int | None = None
    """The attempt that ended (the claimed run's ``attempts``): the outcome is written only
    while the run is still ``running`` in that attempt (fencing: a run re-queued and
    claimed again meanwhile, by another node, is not overwritten). None: any attempt."""


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A registry entry.

    Attributes:
        id: The thread id.
        created_at_ts: Creation time, seconds since the epoch (UTC).
        agent_id: The agent that serves the thread, if any.
        user_id: The user it belongs to, if any.
        tags: Free-form labels.
        paused: Whether the thread is paused (it runs nothing until resumed).
        last_activity_ts: When the thread last did something, seconds since the epoch
            (UTC): the latest of its creation, its runs' transitions (scheduled, started,
            finished, canceled: a run's latest time) and its messages, as the registry
            knows it (written with the run index, at most a flush interval late). None
            for an entry not read from a store. Not compared: two reads of one entry are
            equal however active the thread was between them.
    """

    id: str
    created_at_ts: float
    agent_id: str | None = None
    user_id: str | None = None
    tags: tuple[str, ...] = ()
    paused: bool = False
    last_activity_ts: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ThreadQuery:
    """Which threads a listing returns (every field given must match), and its order.

    Attributes:
        user_id: The thread's ``user_id``.
        agent_id: The thread's ``agent_id``.
        tag: One of the thread's tags.
        by_activity: Order by last activity (``last_activity_ts``), newest first, ties by
            id descending; the cursor is then ``(last_activity_ts, id)``. Otherwise by
            creation, as without a query.
    """

    user_id: str | None = None
    agent_id: str | None = None
    tag: str | None = None
    by_activity: bool = False


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs a cross-thread listing returns: every field given must match.

    Attributes:
        statuses: Any of these statuses.
        name: The effect name.
        thread_id: The thread.
        user_id: The thread's ``user_id``.
        tag: One of the thread's tags.
        since: Due (``run_at``) at or after this time, seconds since the epoch (UTC).
        until: Due before this time.
        replayed: True: only runs that a run of the index replays (``replay_of``);
            False: only runs that none replays yet; None: either.
    """

    statuses: tuple[EffectStatus, ...] | None = None
    name: str | None = None
    thread_id: str | None = None
    user_id: str | None = None
    tag: str | None = None
    since: float | None = None
    until: float | None = None
    replayed: bool | None = None


class ThreadStore(ABC):
    """One thread's runs, its conversation (messages) and its meta.

    Every method is one transaction (all or nothing). Methods raise
    `runtime.errors.ThreadStorageError` (naming the thread) when the storage fails or the
    store is closed; no other storage exception leaves a store.

    Attributes:
        claim_blocked: Why the last `finish_and_claim` of this store claimed nothing
            although it may have had a due run, on a backend shared by several processes:
            ``"paused"`` (the thread is paused in the store: another process paused it),
            ``"busy"`` (another node runs one of its runs now), ``"foreign"`` (its next
            due run is of an effect this node lacks and another live node runs: that
            node claims it; `StorageBackend.record_effects`), or None. Always None on
            SQLite and memory (one process: the runtime's own state says both).
        frame_seq: The frame number (``seq``) the last `insert_run` or `fire_schedule` of
            this store took, in the transaction that stored the new run, for that run's
            ``scheduled`` frame, on a backend whose frames are numbered in the database
            (PostgreSQL: the thread's ``frame_counters`` row); None when it stored no run.
            The caller reads it right after the call, before another call on the store,
            and publishes the frame with that ``seq`` (docs/scale-out.md, "Frames across
            nodes"). Always None on SQLite and memory (the change hub numbers frames).
        group_commit: Whether ``finish_and_claim(..., durable=False)`` may commit without
            waiting for the disk, leaving the outcome to a later `sync` (SQLite with
            ``synchronous=FULL``). False: every commit is as durable as the backend makes
            it (memory; PostgreSQL), ``durable`` is ignored and `sync` does nothing.
    """

    claim_blocked: str | None = None
    frame_seq: int | None = None
    group_commit: bool = False

    @abstractmethod
    def insert_run(
        self, run: EffectRun, *, hand_off_from: str | None = None, replay_once: bool = False
    ) -> EffectRun | None:
        """Store a new pending run, last in scheduling order, unless its key is taken.

        Durable when this returns (SQLite: per ``synchronous``). ``attempts``,
        ``started_at``, ``finished_at`` and ``canceled_by`` of the given run are ignored
        (0, None, None, None). Its ``trace_context`` is kept, in the same transaction, while
        the run is unfinished: the claim and `get_run` return it; the transaction that
        finishes or cancels the run (or fails it in `recover_interrupted`) forgets it, and a
        finished run's is None. Other reads may leave it None.

        When ``run.key`` is set and a ``pending`` or ``running`` run of the store has that
        key, nothing is written and that run is returned (a pending one first), checked
        and written in one transaction. One exception, the hand-off of a chain: the
        ``running`` run whose id is ``hand_off_from`` does not hold the key against a new
        run (so a run can schedule its own successor under its key), but a pending run
        with the key still does. So a key has at most one pending run, and a new run only
        when no other live run has the key. A key is free again once its runs finished.

        Args:
            run: The run to store.
            hand_off_from: The id of the running run that schedules this one, or None.
            replay_once: With ``run.replay_of`` set: nothing is stored when a run of the
                store already replays that run (the earliest such run is returned),
                checked and written in one transaction that also serializes it with other
                processes' replays of that run (bulk replay "once", across nodes).

        Returns:
            None when the run was stored; the live run holding its key (or, with
            ``replay_once``, the run already replaying ``run.replay_of``) otherwise.

        Raises:
            ThreadStorageError: the write failed, or a run with that id exists (nothing
                is written).
            ThreadNotFound: on a backend shared by several processes, the thread is no
                longer registered (another process deleted it; this one may not have
                heard yet): nothing is written. Never on SQLite and memory (one process).
        """

    @abstractmethod
    def finish_and_claim(
        self,
        finish: Finish | None,
        now: float,
        *,
        claim: bool = True,
        retention: RetentionPolicy | None = None,
        only_names: Collection[str] | None = None,
        durable: bool = True,
    ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
        """Record one outcome and claim the next due run, in one transaction.

        With ``retention`` and a finish, the same transaction deletes finished runs past
        retention, in bounded work: a backend may delete runs past their age at most once
        a minute, and the oldest runs over ``max_finished`` once they are more than a
        tenth of the limit over it (SQLite does; the memory backend deletes at once).
        Reads hide both meanwhile, so what a caller sees is the same. With neither a
        finish nor a due run, nothing is written.

        Args:
            finish: The outcome of the run that just ended, or None (its status
                ``completed``, ``failed`` or ``canceled``, with ``canceled_by``). Applied
                only if that run is still ``running`` (a deleted run stays gone), in the
                attempt ``finish.attempt`` names (if it names one).
            now: The current time; runs with ``run_at <= now`` are due.
            claim: Whether to claim the next due run at all.
            retention: The policy to prune by; None prunes nothing.
            only_names: Claim only runs of these effect names (the runs that may start
                beside a running one), and ``next_due`` counts only them; None: any.
            durable: False lets a `group_commit` store commit without waiting for the
                disk when the call claims a run: the transaction survives a process
                crash, and a power cut may lose it with everything committed after it,
                until the store syncs (`sync`, a durable call, a read). Every read of
                this store syncs first, so nothing it returns is undone by a power cut; a
                caller that shows the outcome elsewhere (a frame) syncs first. A call
                with a finish that is durable, or that claims nothing, returns with every
                commit of this store so far durable (a call without a finish leaves them
                as they were). Ignored where `group_commit` is False.

        Returns:
            ``(finished, claimed, next_due)``: the finished run as written (or None), the
            claimed run (status ``running``, ``attempts`` incremented, ``started_at =
            now``, its ``trace_context`` as inserted; the earliest due by ``run_at``, ties
            by scheduling order) or None, and,
            when nothing was claimed (and ``claim``), the earlier of the ``run_at`` of
            the earliest pending run and (unless ``only_names``) the ``next_fire_at`` of
            the earliest active schedule (or None: the thread has nothing to wake for).

        A backend shared by several processes also claims nothing while the thread is
        paused in the store, or while another node runs one of its runs (one node runs
        a thread at a time); it then says why in `claim_blocked`, and ``next_due`` is None.

        Raises:
            ThreadStorageError: the transaction failed; nothing was written.
        """

    def sync(self) -> None:
        """Make every transaction this store committed so far durable (blocking).

        After a ``finish_and_claim(..., durable=False)`` on a `group_commit` store: one
        disk flush for all of them, none when nothing is waiting for one (a later durable
        commit or a read already synced them). Does nothing where `group_commit` is
        False. Other calls of the store go on while it waits for the disk (a claim, an
        outcome on the caller's thread); what they commit meanwhile waits for the next
        flush.

        Raises:
            ThreadStorageError: the flush failed (or the store is closed with
                transactions still to sync); they may be lost to a power cut, not to a
                process crash.
        """
        return None

    def finish_inline(
        self, finish: Finish, now: float, *, retention: RetentionPolicy | None = None
    ) -> tuple[EffectRun | None, EffectRun | None, float | None] | None:
        """Record an outcome and claim the next due run here, without waiting for the disk.

        For a `group_commit` store, on the caller's thread (the event loop) when that is
        cheap right now (no lock held by another thread): what
        ``finish_and_claim(finish, now, retention=retention, durable=False)`` does, except
        that it never flushes, not even when it claims nothing; the caller calls `sync`
        (off the loop) before anything of it is shown.

        Returns:
            None (not cheap now, or not a `group_commit` store: nothing was done), or
            what ``finish_and_claim`` returns.

        Raises:
            ThreadStorageError: the transaction failed; nothing was written.
        """
        return None

    def claim_inline(
        self, now: float
    ) -> tuple[EffectRun | None, EffectRun | None, float | None] | None:
        """Claim the next due run here, on the caller's thread, if that is cheap right now.

        The event loop calls this before sending `finish_and_claim` (``finish=None``) to a
        storage thread, to save the hand-off there and back when the claim needs no disk
        wait. A backend answers only if it can without blocking (no lock held by another
        thread, no network round trip, no fsync); otherwise it returns None at once and
        the caller makes the usual call.

        Returns:
            None (not cheap now: nothing was done), or exactly what
            ``finish_and_claim(None, now)`` would have returned.

        Raises:
            ThreadStorageError: the transaction failed; nothing was written.
        """
        return None

    # ------------------------------------------------------ recurring schedules
    # A schedule (`runtime.recurrence.Schedule`) is stored with its fire state; the
    # runtime computes fire times and `fire_schedule` records one fire in one transaction
    # (its occurrence run, or the skip, and the next fire time together), so a crash
    # never loses nor doubles an occurrence.

    @abstractmethod
    def insert_schedule(self, schedule: Schedule) -> Schedule | None:
        """Store a new schedule, unless another schedule of the store has its key.

        ``occurrences``, ``skipped``, ``last_run_id`` and ``last_fire_at`` of the given
        schedule are ignored (0, 0, None, None). Checked and written in one transaction.

        Returns:
            None when it was stored; the schedule holding its key otherwise (nothing is
            written). A key is free again once its schedule is deleted.

        Raises:
            ThreadStorageError: the write failed, or a schedule with that id exists.
        """

    @abstractmethod
    def get_schedule(self, schedule_id: str) -> Schedule | None:
        """One schedule with its args, or None (unknown or deleted). A read.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def list_schedules(self) -> list[Schedule]:
        """Every schedule of the store, oldest first (by creation order), with args. A read.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def set_schedule_state(
        self, schedule_id: str, state: ScheduleState, next_fire_at: float | None
    ) -> Schedule | None:
        """Pause or resume a schedule: set its state and its next fire time.

        Returns:
            The schedule as written; None for an unknown id (nothing changes).

        Raises:
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def delete_schedule(self, schedule_id: str) -> Schedule | None:
        """Delete a schedule (its key is free again); its runs stay, with their ``schedule_id``.

        Returns:
            The schedule as it was; None for an unknown id.

        Raises:
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def due_schedules(self, now: float) -> list[Schedule]:
        """The active schedules with ``next_fire_at <= now``, earliest first (ties: creation).

        A read. A backend may answer from what it knows of its own writes without a query.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def next_schedule_fire(self) -> float | None:
        """The earliest ``next_fire_at`` of the active schedules (None: none). A read.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def fire_schedule(
        self,
        schedule_id: str,
        fire_at: float,
        run: EffectRun | None,
        skipped: int,
        last_fire_at: float,
        next_fire_at: float | None,
    ) -> tuple[Schedule | None, EffectRun | None]:
        """Record what the due fire times of a schedule made, in one transaction.

        Only if the schedule exists, is ``active`` and its ``next_fire_at`` is still
        ``fire_at`` (else nothing is written: those fire times were recorded already, or
        the schedule was paused or deleted). Then ``run`` (if given) is stored as
        `insert_run` would (pending, last in scheduling order, its ``schedule_id`` kept;
        its key is not checked) with ``occurrences + 1`` and ``last_run_id = run.id``;
        ``skipped`` is added to the schedule's count; ``last_fire_at`` and
        ``next_fire_at`` are set to the values given.

        Returns:
            ``(schedule, stored_run)``: the schedule as written (as it is when nothing
            was written; None if it does not exist) and ``run`` as stored, or None when
            no run was given or nothing was written.

        Raises:
            ThreadStorageError: the transaction failed; nothing was written.
        """

    @abstractmethod
    def run_attempts(self, run_id: str) -> list[RunAttempt]:
        """The attempts of a run, first first (empty for an unknown or pruned run).

        The claim in `finish_and_claim` adds one (outcome ``running``); recording the
        outcome ends it (``completed`` or ``failed`` with the error), and
        `recover_interrupted` ends it ``interrupted``, each in the same transaction.
        Deleting a run deletes its attempts.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def recover_interrupted(
        self,
        now: float,
        max_attempts: int,
        run_ids: Sequence[str] | None = None,
        *,
        retention: RetentionPolicy | None = None,
        dead_nodes_only: bool = False,
        reason: str | None = None,
    ) -> list[EffectRun]:
        """Return interrupted ``running`` runs to ``pending`` (due ``now``), or fail them.

        A run that already started ``max_attempts`` times becomes ``failed`` (``finished_at
        = now``) with an error saying it was interrupted that many times; any other goes
        back to ``pending`` with ``run_at = min(run_at, now)`` and its ``attempts`` kept.
        One transaction for all of them. With ``retention``, prunes as `finish_and_claim`
        does (a thread is opened with this call, so its expired runs go then).

        Args:
            now: The current time.
            max_attempts: The attempt limit.
            run_ids: Only these runs (those not ``running`` are left alone); None = every
                ``running`` run (recovery when a thread is opened or the runtime stops).
            retention: The policy to prune by; None prunes nothing.
            dead_nodes_only: Only runs of other nodes whose lease expired (the runs
                `StorageBackend.orphaned_runs` names), never this node's own. Ignored by
                a backend of one process (SQLite, memory).
            reason: What interrupted the attempts, in words that follow "interrupted"
                (``"its node's lease expired; node b re-queued it"``): stored as each ended
                attempt's ``error`` (`RunAttempt.error`, outcome ``interrupted``) and
                named in the error of a run failed at the limit. None: nothing stored
                (a restart or shutdown, as readers assume).

        On a backend shared by several processes (PostgreSQL), a run another node runs
        under a live lease is never touched; this node's own runs are (the thread is being
        opened, or the runtime stops: a run of its node id was left by an earlier process
        with that id), unless ``dead_nodes_only``.

        Returns:
            The changed runs, as written, in scheduling order.

        Raises:
            ThreadStorageError: the transaction failed; nothing was written.
        """

    @abstractmethod
    def cancel(
        self,
        run_id: str,
        now: float,
        *,
        retention: RetentionPolicy | None = None,
        canceled_by: str | None = None,
    ) -> EffectRun | None:
        """Cancel a pending run (``finished_at = now``), pruning as `finish_and_claim` does.

        ``canceled_by`` is stored with it (who canceled it). A running run is canceled
        through `finish_and_claim` with a ``canceled`` `Finish` instead.

        Returns:
            The canceled run as written; None when no pending run has that id (unknown,
            running or finished: nothing changes).

        Raises:
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def run_now(self, run_id: str, now: float) -> EffectRun | None:
        """Make a pending run due now (``run_at = min(run_at, now)``).

        Returns:
            The run as written; None when no pending run has that id.

        Raises:
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def get_run(self, run_id: str, now: float, retention: RetentionPolicy) -> EffectRun | None:
        """One run with its args, or None (unknown, or past retention at ``now``, by age or count).

        A read: it never writes (nor prunes). An unfinished run carries its
        ``trace_context`` (see `insert_run`).

        Raises:
            ThreadStorageError: the read failed.
        """

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
        """Runs newest first (by scheduling order), filtered; runs past retention never appear.

        A read: it never writes (nor prunes).

        Args:
            now: The current time (for retention).
            retention: The policy whose age limits hide finished runs.
            statuses: Only runs in these statuses (None or empty: all).
            name: Only runs of this effect.
            limit: The page size (at least 1).
            before_seq: The cursor of the previous page: only runs scheduled before it.

        Returns:
            ``(runs, next_before_seq)``: a page and the cursor for the next page (None
            when no run follows the page). A cursor stays valid when runs are added or
            deleted meanwhile: the next page starts right after the last run shown.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def count_runs(
        self, now: float, retention: RetentionPolicy, *, name: str | None = None
    ) -> dict[EffectStatus, int]:
        """How many visible runs there are in each status (every status a key), of one name or all.

        A read: it never writes.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def pending_runs(self, name: str | None = None) -> list[EffectRun]:
        """Runs that have not started yet, in due order (``run_at``, then scheduling order).

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def prune(self, now: float, retention: RetentionPolicy) -> int:
        """Delete every finished run past retention, in one transaction.

        Past retention: completed or canceled with ``finished_at`` older than
        ``completed_seconds``, failed older than ``failed_seconds``, and then the oldest
        finished runs (by ``finished_at``, ties by scheduling order) beyond
        ``max_finished``. Pending and running runs are never deleted. Effect records
        past ``effect_records_seconds`` go too (see `begin_effect_record`).

        Returns:
            How many runs were deleted (records not counted).

        Raises:
            ThreadStorageError: the write failed; nothing was deleted.
        """

    @abstractmethod
    def set_meta(self, key: str, value: str, *, fence: str | None = None) -> None:
        """Write one key of the thread's meta (insert or replace).

        Args:
            key: The meta key.
            value: Its value.
            fence: The token of the turn lease the writing turn holds
                (`StorageBackend.take_turn_lease`), or None (no turn's write). A backend
                shared by several processes writes only while that token still holds the
                thread's turn lease, checked in the write's transaction with the lease
                row locked until it commits; one process per backend ignores it (the
                runtime serializes a thread's turns itself).

        Raises:
            TurnLeaseLost: ``fence`` no longer holds the turn lease (nothing written).
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def get_meta(self, key: str) -> str | None:
        """One key of the thread's meta, or None.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def insert_messages(
        self, messages: Sequence[Message], *, fence: str | None = None
    ) -> None:
        """Append messages to the conversation, in order, in one transaction.

        ``fence``: the writing turn's turn-lease token, checked as in `set_meta`.

        Raises:
            TurnLeaseLost: ``fence`` no longer holds the turn lease (nothing written).
            ThreadStorageError: the write failed, or a message id exists already (nothing
                of the batch is written).
        """

    @abstractmethod
    def list_messages(
        self,
        *,
        limit: int = 50,
        after_id: str | None = None,
        before_id: str | None = None,
        latest: bool = False,
    ) -> tuple[list[Message], str | None, str | None] | None:
        """A page of messages, oldest first.

        The page holds the ``limit`` messages right after ``after_id`` (from the start when
        it is None), or right before ``before_id``, or with ``latest`` the newest ``limit``
        messages. The caller gives at most one of the three.

        Returns:
            ``(messages, next_cursor, prev_cursor)``: ``next_cursor`` is the id of the
            page's last message when newer messages follow it, ``prev_cursor`` the id of
            its first message when older ones precede it (else None). None when
            ``after_id`` or ``before_id`` names no message.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def get_message(self, message_id: str) -> Message | None:
        """One message, or None.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def all_messages(self) -> list[Message]:
        """The whole conversation, oldest first (what a turn rebuilds its history from).

        Raises:
            ThreadStorageError: the read failed.
        """

    # ----------------------------------------------------------- effect records

    @abstractmethod
    def get_effect_record(self, key: str) -> EffectRecord | None:
        """The key's record in this thread, in progress or applied; None when there is none.

        A read: it never writes.

        Raises:
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def begin_effect_record(
        self,
        key: str,
        *,
        tool_name: str,
        run_id: str | None,
        owner: str,
        lease_seconds: float,
        now: float,
        retention: RetentionPolicy | None = None,
    ) -> Claim:
        """Claim a key for applying its effect, as `EffectRecordStore.begin`, at ``now``.

        With no record: a new in-progress record held by ``owner`` until ``now +
        lease_seconds`` (``claimed``). An in-progress record whose lease expired goes to
        ``owner`` (``claimed`` and ``took_over``). An applied record or a live lease:
        nothing changes. Of concurrent callers on one key exactly one gets ``claimed``.
        With ``retention``, the same transaction may delete records last changed more than
        ``effect_records_seconds`` before ``now`` (at most once a minute; an in-progress
        one only once its lease expired that long ago too).

        Raises:
            ValueError: ``lease_seconds`` is not positive and finite (nothing written).
            ThreadStorageError: the write failed; nothing was written.
        """

    @abstractmethod
    def complete_effect_record(
        self, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        """Record the result ``owner`` applied (the record becomes applied, lease cleared).

        Raises:
            EffectRecordLost: ``owner`` does not hold the key's in-progress record.
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def renew_effect_record(self, key: str, *, owner: str, lease_seconds: float,
                            now: float) -> bool:
        """Extend ``owner``'s in-progress lease to ``now + lease_seconds`` (a heartbeat).

        Returns:
            True if ``owner`` holds the record (renewed); False otherwise (nothing changes).

        Raises:
            ValueError: ``lease_seconds`` is not positive and finite.
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def release_effect_record(self, key: str, *, owner: str) -> EffectRecord | None:
        """Drop ``owner``'s in-progress record (its execute raised): nothing is recorded.

        Returns:
            The dropped record; None if ``owner`` did not hold it (nothing changes).

        Raises:
            ThreadStorageError: the write failed.
        """

    @abstractmethod
    def list_effect_records(
        self,
        *,
        status: EffectRecordStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        """A page of the thread's records, newest first (``created_at``, then key).

        Records of the thread's turn journal (keys beginning with
        `runtime.storage.records.JOURNAL_PREFIX`) are left out. A read: it never writes.

        Raises:
            ValueError: a limit outside 1..1000, or a cursor no store produced.
            ThreadStorageError: the read failed.
        """

    @abstractmethod
    def expire_effect_leases(self, *, keep_owner_prefix: str, now: float) -> int:
        """End at ``now`` the live leases of in-progress records held by a gone process.

        A record is taken to be held by a gone process when its owner does not begin with
        ``keep_owner_prefix`` (`runtime.storage.records.process_owner_prefix`). The runtime
        calls this when it opens a thread of an exclusive backend (`StorageBackend.exclusive`):
        no other process can be applying those keys, so the next call takes them over
        (through ``already_applied``) instead of waiting out the lease.

        Returns:
            How many leases were ended.

        Raises:
            ThreadStorageError: the write failed; nothing changed.
        """

    @abstractmethod
    def purge_effect_records(self, *, older_than: float | None) -> int:
        """Delete the thread's records last changed before ``older_than``, or all of them.

        With ``older_than`` (seconds since the epoch), an in-progress record goes only
        when its lease expired before it too; with None every record goes.

        Returns:
            How many records were deleted.

        Raises:
            ThreadStorageError: the write failed; nothing was deleted.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the store (idempotent); any later call raises ThreadStorageError."""


class RuntimeStore(ABC):
    """The thread registry, the alarm index (an alarm per thread at most), the run index.

    The run index holds a copy of every run without its args (`index_runs`), written in
    batches by the runtime; the thread stores stay the truth. Its reads hide finished
    runs past their retention age, like a thread store's reads (the per-thread
    ``max_finished`` count is not applied to it). Listings go newest first by
    ``created_at``, ties by run id (descending); their cursor is ``(created_at, run_id)``
    of the last run of the previous page, so pages are stable while runs change.

    Every method is one transaction. Failures raise the backend's own database error
    (SQLite: `sqlite3.Error`); the runtime cannot go on without this store. Once closed,
    every call raises `runtime.errors.RuntimeClosed` (on every backend).
    """

    alarms_follow_runs: bool = False
    """Whether the thread stores keep each thread's alarm row themselves, whatever any
    caller believes of it (PostgreSQL: True; SQLite and memory: False).

    True means: every thread-store write that makes a run pending or moves its due time
    earlier (`ThreadStore.insert_run`, `ThreadStore.fire_schedule`, `ThreadStore.run_now`,
    `ThreadStore.recover_interrupted`) or makes a recurring schedule active
    (`ThreadStore.insert_schedule`, `ThreadStore.set_schedule_state`) lowers the thread's
    alarm row to at or before that due time (creating it if missing) in its own
    transaction; and `move_alarms` never raises or removes a row past the thread's
    earliest pending run or active schedule's next fire. So the row is at or before
    every pending run whatever the runtime's cached belief: the runtime need not call
    `lower_alarm` before such a write. False: the runtime lowers the row itself, first."""

    @abstractmethod
    def add_thread(self, info: ThreadInfo, *, alarm_at: float | None = None) -> bool:
        """Register a thread; False (nothing written) if the id is taken.

        ``alarm_at`` (seconds since the epoch, UTC): also write the thread's alarm row at
        that time, in the same transaction (the runtime passes the creation time, so
        that the thread's first schedule need not commit a row of its own).
        """

    @abstractmethod
    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """The registry entry (``paused`` as last set), or None."""

    @abstractmethod
    def set_paused(self, thread_id: str, paused: bool) -> bool:
        """Mark the thread paused or not, durably (one transaction; idempotent).

        `get_thread` and `list_threads` then give its ``paused``; a thread added by
        `add_thread` is not paused, and `delete_thread` forgets the mark.

        Returns:
            False (nothing written) if no such thread is registered.
        """

    def paused_flags(self, thread_ids: Sequence[str]) -> dict[str, bool]:
        """Which of ``thread_ids`` are registered, and whether each is paused.

        Read as `get_thread` reads, for many threads at once: a node that may have missed
        other nodes' deletions and pauses reads what they changed for the threads it holds
        (PostgreSQL: one statement, however many threads). This default asks `get_thread`
        for each.

        Returns:
            ``{thread_id: paused}`` for the registered ones; an unregistered (deleted)
            thread is left out.
        """
        out: dict[str, bool] = {}
        for thread_id in thread_ids:
            info = self.get_thread(thread_id)
            if info is not None:
                out[thread_id] = info.paused
        return out

    @abstractmethod
    def list_threads(
        self, limit: int, after: tuple[float, str] | None, query: ThreadQuery | None = None
    ) -> tuple[list[ThreadInfo], tuple[float, str] | None]:
        """Threads newest first (``created_at`` descending, ties by id descending).

        Args:
            limit: The page size (at least 1).
            after: The cursor of the previous page, ``(created_at, id)`` of its last
                thread (``(last_activity_ts, id)`` when ordered by activity); only
                threads after it in that order.
            query: Filters, and ordering by last activity instead (`ThreadQuery`).
                Activity only moves forward, so a walk by activity never meets a thread
                twice; a thread that becomes active during the walk moves before the
                cursor and is not met again (the next first page has it on top).

        Returns:
            A page and the cursor for the next one (None when no thread follows).
        """

    @abstractmethod
    def touch_threads(self, activity: Mapping[str, float]) -> dict[str, float]:
        """Move threads' ``last_activity_ts`` forward: ``{thread id: seconds since the epoch}``.

        One transaction. A time earlier than the thread's current one changes nothing (it
        never moves back); an unknown thread is skipped. `add_thread` starts it at the
        creation time, and `index_runs` moves it to each run's latest time.

        Returns:
            The part of ``activity`` not written because the thread's registry entry was
            busy (a backend shared by several nodes never waits for a row another
            transaction holds, such as a claim's); the caller gives it again later. Empty
            for a backend that writes all.
        """

    @abstractmethod
    def delete_thread(
        self, thread_id: str, *, frame: FrameDraft | None = None, now: float = 0.0,
        notify: tuple[str, str] | None = None,
    ) -> bool:
        """Remove a thread, its alarm, its pause mark and its indexed runs in one transaction.

        A backend shared by several nodes also drops the thread's turn lease
        (`StorageBackend.take_turn_lease`) in that transaction, whichever node holds it: a
        deleted thread leaves none, and a thread created again under the id starts free. A
        turn of the deleted thread still running on a node then has its writes refused
        (`TurnLeaseLost`).

        Args:
            thread_id: The thread.
            frame: The deletion's ``thread_deleted`` frame. A backend with a cluster bus
                numbers, stores and announces it in the same transaction (as
                `ClusterBus.append_frames` would), before anything else is removed, only if
                the thread exists: the other nodes hear of the deletion exactly when it
                commits, whatever becomes of this node afterwards. ``frame.render`` is
                called once the number is known (again if the transaction is retried). A
                backend without a bus ignores it.
            now: When the frame was made (seconds, UTC): what `ClusterBus.prune_frames`
                compares.
            notify: A notification ``(channel, payload)`` that a backend with a cluster
                bus queues in the same transaction after the frame (`ClusterBus.notify_sql`),
                only if the thread exists: sent when the deletion commits, never without it.
                A backend without a bus ignores it.

        Returns:
            False if the thread did not exist (no frame was written, nothing notified).

        Raises:
            ValueError: ``notify`` names an invalid channel or its payload is too long
                (as `ClusterBus.notify`); nothing was deleted.
        """

    @abstractmethod
    def index_runs(self, runs: Sequence[EffectRun]) -> dict[str, float]:
        """Write the index entries of ``runs`` (their state as given, never the args).

        One transaction for the entries. An entry replaces the run's previous one; a run
        of a thread that is not registered (deleted meanwhile) is skipped. Each run's
        thread's ``last_activity_ts`` moves forward to the run's latest time (created,
        started or finished), as `touch_threads` would (in the same transaction or, on
        PostgreSQL, in one of its own right after), and what that did not write is
        returned as `touch_threads` returns it (the entries themselves are all written).

        Derived data: a backend may commit it less durably than its other writes (a
        power cut may lose the last batches; SQLite commits them without an fsync of
        their own). The runtime marks the index incomplete (`set_run_index_complete`,
        durable) before it writes any, and rebuilds an index a start finds incomplete.
        """

    @abstractmethod
    def list_indexed_runs(
        self,
        query: RunQuery,
        now: float,
        retention: RetentionPolicy,
        limit: int,
        before: tuple[float, str] | None = None,
    ) -> tuple[list[EffectRun], tuple[float, str] | None]:
        """Indexed runs matching ``query``, newest first (``args`` None).

        Args:
            query: The filters.
            now: The current time (retention hides finished runs past their age).
            retention: The policy.
            limit: The page size (at least 1).
            before: The cursor of the previous page: only runs after it in this order.

        Returns:
            A page and the cursor for the next one (None when no run follows).
        """

    @abstractmethod
    def count_indexed_runs(
        self, query: RunQuery, now: float, retention: RetentionPolicy
    ) -> dict[EffectStatus, int]:
        """How many indexed runs match ``query`` (its ``statuses`` ignored), per status.

        Every status is a key (0 when none).
        """

    def list_stored_runs(
        self,
        query: RunQuery,
        now: float,
        retention: RetentionPolicy,
        limit: int,
        before: tuple[float, str] | None = None,
    ) -> tuple[list[EffectRun], tuple[float, str] | None]:
        """`list_indexed_runs`, read from the threads' own runs rather than the index.

        Sees every run committed before the call, by any process: a backend shared by
        processes (`StorageBackend.exclusive` False) reads its runs table (PostgreSQL),
        since another process indexes its runs only after their commits. A backend one
        process uses answers from the index, which that process writes (flushed first by
        the caller): this default.
        """
        return self.list_indexed_runs(query, now, retention, limit, before)

    def count_stored_runs(
        self, query: RunQuery, now: float, retention: RetentionPolicy
    ) -> dict[EffectStatus, int]:
        """`count_indexed_runs`, read as `list_stored_runs` reads."""
        return self.count_indexed_runs(query, now, retention)

    def running_runs(
        self, thread_ids: Sequence[str], now: float, retention: RetentionPolicy
    ) -> list[EffectRun]:
        """The runs of ``thread_ids`` whose status is running, as stored (``args`` None).

        Read as `list_stored_runs` reads: on a shared backend, whichever process runs them.
        """
        out: list[EffectRun] = []
        for thread_id in thread_ids:
            query = RunQuery(statuses=(EffectStatus.RUNNING,), thread_id=thread_id)
            runs, _ = self.list_indexed_runs(query, now, retention, 100)
            out.extend(runs)
        return out

    @abstractmethod
    def prune_run_index(self, now: float, retention: RetentionPolicy) -> int:
        """Delete the entries of finished runs past their retention age; how many.

        May be committed as `index_runs` is (a lost prune leaves entries reads hide).
        """

    @abstractmethod
    def run_index_complete(self) -> bool:
        """Whether the index was left holding every thread's runs.

        True for a new store; False after an upgrade from a version without the index,
        and whenever `set_run_index_complete` last said False.
        """

    @abstractmethod
    def set_run_index_complete(self, complete: bool) -> None:
        """Record (durably) whether the index holds every thread's runs.

        The runtime says False when it starts (entries are written in batches, so a
        crash may lose the last ones) and True after its final flush at a clean close,
        or when a rebuild finished.
        """

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
        """Apply ``(thread_id, expected, target)`` alarm moves in one transaction, in order.

        Each move is a compare-and-set: the row goes to ``target`` (None removes it) only
        if it still holds exactly ``expected``; a row lowered meanwhile (a new run) is
        left alone. With ``expected`` None the row is only ever created or lowered (and a
        ``target`` of None does nothing).

        With `alarms_follow_runs`, a raise or removal stops at the thread's earliest
        pending run or active schedule fire (read after the row is locked), and a move
        whose row no longer holds ``expected`` is listed with the value the row holds.

        Returns:
            The compare-and-set moves applied, as ``(thread_id, value written)`` (None:
            removed; ``target`` unless `alarms_follow_runs` stopped it earlier), and, with
            `alarms_follow_runs`, those not applied as ``(thread_id, value held)``.
            Creates and lowerings with ``expected`` None are not listed.
        """

    @abstractmethod
    def load_alarms(self, until: float | None = None) -> list[tuple[str, float]]:
        """Every alarm as ``(thread_id, due_at)``, in no particular order.

        With ``until`` (seconds, UTC), only those with ``due_at < until``: a node that
        keeps timers only for the alarms due within a horizon reads that window
        (PostgreSQL: an index walk on ``due_at``).
        """

    # Runtime-level records: the `runtime.storage.records.EffectRecordStore` contract, in
    # the runtime database (durable turns' "cross-run" keys, `runtime.durable`). ``scope``
    # plays the part of the thread id; every method is one transaction.

    @abstractmethod
    def get_record(self, scope: str, key: str) -> EffectRecord | None:
        """The record under ``(scope, key)``, or None (a read)."""

    @abstractmethod
    def begin_record(
        self, scope: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float, now: float,
    ) -> Claim:
        """Claim a key, as `EffectRecordStore.begin` (``now``: seconds since the epoch)."""

    @abstractmethod
    def complete_record(
        self, scope: str, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus,
    ) -> EffectRecord:
        """Record how a claimed call ended, as `EffectRecordStore.complete`.

        Raises:
            EffectRecordLost: ``owner`` no longer holds the key.
        """

    @abstractmethod
    def renew_record(
        self, scope: str, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        """Extend ``owner``'s live claim to ``now`` + ``lease_seconds`` (`EffectRecordStore.renew`).

        Returns:
            True if ``owner`` holds the in-progress record (renewed); False otherwise
            (nothing changes).

        Raises:
            ValueError: ``lease_seconds`` is not positive and finite.
        """

    @abstractmethod
    def release_record(self, scope: str, key: str, *, owner: str) -> bool:
        """Drop ``owner``'s claim without a record, as `EffectRecordStore.release`."""

    @abstractmethod
    def list_records(
        self, scope: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        """A page of a scope's records, newest first, as `EffectRecordStore.list` (a read)."""

    @abstractmethod
    def delete_records(self, scope: str) -> int:
        """Delete every record of a scope. Returns how many."""

    @abstractmethod
    def purge_records(self, *, older_than: float) -> int:
        """Delete records last changed before ``older_than`` (seconds since the epoch).

        An in-progress record goes only once its lease expired before it too. Returns how
        many were deleted.
        """

    @abstractmethod
    def close(self) -> None:
        """Close the store (idempotent); any later call raises RuntimeClosed."""


MAX_PAYLOAD_BYTES = 7900
"""The largest notification payload a `ClusterBus` carries, in UTF-8 bytes.

PostgreSQL refuses payloads of 8,000 bytes or more; the margin leaves room for escaping.
"""


class ClusterBus(ABC):
    """Notifications between the processes (nodes) that share one backend.

    A backend shared by several live processes (PostgreSQL) has one; it is ``None`` on
    the SQLite and memory backends (`StorageBackend.cluster`). Channels are short names
    (`check_channel`); the bus keeps them apart from other apps' on the same database
    (PostgreSQL: the schema's name prefixes them). Delivery is at most once: a
    notification sent while a node's listening connection is down is lost, which is why
    ``on_reconnect`` exists — a listener resyncs from the database then.
    """

    @abstractmethod
    def listen(
        self, channel: str, callback: Callable[[str], None], *,
        on_reconnect: Callable[[], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Call ``callback(payload)`` on the event loop for each notification on ``channel``.

        Several callbacks may listen on one channel; each gets every notification, in the
        order the node received them (for one sender: the order its transactions
        committed). A node receives its own notifications too. Returns at once; the
        listening takes effect shortly after (`flush` waits for it).

        Args:
            channel: The channel name (`check_channel`).
            callback: Called with the payload (a str of at most `MAX_PAYLOAD_BYTES`).
                An exception it raises is logged and does not stop the other callbacks.
            on_reconnect: Called (on the same loop, without arguments) each time the
                listening on ``channel`` takes effect: the first time, and after every
                reconnect of the node's listening connection. Notifications sent before it
                may have been missed: the listener resyncs from the database there.
            loop: The event loop the callbacks run on; default the running loop.

        Raises:
            ValueError: an invalid channel name.
            RuntimeError: no loop was given and none is running.
        """

    @abstractmethod
    def unlisten(self, channel: str, callback: Callable[[str], None]) -> None:
        """Stop calling ``callback`` for ``channel`` (no error if it was not listening)."""

    @abstractmethod
    def notify(self, channel: str, payload: str) -> None:
        """Send ``payload`` to every node listening on ``channel`` (this one included).

        Blocking (one round trip to the database); callable from any thread, but from a
        storage thread rather than the event loop.

        Raises:
            ValueError: an invalid channel name, or a payload over `MAX_PAYLOAD_BYTES`
                (the message gives its size and the limit).
            DatabaseUnavailable: the database cannot be reached.
        """

    @abstractmethod
    def notify_sql(self, cursor: Any, channel: str, payload: str) -> None:
        """Queue a notification inside the caller's open transaction on ``cursor``.

        It is sent when that transaction commits, and not at all if it rolls back; the
        notifications of one transaction arrive in the order they were queued.

        Raises:
            ValueError: as `notify`.
        """

    @abstractmethod
    def flush(self, timeout: float) -> bool:
        """Block until every channel listened to so far is being listened to.

        Returns False if that did not happen within ``timeout`` seconds (the listening
        connection is down, or the bus is not started). Not for the event loop.
        """

    @property
    @abstractmethod
    def connected(self) -> bool:
        """Whether the node's listening connection is up now (asks no server)."""

    # -------------------------------------------------------------- frames across nodes

    @abstractmethod
    def append_frames(self, drafts: Sequence[FrameDraft], now: float) -> list[int]:
        """Number, store and announce frames, in one transaction; their ``seq``s, in order.

        Each thread's frames get the next numbers of its counter, shared by every node
        (the counter's row is locked until commit, so a thread's numbers follow commit
        order across nodes); a draft with its ``seq`` given (numbered in its change's
        transaction) is stored with that number and leaves the counter alone. Each frame
        is stored (`read_frames`, until `prune_frames`)
        and announced on the ``frames`` channel when the transaction commits: one
        notification carries as many frames as fit (`decode_frames` reads it); a frame
        too large to fit is announced without its text, to be read from the table.

        Args:
            drafts: The frames, in publication order.
            now: When they were made (seconds, UTC): what `prune_frames` compares.

        Raises:
            DatabaseUnavailable: the database cannot be reached (nothing was stored).
        """

    @abstractmethod
    def read_frames(
        self, thread_id: str, after_seq: int, upto_seq: int | None = None,
    ) -> list[tuple[int, str, str]]:
        """A thread's stored frames with ``after_seq < seq <= upto_seq``, in ``seq`` order.

        As ``(seq, kind, text)``; ``upto_seq`` None: no upper bound. Pruned ones are missing.
        """

    @abstractmethod
    def prune_frames(self, older_than: float) -> int:
        """Delete the frames made before ``older_than`` (seconds, UTC); how many went.

        The counters of threads that are no longer registered and keep no frame go too.
        """


WAKE_CHANNEL = "wake"
"""The `ClusterBus` channel on which a backend announces runs as their rows commit."""


def interrupted_error(attempts: int, max_attempts: int, reason: str | None) -> str:
    """The error of a run `ThreadStore.recover_interrupted` fails at the attempt limit."""
    text = (f"Interrupted {attempts} times (by a restart, a shutdown, a lost lease or an "
            f"unreachable database, not by its own error); gave up after {max_attempts} "
            f"attempts")
    return text if reason is None else f"{text} (the last time: {reason})"


def encode_wake(sender: str, thread_id: str, due_at: float) -> str:
    """The ``wake`` payload: ``sender thread_id due_at`` (`decode_wake`)."""
    return f"{sender} {thread_id} {due_at!r}"


def decode_wake(payload: str) -> tuple[str, str, float]:
    """``(sender, thread_id, due_at)`` of a ``wake`` payload.

    Raises:
        ValueError: the payload is not one `encode_wake` made.
    """
    sender, thread_id, due_at = payload.split(" ")
    return sender, thread_id, float(due_at)


FRAMES_CHANNEL = "frames"
"""The `ClusterBus` channel on which `ClusterBus.append_frames` announces frames."""


@dataclass(frozen=True, slots=True)
class FrameDraft:
    """A frame to be numbered: ``render(seq)`` gives its JSON text once ``seq`` is known.

    ``render`` runs in the storage thread that appends the frame, inside its transaction;
    it must be quick and must not touch the event loop.
    """

    thread_id: str
    kind: str
    render: Callable[[int], str]
    seq: int | None = None
    """The number the frame already took in its change's transaction (`ThreadStore.
    frame_seq`), or None: `ClusterBus.append_frames` numbers it."""


@dataclass(frozen=True, slots=True)
class AnnouncedFrame:
    """One frame of a ``frames`` notification (`decode_frames`).

    ``text`` is None when it was too large to carry (read it with `ClusterBus.read_frames`).
    """

    thread_id: str
    seq: int
    kind: str
    text: str | None


def encode_frames(sender: str, frames: Sequence[AnnouncedFrame]) -> list[str]:
    r"""``frames`` as few notification payloads as fit `MAX_PAYLOAD_BYTES`, in order.

    A payload is a header line, the sender's id then the ids of the threads its frames
    belong to (``sender\tthread\tthread...``, each thread once, in first-frame order), then
    one line per frame (``thread\tseq\tkind\ttext``): frame texts are compact JSON, which
    never holds a raw newline or tab, and thread ids hold neither. A node reads the header
    alone (`frames_header`) to skip a payload none of whose threads it serves.
    """
    payloads: list[str] = []
    limit = MAX_PAYLOAD_BYTES - 64
    sender_size = len(sender.encode())
    threads: list[str] = []
    seen: set[str] = set()
    lines: list[str] = []
    size = sender_size

    def close() -> None:
        payloads.append("\n".join(["\t".join([sender, *threads]), *lines]))

    for f in frames:
        line = f"{f.thread_id}\t{f.seq}\t{f.kind}\t{f.text or ''}"
        n = len(line.encode("utf-8", "surrogatepass")) + 1
        header = 0 if f.thread_id in seen else len(f.thread_id.encode()) + 1
        if n + header + sender_size > limit:
            line = f"{f.thread_id}\t{f.seq}\t{f.kind}\t"
            n = len(line.encode()) + 1
        if size + header + n > limit and lines:
            close()
            threads, seen, lines, size = [], set(), [], sender_size
            header = len(f.thread_id.encode()) + 1
        if f.thread_id not in seen:
            seen.add(f.thread_id)
            threads.append(f.thread_id)
        lines.append(line)
        size += header + n
    if lines:
        close()
    return payloads


def frames_header(payload: str) -> tuple[str, list[str]]:
    """``(sender, thread ids)`` of a ``frames`` notification, from its header line alone."""
    end = payload.find("\n")
    sender, *threads = (payload if end < 0 else payload[:end]).split("\t")
    return sender, threads


def decode_frames(payload: str) -> tuple[str, list[AnnouncedFrame]]:
    """``(sender, frames)`` of a ``frames`` notification (`encode_frames`).

    Raises:
        ValueError: the payload is not one `encode_frames` made.
    """
    header, *lines = payload.split("\n")
    sender = header.split("\t", 1)[0]
    frames: list[AnnouncedFrame] = []
    for line in lines:
        thread_id, seq, kind, text = line.split("\t", 3)
        frames.append(AnnouncedFrame(thread_id, int(seq), kind, text or None))
    return sender, frames


_CHANNEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.:-")
MAX_CHANNEL_LENGTH = 40


def check_channel(channel: str) -> str:
    """``channel`` if it is a valid `ClusterBus` channel name.

    A valid name is 1 to `MAX_CHANNEL_LENGTH` characters of ``a-z 0-9 _ . : -``.

    Raises:
        ValueError: otherwise (the message names the channel and the rule).
    """
    if (not isinstance(channel, str) or not 0 < len(channel) <= MAX_CHANNEL_LENGTH
            or not _CHANNEL_CHARS.issuperset(channel)):
        raise ValueError(
            f"Invalid cluster channel name {channel!r}: use 1 to {MAX_CHANNEL_LENGTH} "
            f"characters of a-z, 0-9, '_', '.', ':' and '-'"
        )
    return channel


def check_payload(channel: str, payload: str, size: int | None = None) -> None:
    """Refuse a payload over `MAX_PAYLOAD_BYTES` (``size``: its byte size if known).

    Raises:
        ValueError: the payload is not a str or is too large (naming the channel, the
            size and the limit).
    """
    if not isinstance(payload, str):
        raise ValueError(
            f"Cluster notification on {channel!r}: the payload must be a str, "
            f"got {type(payload).__name__}"
        )
    if size is None:
        size = len(payload.encode("utf-8", "surrogatepass"))
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"Cluster notification on {channel!r}: the payload is {size} bytes, over the "
            f"limit of {MAX_PAYLOAD_BYTES} bytes; send a key and read the rest from the "
            f"database"
        )


class StorageBackend(ABC):
    """Where a runtime keeps its registry, alarms and every thread's store (a factory).

    A runtime calls `open` once at start, then the thread-store methods, then `close`.

    Attributes:
        exclusive: True when one process at a time uses the backend (`open` takes
            exclusive use, as the SQLite and memory backends do): what a thread's store holds
            in progress for another process was left by one that is gone. A backend shared
            by several live processes sets it False.
    """

    exclusive: bool = True
    node_id: str | None = None
    """This process's node id (`runtime.config.Settings.node_id`), set by the runtime
    before `open`: recorded on every run attempt its thread stores claim
    (`runtime.effects.RunAttempt.node_id`), and, on a backend shared by several
    processes, the name of its membership lease."""
    claims: bool = True
    """Whether this process claims runs (``max_concurrent_runs`` > 0), set by the runtime
    before `open`: on a backend shared by several processes, written with its membership
    lease, so that only claiming nodes rank for wake-ups (`claiming_nodes`)."""
    effects: tuple[str, ...] | None = None
    """The qualified names of the effects this process runs, set by `record_effects`
    (None until then: it knows none for others)."""
    kind: str = "custom"
    """What `GET /api/health` names the backend: ``sqlite``, ``memory``, ``postgres``."""
    cluster: ClusterBus | None = None
    """The notifications between the nodes sharing this backend (`ClusterBus`), or None
    for a backend one process uses at a time (SQLite, memory). Listening starts at `open`
    and stops at `close`."""

    short_calls_inline: bool = False
    """Whether a thread store's short writes (recording a schedule, recording an outcome
    and claiming the next due run) cost so little that the runtime makes them on the event
    loop itself, without the hand-off to a storage thread and back. True for SQLite with
    ``synchronous=NORMAL`` (a commit writes the WAL without waiting for the disk); False
    where a commit waits for a disk flush or a server round trip."""

    def connection_held(self) -> bool | None:
        """Whether the backend holds a live connection to a database server now.

        None for a backend without a server (SQLite files, memory). Asks no server: it
        reports what the backend last saw (for `GET /api/health`).
        """
        return None

    def lock_problem(self) -> str | None:
        """Why this process must not start runs or turns now, or None (it may).

        A backend shared by processes says so when it lost the exclusive hold it had at
        `open` (PostgreSQL: the schema's lock); the runtime then starts nothing until the
        backend holds it again.
        """
        return None

    @abstractmethod
    def open(self) -> RuntimeStore:
        """Take exclusive use of the backend and return the runtime store (registry + alarms).

        Creates what is missing and migrates what is older. Discards (and logs) every
        thread store that no registry entry names: one left by a crash during a create or
        a delete, which nothing could reach (SQLite: only ``threads/`` files named like a
        thread's, ``<thread_id>.sqlite`` and its ``-wal``/``-shm``/``-journal``).

        Raises:
            DataDirLocked: another process holds the backend (SQLite: the data-dir lock).
            RuntimeStorageError: the runtime database is unusable, corrupt or of a newer
                schema, or missing/empty while thread stores exist. Nothing stays taken.
        """

    @abstractmethod
    def create_thread_store(self, info: ThreadInfo) -> ThreadStore:
        """A new, empty store for a thread, with its meta written.

        The meta holds ``thread_id`` and ``created_at``. Leftovers of a crashed create or
        delete under that id are discarded first.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadStorageError: the store cannot be made (nothing is left behind).
            ThreadExists: a backend shared by several nodes holds a registered thread
                of that id with its store (made by another node since this one looked
                at the registry); that thread is left untouched.
        """

    @abstractmethod
    def open_thread_store(self, thread_id: str) -> ThreadStore:
        """The existing store of a registered thread, migrated to the current schema.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadStorageError: the store is missing, empty, corrupt or of a newer schema
                than this runtime knows (the message names the thread and, for SQLite,
                the file).
        """

    @abstractmethod
    def remove_thread_store(self, thread_id: str) -> None:
        """Delete everything the thread holds here; idempotent (a missing store is fine).

        Call it after closing the thread's open store (SQLite: its file and WAL go).

        Raises:
            InvalidThreadId: a malformed id.
        """

    def orphaned_runs(self, limit: int = 1000) -> list[tuple[str, str]]:
        """Runs left ``running`` by nodes whose lease expired: ``(thread_id, run_id)``.

        At most ``limit``, by thread. A backend shared by several processes (PostgreSQL)
        answers the runs whose current attempt is another node's and whose node no
        longer holds a live lease (or that name no node); the runtime re-queues them
        (`ThreadStore.recover_interrupted` with their ids, the attempt rule applied).
        One process per backend (SQLite, memory): always empty, the runs a dead process
        left are recovered when their thread is opened.

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return []

    def discard_orphaned_threads(
        self, created_before: float, limit: int = 100,
        thread_ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Remove the rows of threads no registry entry names any more; their ids.

        A node that dies between a thread's deletion (its registry entry goes in one
        transaction) and the removal of the thread's own rows (runs, messages, records)
        leaves those rows behind, unreachable. `open` discards them; a backend shared by
        several live processes (PostgreSQL) also does it here, on a live node: at most
        ``limit`` threads per call, in one transaction, among ``thread_ids`` only when
        given (an indexed look-up; None: every thread's store is looked at). Only threads
        created before ``created_before`` (seconds since the epoch, UTC; their store's
        ``created_at``) are taken: a thread being created has its store written a moment
        before its registry entry, and is left alone. One process per backend (SQLite,
        memory): always empty (what a crash left is discarded at the next `open`).

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return []

    def mark_dead_nodes_gaps(self) -> list[tuple[str, int]]:
        """Advance, without a frame, the frame counter of threads dead nodes may have changed.

        A node relays its changes' frames after they commit (docs/scale-out.md, "Frames
        across nodes"); one killed in between leaves a committed change without its frame.
        For every node whose lease expired and was not accounted for yet, a shared backend
        (PostgreSQL) advances by one the counter of each thread in which that node held an
        attempt still open or ended within one lease period before its last heartbeat, and
        marks the node accounted for, in one transaction (two live nodes never both do it).
        The next frame of such a thread comes one ``seq`` later: its subscribers see a gap
        and reload. The same transaction rewrites from the runs themselves the run index
        rows such a node's lost last batch may have left stale (`RuntimeStore.index_runs`;
        docs/scale-out.md, "The run index in the crash window"). One process per backend
        (SQLite, memory): always empty, nothing to do.

        Returns:
            ``(thread_id, seq)`` for every ``seq`` skipped so.

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return []

    def alone(self) -> bool:
        """Whether no other process uses the backend now (no other node's lease is live).

        True for a backend one process uses at a time (`exclusive`). A shared backend
        asks its database (PostgreSQL: the ``nodes`` table).

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return self.exclusive

    def claiming_nodes(self) -> list[str]:
        """The node ids that hold a live lease and claim runs now, sorted.

        Read from the backend at each call: a node whose lease expired (it died, or lost
        the database) or that closed is not in it, nor one that claims no run (`claims`
        False). A backend one process uses at a time (SQLite, memory): this node's id if
        it claims and has one, else empty.

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return [self.node_id] if self.claims and self.node_id else []

    def record_effects(self, names: Collection[str]) -> None:
        """Record the qualified names of the effects this process runs (`effects`).

        Called by the runtime once its effects are discovered, before it claims runs. On
        a backend shared by several processes (PostgreSQL) they are written with the
        membership lease: a node then leaves a due run of an effect it lacks, and the
        fire of a recurring schedule of one, to a live claiming node that has it
        (docs/scale-out.md, "Rolling deploys"). A backend one process uses at a time
        only keeps them.

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        self.effects = tuple(sorted(set(names)))

    def effect_known_elsewhere(self, name: str) -> bool:
        """Whether another live claiming node runs the effect named ``name`` (qualified).

        Always False on a backend one process uses at a time (SQLite, memory).

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return False

    def take_turn_lease(self, thread_id: str, token: str) -> str | None:
        """Take the thread's turn lease for this node (``token``: this turn); None if taken.

        A backend shared by several processes (PostgreSQL) keeps one turn lease per
        thread: taken when free, when its holder's node lease expired, or when its holder
        is this node id (left by an earlier process with it: one process runs one turn
        of a thread at a time). Otherwise it answers the node id holding it, and the
        caller waits. One process per backend (SQLite, memory): always taken (the
        runtime serializes a thread's turns itself).

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return None

    def release_turn_lease(self, thread_id: str, token: str) -> None:
        """Give the thread's turn lease back, if ``token`` still holds it (idempotent)."""
        return None

    def held_turn_leases(self) -> list[tuple[str, str]]:
        """``(thread_id, token)`` of every turn lease this node id holds, by thread id.

        A node compares them with the turns it runs: a lease whose release was lost (a
        connection cut while it was given back, or a take that committed while its caller
        was cancelled or cut) is one no turn of the node holds, and the node gives it back
        (`release_turn_lease`) rather than make turns of its thread on other nodes wait
        for as long as it lives. Always empty for one process per backend (SQLite,
        memory).

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        return []

    def orphaned_turns(self) -> list[str]:
        """Threads whose turn lease is held by a node whose lease expired.

        Their turns are to be resumed by a live node. Always empty for one process per
        backend (SQLite, memory).
        """
        return []

    on_lease_lost: Callable[[str], None] | None = None
    """Set by the runtime: called (from any thread, at most once per loss, with the reason)
    when a shared backend's node lease may have expired without being renewed: the node
    then cancels the effects it runs, which other nodes re-queue. Never called by SQLite
    or memory."""

    @abstractmethod
    def close(self) -> None:
        """Release what `open` took (the lock). Idempotent."""
