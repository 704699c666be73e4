"""The conversation layer, as an extension of the runtime: agents, tools, hooks and turns.

`ConversationExtension` loads the app's ``agents/``, ``tools/`` and ``hooks/`` when the
runtime starts, resolves the models they use (a bad one stops startup), chooses a new
thread's agent, runs the ``after_thread_created`` hooks, and serves `ThreadState`'s
conversation methods (`runtime.turns` holds that logic). It exposes ``rt.agents`` (the
`runtime.agents.AgentApp`) and ``rt.turns`` (the `runtime.turns.TurnTracker`).

Importing this module registers it as a default extension (`runtime.extension`), and
``import runtime`` imports it: every ``Runtime()`` built without ``extensions=`` has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from runtime import hooks as _hooks
from runtime import turns
from runtime.agents import AgentApp, load_agent_app
from runtime.errors import (
    RuntimeClosed,
    RuntimeStorageError,
    ThreadNotFound,
    ThreadPaused,
    ThreadStorageError,
    TurnLeaseLost,
)
from runtime.executor import IN_EFFECT
from runtime.extension import Extension, register_default_extension
from runtime.outage import OutageLog

if TYPE_CHECKING:
    from runtime.messages import Message, MessagePage, MessageRole, TurnResult
    from runtime.supervisor import Runtime
    from runtime.thread import ThreadState

log = logging.getLogger("runtime")


class ConversationExtension(Extension):
    """Agents, tools, hooks and turns for a runtime (see the module docstring)."""

    name = "conversation"

    def __init__(self) -> None:
        self.agents = AgentApp()  # filled at start from the app folder
        self.turns = turns.TurnTracker()
        self._running_turns = 0
        self._turns_idle = asyncio.Event()  # set while no turn runs (see `drain`)
        self._turns_idle.set()
        self._turn_tasks: dict[str, set[asyncio.Task[TurnResult]]] = {}
        self._deleted_turns: set[asyncio.Task[TurnResult]] = set()
        # Turns stopped because this node's lease lapsed, and their threads: resumed by
        # another node, or here once this node holds its lease again.
        self._lease_lost_turns: set[asyncio.Task[TurnResult]] = set()
        self._stopped_threads: set[str] = set()
        self._orphan_turns: asyncio.Task[None] | None = None

    async def start(self, runtime: Runtime) -> None:
        """Load the app's agents, tools and hooks, and resolve their models.

        Raises:
            AgentDefinitionError: an agent, tool or hook file is invalid (names the file).
            ModelNotAvailable: a model an agent would use cannot be resolved.
        """
        self.agents = await runtime.run_sync(load_agent_app, runtime.settings.app_dir)
        # A model that cannot be used stops startup, rather than failing every turn.
        self.turns.models = await runtime.run_sync(
            turns.resolve_models, self.agents, runtime.settings.model
        )

    def agent_for_new_thread(self, agent_id: str | None) -> str | None:
        """The app's agent for a new thread (see `runtime.agents.AgentApp`)."""
        return self.agents.agent_for_new_thread(agent_id)

    async def thread_created(self, state: ThreadState) -> None:
        """Run the agent's ``after_thread_created`` hooks (one that raises is logged)."""
        await _hooks.after_thread_created(
            self.agents.hooks_for(state.agent_id, _hooks.HookPoint.AFTER_THREAD_CREATED), state
        )

    def conversation(self) -> ConversationExtension:
        """Itself: it implements `runtime.extension.Conversation`."""
        return self

    def attributes(self) -> dict[str, Any]:
        """``agents`` and ``turns``."""
        return {"agents": self.agents, "turns": self.turns}

    async def get_messages(
        self,
        state: ThreadState,
        *,
        limit: int,
        after: str | None,
        before: str | None,
        latest: bool,
    ) -> MessagePage:
        """See `ThreadState.get_messages`."""
        return await turns.get_messages(
            state, limit=limit, after=after, before=before, latest=latest
        )

    async def get_message(self, state: ThreadState, message_id: str) -> Message:
        """See `ThreadState.get_message`."""
        return await turns.get_message(state, message_id)

    async def inject_message(
        self, state: ThreadState, content: str, role: MessageRole | str
    ) -> Message:
        """See `ThreadState.inject_message`."""
        return await turns.inject_message(state, content, role)

    async def send_message(
        self, state: ThreadState, content: str, *, run_id: str | None = None
    ) -> TurnResult:
        """See `ThreadState.send_message` (resumed turns come this way too).

        A paused thread runs no turn (`ThreadPaused`); a shutting-down runtime starts no
        turn from outside an effect (`RuntimeClosed`), but a turn already running keeps
        being served through the shutdown's grace period (`drain` waits for it).
        """
        rt = state.runtime
        if rt.shutting_down and not IN_EFFECT.get():
            raise RuntimeClosed("The runtime is shutting down: it starts no new turn "
                                "(send the message again once it is back)",
                                shutting_down=True)
        # Counted from here, so a shutdown beginning meanwhile waits for this turn.
        self._running_turns += 1
        self._turns_idle.clear()
        try:
            async with rt.actors.use(state.thread_id) as actor:
                paused = actor.info.paused
            if paused:
                raise ThreadPaused(state.thread_id)
            return await self._run_turn_task(state, content, run_id)
        finally:
            self._running_turns -= 1
            if self._running_turns == 0:
                self._turns_idle.set()

    async def _run_turn_task(
        self, state: ThreadState, content: str, run_id: str | None
    ) -> TurnResult:
        tid = state.thread_id
        # The turn runs in its own task, so deleting the thread can cancel it alone.
        task = asyncio.create_task(turns.run_turn(state, content, run_id=run_id),
                                   name=f"turn of {tid}")
        # Its outcome is read here; one that ends after its caller gave up is not "lost".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._turn_tasks.setdefault(tid, set()).add(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task in self._deleted_turns:
                self._deleted_turns.discard(task)
                raise ThreadNotFound(tid) from None  # deleted during its turn
            if task in self._lease_lost_turns:
                self._lease_lost_turns.discard(task)
                raise TurnLeaseLost(tid) from None  # another node resumes it
            # The caller gave up: so does its turn, which ends before the caller does (a
            # message sent next must not find it still running).
            task.cancel()
            await asyncio.wait([task])
            raise
        except TurnLeaseLost:
            if await _deleted(state):
                # The deletion dropped the turn lease, refusing the turn's writes.
                raise ThreadNotFound(tid) from None
            if self.turns.shared is not None:
                self._stopped_threads.add(tid)  # see below
            raise
        except (ThreadStorageError, RuntimeStorageError):
            # The database failed the turn (a cut connection: HTTP 503), maybe after its row
            # said running: resumed within a third of the node lease (a no-op if it was not).
            if self.turns.shared is not None:
                self._stopped_threads.add(tid)
            raise
        finally:
            tasks = self._turn_tasks.get(tid)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._turn_tasks[tid]

    async def serving(self, runtime: Runtime) -> None:
        """Resume the turns an earlier process left running (`runtime.turns.resume_turns`).

        With a backend shared by several nodes, turns take their thread's turn lease, and
        the turns of nodes whose lease expired are resumed here, every third of the lease.
        """
        if not runtime.storage.exclusive:
            self.turns.shared = runtime
        if self.agents.agents:
            self.turns.start_resuming(runtime)
            if not runtime.storage.exclusive:
                self._orphan_turns = asyncio.create_task(
                    self._resume_orphaned_turns(runtime), name="thread-effects-orphan-turns")

    async def _resume_orphaned_turns(self, runtime: Runtime) -> None:
        period = getattr(runtime.storage, "lease_seconds", 30.0) / 3
        resuming: dict[str, asyncio.Task[int]] = {}
        failures = OutageLog(log, "looking for turns of dead nodes")
        while True:
            await asyncio.sleep(period)
            if runtime.storage.lock_problem() is not None or runtime.shutting_down:
                continue
            for thread_id in [t for t, task in resuming.items() if task.done()]:
                task = resuming.pop(thread_id)
                if not task.cancelled() and task.exception() is not None:
                    log.error("could not resume the turns of thread %s: %s", thread_id,
                              task.exception())
            try:
                await self.turns.release_lost_turn_leases(runtime)
                orphaned = await runtime.run_sync(runtime.storage.orphaned_turns)
            except Exception as exc:
                failures.failed(exc)
                continue
            failures.ok()
            # The turns this node stopped when its lease lapsed or a write of theirs failed,
            # unless another node resumed them meanwhile (`resume_thread_turns` leaves
            # those alone, and those no longer running).
            stopped = sorted(self._stopped_threads - set(orphaned))
            self._stopped_threads.clear()
            for thread_id in [*orphaned, *stopped]:
                if thread_id in resuming:
                    continue
                if thread_id in orphaned:
                    log.warning("thread %s: resuming the turn of a node whose lease expired",
                                thread_id)
                resuming[thread_id] = asyncio.create_task(
                    self._resume_thread(runtime, thread_id), name=f"resume-turns-{thread_id}")

    async def _resume_thread(self, runtime: Runtime, thread_id: str) -> int:
        try:
            return await turns.resume_thread_turns(runtime, thread_id)
        except ThreadNotFound:
            # Deleted (its turn lease row left by a take racing the deletion): no turn to
            # resume; the row goes, quietly.
            await turns.drop_orphaned_turn_lease(runtime, thread_id)
            return 0
        except (ThreadStorageError, RuntimeStorageError):
            self._stopped_threads.add(thread_id)  # the database failed: tried again later
            raise

    def lease_lost(self, runtime: Runtime, why: str) -> None:
        """Stop every running turn: once the node lease expired, other nodes resume them.

        Their writes would be refused anyway (the turn lease's token fences them,
        `runtime.errors.TurnLeaseLost`); stopping them spares the model calls and tools.
        A caller waiting for such a turn gets `TurnLeaseLost`.
        """
        stopped = [(tid, task) for tid, tasks in self._turn_tasks.items() for task in tasks
                   if not task.done()]
        for tid, task in stopped:
            self._lease_lost_turns.add(task)
            self._stopped_threads.add(tid)
            task.cancel()
        if stopped:
            log.error("node lease lost (%s): stopped %d running turn(s) (threads %s); another "
                      "node resumes them (or this one, once it holds its lease again)", why,
                      len(stopped), ", ".join(sorted({t for t, _ in stopped})[:10]))

    async def thread_deleting(self, runtime: Runtime, thread_id: str) -> None:
        """Cancel the thread's running turn and wait for it to end (its tools included)."""
        tasks = list(self._turn_tasks.get(thread_id, ()))
        for task in tasks:
            self._deleted_turns.add(task)
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def drain(self, runtime: Runtime, grace_seconds: float) -> None:
        """Wait for running turns (their tools and hooks) to end: the shutdown's grace.

        Turns being resumed are waited for too; no further one is resumed (a turn not
        resumed yet is resumed at the next start).
        """
        await self._turns_idle.wait()

    async def close(self, runtime: Runtime) -> None:
        """Stop resuming turns (a turn stopped here is resumed at the next start)."""
        task, self._orphan_turns = self._orphan_turns, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self.turns.stop_resuming()


async def _deleted(state: ThreadState) -> bool:
    """Whether the thread is deleted (or its id taken by a thread created since)."""
    try:
        info = await state.runtime.actors.info(state.thread_id)
    except ThreadNotFound:
        return True
    except Exception:
        return False  # the database cannot say: the caller's error stands
    return info.created_at_ts != state.info.created_at_ts


register_default_extension(ConversationExtension)
