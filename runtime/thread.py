"""`ThreadState`: the handle code gets to a thread.

A thread is an actor (`runtime.actors.ThreadActor`): it owns its store, and its writes and
runs happen one at a time. Code never touches the actor; it gets a `ThreadState` from the
runtime (``await rt.get_thread(id)``), as an effect's first argument, or as a tool's
dependencies. A `ThreadState` calls only public methods of the runtime's parts: its run
operations (`runtime.runs.RunOperations`), its change hub, and the conversation layer
registered with it (`runtime.extension.Conversation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from runtime._text import NUL, no_nul_message
from runtime.discovery import PACKAGE_ID_RE
from runtime.effects import EffectRun, EffectStatus, RunAttempt
from runtime.errors import InvalidArgument, InvalidSchedule
from runtime.frames import Subscription
from runtime.recurrence import Schedule
from runtime.storage.base import ThreadInfo
from runtime.storage.records import EffectRecord, EffectRecordPage, EffectRecordStatus

if TYPE_CHECKING:
    from runtime.messages import Message, MessagePage, MessageRole, TurnResult
    from runtime.supervisor import Runtime


@dataclass(frozen=True, slots=True)
class Execution:
    """Where code runs inside a turn; `ThreadState.execution` is None outside turns.

    Attributes:
        run_id: The turn's run id.
        step: The model step within the turn (1-based).
        tool_call_id: The tool call being executed, if any.
    """

    run_id: str
    step: int = 0
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class RunPage:
    """A page of runs, newest first.

    Attributes:
        runs: The runs on this page.
        next_cursor: Pass as ``cursor`` for the next page; None on the last page.
        counts: How many runs the thread has in each status (with the ``name`` filter
            applied, not the status filter), as of this page.
    """

    runs: list[EffectRun]
    next_cursor: str | None
    counts: dict[EffectStatus, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """What `ThreadState.schedule` returns.

    Attributes:
        run_id: The run id: the new run's, or the live run's that holds the key.
        created: True if a new run was stored; False if the thread already had a pending
            or running run with the same key (nothing was stored).
    """

    run_id: str
    created: bool


@dataclass(frozen=True, slots=True)
class ScheduleCreated:
    """What `ThreadState.schedule_recurring` returns.

    Attributes:
        schedule: The schedule: the new one, or the one that holds the key.
        created: True if a new schedule was stored; False if the thread already had a
            schedule with the same key (nothing was stored).
    """

    schedule: Schedule
    created: bool


class ThreadState:
    """What code running for a thread gets: its id, its context and its effects API.

    A handle kept past its thread's deletion: `schedule_effect` (the call that adds work)
    raises `ThreadNotFound`, even once a new thread has the same id, for it knows the
    creation time of the thread it was made for; every other call addresses the thread
    by id, as the HTTP API does, so it reads (or cancels in) whatever thread has that id
    now, and raises `ThreadNotFound` while none has.

    Attributes:
        thread_id: The thread's id.
        execution: The turn context inside a tool or hook; None inside an effect, an
            endpoint or host-application code.
        package_id: The package whose code holds this state (short effect names then
            mean that package's effects), or None for the app.
    """

    __slots__ = ("_info", "_rt", "execution", "package_id", "thread_id")

    def __init__(
        self,
        runtime: Runtime,
        info: ThreadInfo,
        *,
        execution: Execution | None = None,
        package_id: str | None = None,
    ) -> None:
        self._rt = runtime
        self._info = info
        self.thread_id = info.id
        self.execution = execution
        self.package_id = package_id

    def __repr__(self) -> str:
        return f"ThreadState(thread_id={self.thread_id!r}, execution={self.execution!r})"

    @property
    def runtime(self) -> Runtime:
        """The runtime that owns the thread."""
        return self._rt

    @property
    def info(self) -> ThreadInfo:
        """The thread's registry entry (id, creation time, agent, user, tags, paused)."""
        return self._info

    @property
    def agent_id(self) -> str | None:
        """The agent serving this thread, if any."""
        return self._info.agent_id

    @property
    def user_id(self) -> str | None:
        """The user the thread belongs to, if any."""
        return self._info.user_id

    @property
    def tags(self) -> tuple[str, ...]:
        """The thread's tags."""
        return self._info.tags

    @property
    def paused(self) -> bool:
        """Whether the thread was paused when this state was made (see `pause`)."""
        return self._info.paused

    async def pause(self) -> ThreadState:
        """Pause the thread: see `runtime.Runtime.pause_thread`; returns its new state."""
        return await self._rt.pause_thread(self.thread_id)

    async def resume(self) -> ThreadState:
        """Resume the thread: see `runtime.Runtime.resume_thread`; returns its new state."""
        return await self._rt.resume_thread(self.thread_id)

    @property
    def created_at(self) -> datetime:
        """When the thread was created, an aware UTC datetime."""
        return datetime.fromtimestamp(self._info.created_at_ts, UTC)

    def with_context(
        self, *, execution: Execution | None = None, package_id: str | None = None
    ) -> ThreadState:
        """A copy of this state with another execution context or package."""
        return ThreadState(self._rt, self._info, execution=execution, package_id=package_id)

    def for_package(self, package_id: str | None) -> ThreadState:
        """This state as seen by a package's code: short effect names mean its effects.

        A package's effects get such a state already; its tools and hooks call this with
        their own ``packageId`` (the entry point name they publish under). The execution
        context is kept.

        Args:
            package_id: The package's id; None for the app's scope.

        Returns:
            A copy whose `schedule_effect`, `get_scheduled_effects` and `list_runs` take
            ``"ping"`` as ``"{package_id}/ping"``. Scheduling through a package that is not
            installed raises `EffectNotFound`.

        Raises:
            InvalidArgument: (a ``ValueError``) ``package_id`` is not a valid ``packageId``
                (``^[a-z][a-z0-9_-]*$``), so no package could ever have it.
        """
        if package_id is not None and (
            not isinstance(package_id, str) or not PACKAGE_ID_RE.fullmatch(package_id)
        ):
            raise InvalidArgument(
                f"Invalid packageId {package_id!r}: must match ^[a-z][a-z0-9_-]*$ (lowercase "
                f"letters, digits, '_' and '-', starting with a letter), as entry point names "
                f"in the group thread_effects.packages do"
            )
        return ThreadState(self._rt, self._info, execution=self.execution, package_id=package_id)

    def _qualified(self, name: str | None) -> str | None:
        """A short name inside a package names that package's effect, as stored in runs."""
        if name is not None and NUL in name:
            raise InvalidArgument(no_nul_message("name"))
        if name is None or self.package_id is None or "/" in name:
            return name
        return f"{self.package_id}/{name}"

    async def schedule_effect(
        self,
        name: str,
        args: Any = None,
        delay: float | timedelta = 0,
        *,
        key: str | None = None,
        at: datetime | None = None,
        cron: str | None = None,
        timezone: str | ZoneInfo | None = None,
        every: float | timedelta | None = None,
    ) -> str:
        """Schedule a run of an effect on this thread, or a recurring schedule of it.

        With ``cron`` or ``every`` this makes a recurring schedule instead of one run
        (see `schedule_recurring`, which this calls) and returns the schedule's id.

        Args:
            name: The effect name: ``"send_reminder"``, or ``"{packageId}/{effect}"`` for a
                package's effect.
            args: JSON-serializable args (a dict, or a pydantic model instance), validated
                against the effect's schema now and again when the run starts.
            delay: Seconds (int/float) or a `timedelta` from now; 0 = as soon as possible.
            at: Instead of ``delay``, when the run is due: an aware `datetime` (any time
                zone; a time in the past is due at once and runs once).
            key: An idempotency key, scoped to this thread (1 to 256 characters): while
                the thread has a pending or running run with this key, no run is stored
                and that run's id is returned (concurrent calls store exactly one run).
                The key is free again once its run finished. `schedule` says whether the
                run is new. With ``cron``/``every``: the schedule's key instead (see
                `schedule_recurring`).
            cron: A crontab expression (minute hour day month weekday), such as
                ``"0 9 * * 1-5"``: a recurring schedule.
            timezone: The IANA zone ``cron`` is read in (default ``"UTC"``): a name or a
                `ZoneInfo` made from one.
            every: A recurring schedule every so many seconds (int/float, at least 1) or
                a `timedelta`.

        Returns:
            The run id (the existing run's when the key is taken); with ``cron`` or
            ``every``, the schedule id.

        Raises:
            EffectNotFound: no effect of that name ("Effect not found: <name>").
            InvalidEffectArgs: args not JSON, over the size limit, or failing the schema.
            InvalidDelay: a delay that is negative, NaN, infinite or over 10 years, an
                ``at`` that is naive, not a datetime or over 10 years away, or both a
                delay and ``at`` (a ValueError, as InvalidEffectArgs is).
            InvalidArgument: a key that is empty, not a string, not valid Unicode or over
                256 characters (a ValueError).
            InvalidSchedule: (a ValueError) ``cron`` or ``every`` with ``delay`` or
                ``at``, or the errors of `schedule_recurring`.
            ThreadNotFound: the thread was deleted.
            ThreadStorageError: the thread's database cannot be used.
        """
        if cron is not None or every is not None or timezone is not None:
            if at is not None or (delay != 0 and delay != timedelta(0)):
                raise InvalidSchedule(
                    "give cron or every (a recurring schedule) or delay/at (one run), "
                    "not both"
                )
            made = await self.schedule_recurring(
                name, args, cron=cron, timezone=timezone, every=every, key=key
            )
            return made.schedule.id
        scheduled = await self._rt.runs.schedule(self, name, args, delay, key=key, at=at)
        return scheduled.run_id

    async def schedule_recurring(
        self,
        name: str,
        args: Any = None,
        *,
        cron: str | None = None,
        timezone: str | ZoneInfo | None = None,
        every: float | timedelta | None = None,
        key: str | None = None,
    ) -> ScheduleCreated:
        """Make a recurring schedule: a run of the effect at each fire time.

        Each occurrence is its own run (``schedule_id`` set) with the usual statuses,
        attempts and frames, due at its fire time. A fire time that comes while the
        previous occurrence is still pending or running is skipped and counted
        (``skipped``): runs never stack. Fire times missed while the process was down
        (or the thread paused) make one run, not one per missed time. The schedule
        survives restarts; see docs/scheduling.md.

        Args:
            name: The effect name (as for `schedule_effect`).
            args: The args every occurrence gets, validated now (and at each run).
            cron: A crontab expression, minute hour day month weekday (``"0 9 * * 1-5"``;
                0 or 7 = Sunday; day of month and weekday both restricted: either
                matches, as in crontab). DST: a wall time skipped by a spring-forward
                fires once, shifted by the gap (in every zone, midnight gaps included);
                one repeated by a fall-back fires twice (once per offset).
            timezone: The IANA zone ``cron`` is read in (a name in
                ``zoneinfo.available_timezones()``, not ``"localtime"``), or a `ZoneInfo`
                made from one (its key is kept); default ``"UTC"``. Not with ``every``.
            every: The period: seconds (int/float) or a `timedelta`, at least 1 s and at
                most 10 years. Fire times are ``created_at + k * every``.
            key: At most one schedule per key in this thread (1 to 256 characters): while
                one has it, no schedule is stored and that one is returned
                (``created=False``), so "ensure the daily digest" can run at every start.
                Free again once that schedule is canceled.

        Returns:
            ``ScheduleCreated(schedule, created)``.

        Raises:
            InvalidSchedule: (a ValueError) both or neither of ``cron`` and ``every``; a
                ``timezone`` with ``every``; a bad cron expression (or a non-ASCII one,
                or one that never fires, such as ``"0 9 31 2 *"``); an unknown or
                host-dependent time zone; an ``every`` under 1 s, over 10 years, or not a
                number or `timedelta`.
                The message names the argument.
            EffectNotFound: no effect of that name.
            InvalidEffectArgs: args not JSON, over the size limit, or failing the schema.
            InvalidArgument: a bad key, or the thread has 1000 schedules already.
            ThreadNotFound: the thread was deleted.
        """
        schedule, created = await self._rt.schedules.create(
            self, name, args, cron=cron, timezone=timezone, every=every, key=key
        )
        return ScheduleCreated(schedule, created)

    async def list_schedules(self) -> list[Schedule]:
        """The thread's recurring schedules, oldest first, with their args and counts."""
        return await self._rt.schedules.list(self.thread_id)

    async def get_schedule(self, schedule_id: str) -> Schedule:
        """One recurring schedule.

        Raises:
            ScheduleNotFound: no such schedule in this thread (or it was canceled).
        """
        return await self._rt.schedules.get(self.thread_id, schedule_id)

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        """Pause a recurring schedule: it creates no run until resumed (a no-op if paused).

        Its runs already stored are left as they are.

        Raises:
            ScheduleNotFound: no such schedule in this thread.
        """
        return await self._rt.schedules.pause(self.thread_id, schedule_id)

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        """Resume a paused schedule: its next fire time is the first one after now.

        The fire times it missed while paused are not made up (a no-op if active).

        Raises:
            ScheduleNotFound: no such schedule in this thread.
        """
        return await self._rt.schedules.resume(self.thread_id, schedule_id)

    async def cancel_schedule(self, schedule_id: str) -> Schedule:
        """Delete a recurring schedule; its runs stay (a pending one still runs).

        Returns:
            The schedule as it was.

        Raises:
            ScheduleNotFound: no such schedule in this thread (or canceled already).
        """
        return await self._rt.schedules.cancel(self.thread_id, schedule_id)

    async def schedule(
        self,
        name: str,
        args: Any = None,
        delay: float | timedelta = 0,
        *,
        key: str | None = None,
        at: datetime | None = None,
    ) -> Scheduled:
        """`schedule_effect`, saying whether a new run was stored.

        Returns:
            ``Scheduled(run_id, created)``: ``created`` is False when ``key`` was held by
            a pending or running run (whose id is ``run_id``; nothing was stored).

        Raises:
            The errors of `schedule_effect`.
        """
        return await self._rt.runs.schedule(self, name, args, delay, key=key, at=at)

    async def get_scheduled_effects(self, name: str | None = None) -> list[EffectRun]:
        """Runs that have not started yet, in due order, optionally of one effect name.

        ``name`` is matched as `schedule_effect` resolves it: in a package's scope a short
        name means the package's effect.
        """
        return await self._rt.runs.pending(self.thread_id, self._qualified(name))

    async def remove_scheduled_effect(self, run_id: str, *, canceled_by: str = "code") -> bool:
        """Cancel a pending run, or a running run of an async effect.

        A pending run becomes ``canceled`` at once. A running async run is canceled
        cooperatively: its effect gets `asyncio.CancelledError` at its next ``await`` and
        the run ends ``canceled`` (never re-queued); this waits up to 5 s for the effect
        to stop (an effect that swallows the cancellation ends as it ends). Either way
        the run keeps ``canceled_by`` and its ``finished_at`` says when.

        Args:
            run_id: The run.
            canceled_by: Who cancels it (stored with the run, shown in the pane), 1 to 256
                characters.

        Returns:
            True if the run was canceled (or, running, was asked to stop), by this call or
            by a concurrent one (on any node) that canceled it after this call was made;
            False for an unknown id, a run finished before this call, or a second cancel;
            False too for a running run whose effect code has returned or raised (its
            outcome, being recorded, stands).
            A canceled run stays in the history with status ``canceled``.

        Raises:
            RunStateError: the run is running a sync effect (a worker thread cannot be
                stopped); the message says so.
            InvalidArgument: ``canceled_by`` is not a string of 1 to 256 characters.
        """
        if canceled_by == "":
            raise InvalidArgument("canceled_by must not be empty")
        return await self._rt.runs.cancel(self.thread_id, run_id, canceled_by)

    async def list_runs(
        self,
        *,
        status: EffectStatus | str | list[EffectStatus | str] | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """The run history, newest first (by scheduling order), every status.

        Args:
            status: Only runs with this status (or any of these statuses).
            name: Only runs of this effect (qualified name for package effects; in a
                package's scope a short name means the package's effect).
            limit: Page size, 1 to 500.
            cursor: ``next_cursor`` of the previous page.

        Raises:
            ValueError: an unknown status, a bad limit or a malformed cursor.
        """
        return await self._rt.runs.list_runs(
            self.thread_id, status, self._qualified(name), limit, cursor
        )

    async def list_effect_records(
        self,
        *,
        status: EffectRecordStatus | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        """The thread's effect-tool records (docs/effect-tools.md), newest first.

        Args:
            status: Only records in this status (``in_progress``, ``applied``, or a durable
                turn's ``succeeded``, ``failed``, ``denied``).
            limit: Page size, 1 to 1000.
            cursor: ``next_cursor`` of the previous page.

        Returns:
            An `EffectRecordPage`: records (key, tool, status, result, run id, times) and
            the cursor of the next page (None on the last).

        Raises:
            ValueError: an unknown status, a bad limit or a malformed cursor.
        """
        if status is not None:
            try:
                status = EffectRecordStatus(status)
            except ValueError:
                known = ", ".join(s.value for s in EffectRecordStatus)
                raise ValueError(
                    f"Unknown effect record status {str(status)[:40]!r}; one of {known}"
                ) from None
        return await self._rt.effect_records.list(
            self.thread_id, status=status, limit=limit, cursor=cursor
        )

    async def get_effect_record(self, key: str) -> EffectRecord | None:
        """One effect-tool record of the thread by its effect key, result in full.

        Returns:
            The record, or None when the thread has none under ``key``.
        """
        return await self._rt.effect_records.get(self.thread_id, key)

    async def get_run(self, run_id: str) -> EffectRun:
        """One run, with its args.

        Raises:
            RunNotFound: no such run in this thread (or it was pruned).
        """
        return await self._rt.runs.get_run(self.thread_id, run_id)

    async def get_run_attempts(self, run_id: str) -> list[RunAttempt]:
        """Each attempt of a run, first first: when it started, when and how it ended.

        Raises:
            RunNotFound: no such run in this thread (or it was pruned).
        """
        return await self._rt.runs.attempts(self.thread_id, run_id)

    async def run_now(self, run_id: str) -> EffectRun:
        """Make a pending run due now; it starts as soon as the thread is free.

        Raises:
            RunNotFound: no such run.
            RunStateError: the run is not pending, or it waits behind the thread's
                running run (not of a concurrent effect; on a backend shared by nodes,
                whichever node runs it): the message names that run (``waitingFor``).
        """
        return await self._rt.runs.run_now(self.thread_id, run_id)

    async def replay(self, run_id: str, *, once: bool = False) -> str:
        """Schedule a new run with the same name and args as a finished run, due now.

        ``once``: only if no run replays ``run_id`` yet (checked in the thread's own
        transaction, so it holds across processes sharing a database); otherwise the
        first replay's id is returned and nothing is scheduled.

        Returns:
            The new run's id (its ``replay_of`` is ``run_id``).

        Raises:
            RunNotFound: no such run.
            RunStateError: the run has not finished (pending or running).
            EffectNotFound: the effect no longer exists.
            InvalidEffectArgs: the args no longer pass the effect's schema.
        """
        return await self._rt.runs.replay(self, run_id, once=once)

    def subscribe(self) -> Subscription:
        """Subscribe to this thread's events from now on, in order, on one ``seq``.

        Yields `EffectChanged` for each change of a run (never carrying its args) and
        `MessageCreated` for each message stored in the conversation (the user's, the
        model's, tool results and injected messages).
        """
        return self._rt.hub.subscribe(self.thread_id)

    # ----------------------------------------------------------- conversation
    # The conversation layer (runtime.conversation) registers itself with the runtime and
    # does the work; the core never imports it.

    async def get_messages(
        self,
        *,
        limit: int = 50,
        after: str | None = None,
        before: str | None = None,
        latest: bool = False,
    ) -> MessagePage:
        """A page of the thread's messages, oldest first; from the start unless told.

        Args:
            limit: Page size, 1 to 500.
            after: A message id: the page starts after it (``next_cursor`` of the previous
                page, or the last message a client has, to poll for new ones).
            before: A message id: the page ends right before it (``prev_cursor`` of the
                page after, to page back from the newest).
            latest: The newest ``limit`` messages (what a chat view shows first).

        Raises:
            ValueError: a bad limit, more than one of ``after``/``before``/``latest``, or
                a cursor that names no message of the thread.
            ThreadNotFound: the thread was deleted.
        """
        return await self._rt.conversation().get_messages(
            self, limit=limit, after=after, before=before, latest=latest
        )

    async def get_message(self, message_id: str) -> Message:
        """One message.

        Raises:
            MessageNotFound: no such message in this thread.
        """
        return await self._rt.conversation().get_message(self, message_id)

    async def inject_message(
        self, content: str, role: MessageRole | str = "assistant"
    ) -> Message:
        """Add a message to the conversation without running a turn (a reminder, a notice).

        Outside a turn (an effect, an endpoint, host code) it waits for a running turn of
        the thread to end and is stored at once. Inside a turn (a tool or hook) it is
        stored right after the turn's own messages. The agent's
        ``before_create_message`` / ``after_create_message`` hooks run for it.

        Args:
            content: The text (non-empty, at most 100,000 characters).
            role: ``"assistant"`` (default), ``"user"`` or ``"system"``.

        Returns:
            The message (``injected`` is True).

        Raises:
            ValueError: empty or too long content, or an unknown role (or ``"tool"``).
            ThreadNotFound: the thread was deleted.
        """
        return await self._rt.conversation().inject_message(self, content, role)

    async def send_message(self, content: str, *, run_id: str | None = None) -> TurnResult:
        """Send a user message and run one turn of the thread's agent; returns its answer.

        One turn at a time per thread: a message sent while a turn runs is refused. Every
        turn is durable (docs/durable-turns.md): its model responses and tool calls are
        journaled in the thread, so a turn interrupted by a crash resumes without running
        a finished tool call again.

        Args:
            content: The user's text (non-empty, at most 100,000 characters).
            run_id: The turn's run id (1-64 characters: letters, digits, ``_ - . :``);
                default: a new one. Sent again with the same content, it is the same turn:
                resumed if it was interrupted or failed, its stored answer if it finished
                (waiting for it if it runs now), never a second user message.

        Returns:
            The turn's run id, the reply and every message the turn stored.

        Raises:
            ValueError: empty or too long content.
            AgentNotFound: no agent serves the thread.
            TurnInProgress: another turn of this thread is running.
            TurnRunIdConflict: ``run_id`` names a turn of this thread with another message.
            ThreadPaused: the thread is paused (nothing is stored; resume it first).
            TurnFailed: the model or the agent loop failed (the user message stays stored).
            DatabaseUnavailable: the database server could not be reached during the turn
                (in a store call, the journal or a tool's own runtime call): the turn stays
                ``running`` and is resumed (HTTP 503); send it again with its run id to
                resume it now. A `ThreadStorageError` marked ``unavailable`` means the same.
            ThreadNotFound: the thread was deleted.
        """
        return await self._rt.conversation().send_message(self, content, run_id=run_id)
