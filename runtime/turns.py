"""Turns: a user message to a thread, answered by its agent through pydantic-ai.

Life of a turn (`run_turn`, or ``await state.send_message(text)``)::

    the thread's turn slot is taken (one turn at a time: a second message raises
    TurnInProgress, HTTP 409) ─► the turn's row is stored (`TurnRow`, running, attempt 1)
    ─► the user message is stored (before/after_create_message hooks) ─► the history is
    rebuilt from the stored messages ─► pydantic-ai runs the agent through
    `runtime.durable.run_durable`, journaled in the thread's store: model requests
    (filter_messages hooks as a history processor), tool calls with the ThreadState as
    dependencies (after_tool_call_success/failure hooks) ─► the turn's new messages are
    stored, then messages injected during the turn ─► the row says succeeded or failed
    ─► the slot is freed

Every turn is durable (docs/durable-turns.md): a turn sent again with its run id answers
from the conversation if it finished, or resumes from its journal; at start, the runtime
resumes every turn an earlier process left running (`resume_turns`), at most
`MAX_ATTEMPTS` starts per turn.

Effects scheduled by tools or hooks run after the turn, on the thread's own schedule. They
are durable the moment ``schedule_effect`` returns: a turn that fails afterwards (the model
errs on a later step) does not undo them. A failed turn keeps the user message, the steps
whose tool calls completed (calls and results), and messages its tools and hooks injected.
`inject_message` outside a turn waits for a running turn to end, so the conversation is
never interleaved; inside the turn (from a tool or hook) the message is stored after the
turn's own messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from runtime import hooks as _hooks
from runtime.agents import AgentApp, AgentDefinition
from runtime.config import MAX_ATTEMPTS
from runtime.effects import iso
from runtime.errors import (
    DatabaseUnavailable,
    MessageNotFound,
    ModelNotAvailable,
    RuntimeClosed,
    ThreadNotFound,
    ThreadPaused,
    TurnFailed,
    TurnInProgress,
    TurnRunIdConflict,
    database_unreachable,
)
from runtime.hooks import HookPoint
from runtime.ids import new_id
from runtime.messages import (
    Message,
    MessagePage,
    MessageRole,
    TurnResult,
    check_content,
    history,
    message_from_model,
    text_model_message,
)
from runtime.telemetry import TRACER_NAME
from runtime.thread import Execution, ThreadState

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.models import Model

    from runtime.supervisor import Runtime

# pydantic-ai is imported where a turn needs it (runtime.agent_loop builds the agents), not
# here: this module is part of `import runtime`, and an app with effects only never loads
# pydantic-ai (tests/test_imports.py).

log = logging.getLogger("runtime.turns")

_MAX_PAGE = 500


_CURRENT_TURN: ContextVar[tuple[str, str] | None] = ContextVar("thread_effects_turn", default=None)
_TURN_FENCE: ContextVar[tuple[str, str] | None] = ContextVar("thread_effects_turn_fence",
                                                           default=None)
"""``(thread_id, token)`` of the turn lease the running turn holds (a shared backend): the
fencing token its writes carry (`ThreadStore.insert_messages`, `ThreadStore.set_meta`)."""


def _fence(thread_id: str) -> str | None:
    """The turn-lease token this task's turn holds on ``thread_id``, if any."""
    held = _TURN_FENCE.get()
    return held[1] if held is not None and held[0] == thread_id else None
"""``(thread_id, run_id)`` in code running inside a turn (tools, hooks, what they spawn), so
that code injecting into its own thread never waits for the turn it is part of."""


@dataclass
class ActiveTurn:
    """A running turn: its id, and messages injected by its own tools and hooks."""

    run_id: str
    injected: list[Message] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    content: str | None = None  # the user's message (None: a turn resumed at start)
    failure: TurnFailed | None = None  # how it failed, for posts that waited for it


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    turn: ActiveTurn | None = None  # the turn holding or waiting for the lock


TURN_LEASE_POLL_SECONDS = 0.2
"""How often a turn waiting for another node's turn on its thread asks again."""


class TurnTracker:
    """Per runtime: which threads run a turn, and the pydantic-ai agents built so far.

    With a backend shared by several processes (`shared`), a turn also holds its thread's
    turn lease in the store (`StorageBackend.take_turn_lease`) while it runs: one turn at
    a time per thread across nodes, a turn on another node waiting for it.
    """

    def __init__(self) -> None:
        self.shared: Runtime | None = None  # set at start when the backend is shared
        self._slots: dict[str, _Slot] = {}
        self._agents: dict[int, Agent[ThreadState, str]] = {}
        self.model_override: Model | None = None  # see runtime.testing.override_model
        self.models: dict[str, Model] = {}  # model names resolved at startup (resolve_models)
        self._resuming: asyncio.Task[int] | None = None
        # Tokens of the turn leases this node's turns hold or are taking (added before the
        # take): any other lease the store says this node holds lost its release.
        self._lease_tokens: set[str] = set()

    def start_resuming(self, rt: Runtime) -> None:
        """Resume, in the background, the turns an earlier process left running."""
        self._resuming = asyncio.create_task(resume_turns(rt), name="resume turns")

    async def stop_resuming(self) -> None:
        """Stop resuming turns (those not resumed yet are resumed at the next start)."""
        task, self._resuming = self._resuming, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(BaseException):
                await task

    def running(self, thread_id: str) -> ActiveTurn | None:
        """The turn the thread runs now, if any."""
        slot = self._slots.get(thread_id)
        return slot.turn if slot is not None else None

    @contextlib.asynccontextmanager
    async def exclusive(
        self, thread_id: str, *, turn: ActiveTurn | None = None
    ) -> AsyncIterator[None]:
        """Hold the thread's conversation: no turn runs and no message is stored meanwhile.

        Args:
            thread_id: The thread.
            turn: The turn taking the slot. A turn never waits for another turn; anything
                else (an injected message) waits for the slot.

        Raises:
            TurnInProgress: ``turn`` is given and another turn runs or waits.
        """
        slot = self._slots.setdefault(thread_id, _Slot())
        if turn is not None:
            if slot.turn is not None:
                raise TurnInProgress(thread_id)
            slot.turn = turn
        slot.users += 1
        try:
            async with slot.lock:
                rt = self.shared
                if turn is None or rt is None:
                    yield
                else:
                    token = uuid.uuid4().hex
                    self._lease_tokens.add(token)
                    try:
                        await self._take_lease(rt, thread_id, token)
                        # The turn's writes carry the token: refused once the lease moved.
                        fence = _TURN_FENCE.set((thread_id, token))
                        try:
                            yield
                        finally:
                            _TURN_FENCE.reset(fence)
                    finally:
                        # Also when the take failed or was cancelled: it may have committed.
                        # A release that fails (a cut connection) or is cancelled leaves a
                        # row no turn holds: `release_lost_turn_leases` gives it back.
                        self._lease_tokens.discard(token)
                        with contextlib.suppress(Exception):
                            await rt.run_sync(rt.storage.release_turn_lease, thread_id, token)
        finally:
            if turn is not None:
                slot.turn = None
            slot.users -= 1
            if slot.users == 0:
                self._slots.pop(thread_id, None)

    async def release_lost_turn_leases(self, rt: Runtime) -> list[str]:
        """Give back the turn leases this node holds for no turn of it; their threads.

        A lease's release can be lost (the connection cut as it was given back, or a take
        that committed while its caller was cancelled or cut). The row would make turns
        of its thread on every other node wait for as long as this node lives; the
        runtime calls this every third of the node lease.

        Raises:
            RuntimeStorageError: the backend failed (PostgreSQL: psycopg.Error).
        """
        held = await rt.run_sync(rt.storage.held_turn_leases)
        # A token listed was taken before the read; one no turn holds now never will again.
        lost = [(tid, token) for tid, token in held if token not in self._lease_tokens]
        for tid, token in lost:
            await rt.run_sync(rt.storage.release_turn_lease, tid, token)
        if lost:
            log.warning("gave back %d turn lease(s) held for no turn of this node, their "
                        "release lost (threads %s)", len(lost),
                        ", ".join(t for t, _ in lost[:10]))
        return [tid for tid, _ in lost]

    @staticmethod
    async def _take_lease(rt: Runtime, thread_id: str, token: str) -> None:
        """Wait until this node holds the thread's turn lease under ``token``."""
        said = False
        while True:
            holder = await rt.run_sync(rt.storage.take_turn_lease, thread_id, token)
            if holder is None:
                return
            if not said:
                log.info("thread %s: a turn runs on node %s; this one waits for it",
                         thread_id, holder)
                said = True
            await asyncio.sleep(TURN_LEASE_POLL_SECONDS)

    def pydantic_agent(self, app: AgentApp, agent: AgentDefinition) -> Agent[ThreadState, str]:
        """The pydantic-ai agent of a definition (built once, then reused)."""
        built = self._agents.get(id(agent))
        if built is None:
            from runtime.agent_loop import build_agent

            built = build_agent(app, agent)
            self._agents[id(agent)] = built
        return built


# ----------------------------------------------------------------- the agent loop


def resolve_model(rt: Runtime, agent: AgentDefinition) -> Model | str:
    """The model of a turn: a test's override, the agent's, the setting, or the demo model."""
    tracker: TurnTracker = rt.turns
    if tracker.model_override is not None:
        return tracker.model_override
    name = agent.model if agent.model is not None else rt.settings.model or None
    if isinstance(name, str):
        return tracker.models.get(name, name)
    if name is not None:
        return name
    from runtime.demo_model import demo_model  # only needed when nothing is configured

    return demo_model()


def resolve_models(app: AgentApp, setting: str | None) -> dict[str, Model]:
    """Resolve every model name the app's agents will use, so a bad one stops startup.

    Blocking (it may import a provider's package): call it in a worker thread.

    Args:
        app: The loaded agents (an agent's own ``model``, else the setting).
        setting: The runtime's ``model`` setting.

    Returns:
        Model name → pydantic-ai model, for `resolve_model`.

    Raises:
        ModelNotAvailable: a name pydantic-ai does not know, a provider whose package is
            not installed, or one that refuses to start (e.g. no API key), naming the
            model and where it was configured.
    """
    if not app.agents:
        return {}  # effects only: pydantic-ai is never imported
    # Import what turns need now, in this worker thread, rather than on the event loop
    # when the first turn runs.
    import pydantic_ai.models.function  # noqa: F401  (the demo model, runtime.demo_model)
    from pydantic_ai.models import infer_model

    import runtime.agent_loop  # noqa: F401

    wanted: dict[str, str] = {}
    for agent in app.agents.values():
        if isinstance(agent.model, str):
            wanted.setdefault(
                agent.model, f"agent {agent.name!r} ({app.files.get(f'agent:{agent.name}')})"
            )
        elif agent.model is None and setting:
            wanted.setdefault(
                setting, "the model setting (Runtime(model=...); the server's --model or "
                "THREAD_EFFECTS_MODEL)",
            )
    resolved: dict[str, Model] = {}
    for name, where in wanted.items():
        try:
            resolved[name] = infer_model(name)
        except Exception as exc:
            raise ModelNotAvailable(
                f"Model {name!r} of {where} cannot be used: {type(exc).__name__}: {exc}"
            ) from exc
    return resolved


def completed_steps(captured: list[ModelMessage], run_id: str) -> list[ModelMessage]:
    """The part of a failed run worth keeping: its steps up to the last complete tool results.

    Args:
        captured: The run's messages (pydantic-ai's ``capture_run_messages``): the history,
            then what the run added, each stamped with its run id.
        run_id: The failed turn's run id.

    Returns:
        The model responses with tool calls and the requests carrying all their results,
        in order, up to the last such pair; never the resumed user request, an
        interrupted message, or a step whose tool calls did not all return.
    """
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    mine = [m for m in captured if m.run_id == run_id]
    if mine and isinstance(mine[0], ModelRequest) and (
        any(isinstance(p, UserPromptPart) for p in mine[0].parts)
        or not any(isinstance(p, ToolReturnPart | RetryPromptPart) for p in mine[0].parts)
    ):
        mine = mine[1:]  # the user's message, which the turn stored before the run
    end = 0
    for i, message in enumerate(mine):
        if message.state == "interrupted":
            break
        if i == 0 or not isinstance(message, ModelRequest):
            continue
        previous = mine[i - 1]
        if not isinstance(previous, ModelResponse):
            continue
        calls = {p.tool_call_id for p in previous.parts if isinstance(p, ToolCallPart)}
        answered = {
            p.tool_call_id for p in message.parts
            if isinstance(p, ToolReturnPart | RetryPromptPart)
        }
        if calls and calls <= answered:
            end = i + 1
    return mine[:end]


# ------------------------------------------------------------------- messages


async def _store(
    rt: Runtime, thread_id: str, messages: list[Message], created_at_ts: float | None = None
) -> None:
    # ``created_at_ts``: the thread the caller's state belongs to; a state kept from a
    # deleted thread must not write into a new thread that reuses the id.
    fence = _fence(thread_id)
    async with rt.actors.writing(thread_id, created_at_ts) as actor:
        await rt.run_sync(partial(actor.store.insert_messages, fence=fence), messages)
        # Under the lock, so frames follow commit order; every stored message is a frame.
        for message in messages:
            rt.hub.publish_message(message)


def _new_id() -> str:
    return new_id()


async def get_messages(
    state: ThreadState,
    *,
    limit: int = 50,
    after: str | None = None,
    before: str | None = None,
    latest: bool = False,
) -> MessagePage:
    """See `ThreadState.get_messages`."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= _MAX_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {_MAX_PAGE}, got {limit!r}")
    if sum((after is not None, before is not None, bool(latest))) > 1:
        raise ValueError("give at most one of after, before and latest")
    rt = state.runtime
    async with rt.actors.use(state.thread_id) as actor:
        page = await rt.run_sync(
            lambda: actor.store.list_messages(
                limit=limit, after_id=after, before_id=before, latest=bool(latest)
            )
        )
    if page is None:
        cursor = after if after is not None else before
        raise ValueError(f"Invalid cursor {cursor!r}: no such message in thread {state.thread_id}")
    return MessagePage(page[0], page[1], page[2])


async def get_message(state: ThreadState, message_id: str) -> Message:
    """See `ThreadState.get_message`."""
    rt = state.runtime
    async with rt.actors.use(state.thread_id) as actor:
        message = await rt.run_sync(actor.store.get_message, str(message_id))
    if message is None:
        raise MessageNotFound(state.thread_id, str(message_id))
    return message


async def _all_messages(state: ThreadState) -> list[Message]:
    rt = state.runtime
    async with rt.actors.use(state.thread_id) as actor:
        messages: list[Message] = await rt.run_sync(actor.store.all_messages)
        return messages


async def inject_message(
    state: ThreadState, content: str, role: MessageRole | str = MessageRole.ASSISTANT
) -> Message:
    """See `ThreadState.inject_message`."""
    content = check_content(content)
    role = MessageRole(role)
    if role is MessageRole.TOOL:
        raise ValueError("inject_message: role must be assistant, user or system, not tool")
    rt = state.runtime
    tid = state.thread_id
    active = rt.turns.running(tid)
    inside = active is not None and (
        (state.execution is not None and state.execution.run_id == active.run_id)
        or _CURRENT_TURN.get() == (tid, active.run_id)
    )
    if inside:
        assert active is not None
        run_id: str | None = active.run_id
    else:
        run_id = state.execution.run_id if state.execution is not None else None
    before = rt.agents.hooks_for(state.agent_id, HookPoint.BEFORE_CREATE_MESSAGE)
    after = rt.agents.hooks_for(state.agent_id, HookPoint.AFTER_CREATE_MESSAGE)

    def build() -> Message:
        return message_from_model(
            tid, text_model_message(role, content), id=_new_id(),
            created_at_ts=rt.clock.now(), run_id=run_id, injected=True,
        )

    if inside:
        assert active is not None
        message = await _hooks.before_create_message(before, state, build())
        active.injected.append(message)  # stored, and after-hooks run, when the turn ends
        return message
    async with rt.turns.exclusive(tid):
        message = await _hooks.before_create_message(before, state, build())
        await _store(rt, tid, [message], state.info.created_at_ts)
    await _hooks.after_create_message(after, state, message)
    return message


# ------------------------------------------------------------------ turn rows


TURNS_META = "turns"
"""The thread-store meta key (`ThreadStore.set_meta`) holding the thread's turn rows."""

KEEP_FINISHED_TURNS = 100
"""Finished turn rows kept per thread (the newest), to answer a repeated ``run_id``."""

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class TurnStatus(StrEnum):
    """Where a turn is.

    ``running`` (an interrupted turn stays running until it is resumed at the next
    start), ``succeeded`` or ``failed``.
    """

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass
class TurnRow:
    """A turn of a thread, kept in the thread's store.

    Attributes:
        run_id: The turn's run id.
        content: The user's message as sent (before ``before_create_message`` hooks),
            kept while the turn may run again (running, failed); ``""`` once it succeeded.
        content_hash: The sha256 of the message as sent (a repeated ``run_id`` must come
            with the same message).
        status: Running (an interrupted turn stays running until resumed), succeeded or
            failed.
        attempts: How many times the turn started (1, then one more per resume).
        error: Why it failed; on a running turn, set when the database stopped its last
            attempt (`STOPPED_BY_DATABASE`: that attempt does not count toward
            `MAX_ATTEMPTS`).
        started_at: When it was first started (seconds since the epoch, UTC).
        updated_at: When its row last changed (seconds since the epoch, UTC).
    """

    run_id: str
    content: str
    status: TurnStatus
    attempts: int
    error: str | None
    started_at: float
    updated_at: float
    content_hash: str = ""

    def __post_init__(self) -> None:
        if not self.content_hash:
            self.content_hash = content_hash(self.content)

    def to_json(self) -> dict[str, Any]:
        """The wire form (``GET /api/threads/{tid}/turns``; instants as ISO 8601 UTC)."""
        return {
            "runId": self.run_id,
            "status": str(self.status),
            "attempts": self.attempts,
            "resumed": self.attempts > 1,
            "error": self.error,
            "startedAt": iso(self.started_at),
            "updatedAt": iso(self.updated_at),
        }

    def stored(self) -> dict[str, Any]:
        """The form kept in the thread's store (instants as seconds since the epoch)."""
        keep = self.status is not TurnStatus.SUCCEEDED
        return {
            "content": self.content if keep else "", "contentHash": self.content_hash,
            "status": str(self.status), "attempts": self.attempts, "error": self.error,
            "startedAt": self.started_at, "updatedAt": self.updated_at,
        }


def content_hash(content: str) -> str:
    """The sha256 (hex) of a message's text, as `TurnRow` keeps it."""
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()


def check_run_id(run_id: object) -> str:
    """A turn's run id as given by a client.

    Raises:
        ValueError: not 1-64 characters of letters, digits, ``_ - . :``.
    """
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise ValueError(
            f"run_id must be 1-64 characters of letters, digits, '_', '-', '.' or ':', "
            f"got {run_id!r}"
        )
    return run_id


async def load_turns(rt: Runtime, thread_id: str) -> dict[str, TurnRow]:
    """The thread's turn rows by run id, least recently changed first.

    Raises:
        ThreadNotFound: no such thread.
    """
    async with rt.actors.use(thread_id) as actor:
        raw = await rt.run_sync(actor.store.get_meta, TURNS_META)
    rows: dict[str, TurnRow] = {}
    for run_id, data in (json.loads(raw) if raw else {}).items():
        rows[run_id] = TurnRow(
            run_id, data["content"], TurnStatus(data["status"]), int(data["attempts"]),
            data.get("error"), float(data["startedAt"]), float(data["updatedAt"]),
            data.get("contentHash", ""),
        )
    return rows


async def _save_turn(rt: Runtime, thread_id: str, row: TurnRow,
                     created_at_ts: float | None = None) -> None:
    # Turn rows change only inside the thread's turn slot, so read-modify-write is safe.
    rows = await load_turns(rt, thread_id)
    rows.pop(row.run_id, None)
    rows[row.run_id] = row
    finished = [r for r in rows.values() if r.status is not TurnStatus.RUNNING]
    for old in finished[: max(0, len(finished) - KEEP_FINISHED_TURNS)]:
        del rows[old.run_id]
    text = json.dumps({r.run_id: r.stored() for r in rows.values()})
    fence = _fence(thread_id)
    async with rt.actors.writing(thread_id, created_at_ts) as actor:
        await rt.run_sync(partial(actor.store.set_meta, fence=fence), TURNS_META, text)


async def _undo_turn(rt: Runtime, thread_id: str, run_id: str, prior: TurnRow | None) -> None:
    """Put the turn's row back as it was (gone if it was new); logged if that fails too."""
    try:
        rows = await load_turns(rt, thread_id)
        if prior is None:
            rows.pop(run_id, None)
        else:
            rows[run_id] = prior
        text = json.dumps({r.run_id: r.stored() for r in rows.values()})
        fence = _fence(thread_id)
        async with rt.actors.writing(thread_id) as actor:
            await rt.run_sync(partial(actor.store.set_meta, fence=fence), TURNS_META, text)
    except Exception as exc:
        log.error("turn %s of thread %s: its message was not stored and its turn row "
                  "could not be removed either (it is resumed at the next start): %s",
                  run_id, thread_id, exc)


# ------------------------------------------------------------------- the turn


async def run_turn(
    state: ThreadState, content: str, *, run_id: str | None = None
) -> TurnResult:
    """See `ThreadState.send_message`."""
    content = check_content(content)
    rt = state.runtime
    tid = state.thread_id
    app = rt.agents
    agent = app.agent(state.agent_id)
    fresh = run_id is None
    if run_id is None:
        run_id = _new_id()
    else:
        run_id = check_run_id(run_id)
        # The client lost the answer of a turn that still runs (or posted it twice at
        # once): wait for its end, then answer as it did. Several posts may wait; the
        # first to wake takes the slot to read the stored answer, the others wait again.
        while (running := rt.turns.running(tid)) is not None and running.run_id == run_id:
            await running.ended.wait()
            if running.failure is not None and running.content == content:
                raise running.failure
    turn = ActiveTurn(run_id, content=content)
    plain = state.with_context(execution=None, package_id=state.package_id)
    token = _CURRENT_TURN.set((tid, run_id))
    try:
        # The turn's span: its tool calls' spans, and effects they schedule, are below it.
        with trace.get_tracer(TRACER_NAME).start_as_current_span(
            "turn",
            attributes={
                "thread_effects.thread_id": tid,
                "thread_effects.turn_id": run_id,
                "thread_effects.agent": agent.name,
            },
        ):
            return await _run_turn(state, content, agent, turn, plain, fresh=fresh)
    except TurnFailed as exc:
        turn.failure = exc
        raise
    finally:
        _CURRENT_TURN.reset(token)
        turn.ended.set()


def _answer(run_id: str, messages: list[Message]) -> TurnResult:
    replies = [
        m for m in messages
        if m.role is MessageRole.ASSISTANT and m.content and not m.injected
    ]
    return TurnResult(run_id, replies[-1] if replies else None, messages)


def _user_index(stored: list[Message], run_id: str) -> int | None:
    for i, message in enumerate(stored):
        if message.run_id == run_id and message.role is MessageRole.USER and not message.injected:
            return i
    return None


async def _run_turn(
    state: ThreadState,
    content: str,
    agent: AgentDefinition,
    turn: ActiveTurn,
    plain: ThreadState,
    *,
    fresh: bool,
) -> TurnResult:
    rt = state.runtime
    tid = state.thread_id
    app = rt.agents
    run_id = turn.run_id
    before = app.hooks_for(agent.name, HookPoint.BEFORE_CREATE_MESSAGE)
    after = app.hooks_for(agent.name, HookPoint.AFTER_CREATE_MESSAGE)
    from pydantic_ai import capture_run_messages
    from pydantic_ai.messages import ModelResponse

    from runtime.durable import Journal, run_durable

    async with rt.turns.exclusive(tid, turn=turn):
        turn_state = plain.with_context(execution=Execution(run_id=run_id, step=0))
        stored = await _all_messages(plain)
        row = None if fresh else (await load_turns(rt, tid)).get(run_id)
        index = None if fresh else _user_index(stored, run_id)
        if row is not None and row.content_hash != content_hash(content):
            raise TurnRunIdConflict(tid, run_id)
        if (row is not None and row.status is TurnStatus.SUCCEEDED) or (
            row is None and index is not None
        ):
            # A finished turn: its stored answer, nothing runs again.
            return _answer(run_id, [m for m in stored if m.run_id == run_id])
        now = rt.clock.now()
        prior = row
        if row is None:
            row = TurnRow(run_id, content, TurnStatus.RUNNING, 1, None, now, now)
        else:
            row = replace(row, status=TurnStatus.RUNNING, attempts=row.attempts + 1,
                          error=None, updated_at=now)
        # The row first: a crash from here on leaves a turn to resume at the next start.
        await _save_turn(rt, tid, row, state.info.created_at_ts)
        if index is None:
            user = message_from_model(
                tid, text_model_message(MessageRole.USER, content), id=_new_id(),
                created_at_ts=rt.clock.now(), run_id=run_id,
            )
            user = await _hooks.before_create_message(before, turn_state, user)
            try:
                await _store(rt, tid, [user])
            except Exception:
                # The message was not stored: neither is its turn (no turn to resume).
                await _undo_turn(rt, tid, run_id, prior)
                raise
            await _hooks.after_create_message(after, turn_state, user)
            stored.append(user)
            index = len(stored) - 1
        user = stored[index]
        # A resumed turn sees the history its first attempt saw; what an earlier attempt
        # stored of its steps (a failed turn keeps its completed steps) is not stored again.
        earlier = [
            m for m in stored[index + 1:]
            if m.run_id == run_id and not m.injected and m.role is not MessageRole.USER
        ]
        pydantic_agent = rt.turns.pydantic_agent(app, agent)
        journal = Journal(rt.effect_records.journal(), thread_id=tid,
                          cross_run_store=rt.runtime_records)
        failure: Exception | None = None
        unreachable = False
        replayed: set[str] = set()
        with capture_run_messages() as captured:
            try:
                result = await run_durable(
                    pydantic_agent,
                    None,
                    run_id=run_id,
                    journal=journal,
                    on_replay=lambda call_id, _event: replayed.add(call_id),
                    message_history=history(stored[: index + 1]),
                    deps=turn_state,
                    model=resolve_model(rt, agent),
                )
            except Exception as exc:
                failure = exc
        if failure is None:
            new = result.new_messages()
        elif unreachable := database_unreachable(failure):
            log.warning("turn %s of thread %s stopped, the database cannot be reached (it "
                        "is resumed): %r", run_id, tid, failure)
            # Interrupted, not failed: like a crash, the attempt leaves the user message (and
            # what tools injected); its steps are stored by the attempt that ends it, so the
            # next turn's history holds no tool result without its answer.
            new = []
        else:
            log.warning("turn %s of thread %s failed: %r", run_id, tid, failure)
            # Tool calls that completed are kept with their results, so the conversation
            # shows what they did (an effect they scheduled is not undone); the step the
            # model failed in is not. What tools and hooks injected is kept too.
            new = completed_steps(captured, run_id)
        steps = sum(1 for m in new if isinstance(m, ModelResponse))
        end_state = plain.with_context(execution=Execution(run_id=run_id, step=steps))
        created: list[Message] = []
        for model_message in new[len(earlier):]:
            message = message_from_model(
                tid, model_message, id=_new_id(), created_at_ts=rt.clock.now(), run_id=run_id,
                replayed=replayed,
            )
            created.append(await _hooks.before_create_message(before, end_state, message))
        created.extend(turn.injected)
        await _store(rt, tid, created)
        # The database failing the turn (wherever it surfaced: a store call, the journal,
        # a tool) is no failure of the turn: its row stays running, to be resumed.
        if failure is None:
            row = replace(row, status=TurnStatus.SUCCEEDED, updated_at=rt.clock.now())
            await _save_turn(rt, tid, row)
        elif not unreachable:
            row = replace(row, status=TurnStatus.FAILED, error=_reason(failure),
                          updated_at=rt.clock.now())
            await _save_turn(rt, tid, row)
        else:
            # Marked so that the resume does not count it as an interruption (several
            # blinks must not fail the turn); if the database is still gone, it counts.
            try:
                await _save_turn(rt, tid, replace(row, error=STOPPED_BY_DATABASE,
                                                  updated_at=rt.clock.now()))
            except Exception as exc:
                log.info("turn %s of thread %s: its stop could not be marked: %s",
                         run_id, tid, exc)
    # Outside the slot: a hook here may inject (it then waits for the slot like any caller).
    for message in created:
        await _hooks.after_create_message(after, end_state, message)
    if failure is not None and unreachable:
        raise DatabaseUnavailable(
            f"Turn {run_id} of thread {tid} stopped: the database cannot be reached "
            f"({_reason(failure)}); it is resumed (tool calls that finished are not run "
            f"again), or post the same content with run_id {run_id!r}"
        ) from failure
    if failure is not None:
        why = (f"Turn {run_id} of thread {tid} failed: {_reason(failure)}; post the same "
               f"content with run_id {run_id!r} to retry it (tool calls that finished are "
               f"not run again)")
        raise TurnFailed(tid, run_id, why) from failure
    return _answer(run_id, [user, *earlier, *created])


STOPPED_BY_DATABASE = "stopped: the database could not be reached (it is resumed)"
"""The error of a running turn whose last attempt the database stopped (`TurnRow.error`)."""


def _reason(failure: BaseException) -> str:
    return f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__


# --------------------------------------------------------- resuming at start


def interrupted_text(attempts: int) -> str:
    """The message a turn stopped after ``attempts`` interruptions leaves in the thread."""
    return (
        f"This turn was interrupted {attempts} times (the server stopped or crashed while "
        f"it ran) and was stopped. To retry it, send the message again under its run id "
        f"(the pane's Retry, or POST .../messages with the same content and run_id): tool "
        f"calls that finished are not run again."
    )


async def _fail_interrupted(state: ThreadState, row: TurnRow) -> None:
    rt = state.runtime
    tid = state.thread_id
    turn = ActiveTurn(row.run_id)
    try:
        async with rt.turns.exclusive(tid, turn=turn):
            message = message_from_model(
                tid, text_model_message(MessageRole.ASSISTANT, interrupted_text(row.attempts)),
                id=_new_id(), created_at_ts=rt.clock.now(), run_id=row.run_id, injected=True,
            )
            await _store(rt, tid, [message])
            failed = replace(row, status=TurnStatus.FAILED, updated_at=rt.clock.now(),
                             error=f"interrupted {row.attempts} times")
            await _save_turn(rt, tid, failed)
    finally:
        turn.ended.set()


async def resume_thread_turns(rt: Runtime, thread_id: str) -> int:
    """Resume the turns of a thread left running by an earlier process.

    A turn that already started `MAX_ATTEMPTS` times (not counting the last attempt if the
    database stopped it: `STOPPED_BY_DATABASE`) fails instead, with a message in the
    conversation saying so (`interrupted_text`). On a backend shared by several nodes, a
    turn whose thread's turn lease another live node holds is that node's: left alone.

    Returns:
        How many turns were resumed or failed.
    """
    interrupted = [
        r.run_id for r in (await load_turns(rt, thread_id)).values()
        if r.status is TurnStatus.RUNNING
    ]
    state: ThreadState | None = None
    done = 0
    for run_id in interrupted:
        while True:
            active = rt.turns.running(thread_id)
            if active is not None:
                # A client's turn (maybe this one, sent again with its run id): after it.
                await active.ended.wait()
                continue
            row = (await load_turns(rt, thread_id)).get(run_id)
            if row is None or row.status is not TurnStatus.RUNNING:
                break  # a client resumed it meanwhile
            if rt.turns.shared is not None and await _runs_elsewhere(rt, thread_id):
                break  # a live node runs it (if that node dies, its orphans are resumed)
            if state is None:
                state = await rt.get_thread(thread_id)
            try:
                if row.attempts >= MAX_ATTEMPTS and row.error != STOPPED_BY_DATABASE:
                    log.warning("turn %s of thread %s was interrupted %d times: failing it",
                                run_id, thread_id, row.attempts)
                    await _fail_interrupted(state, row)
                else:
                    log.info("resuming turn %s of thread %s (attempt %d)", run_id, thread_id,
                             row.attempts + 1)
                    # Through the conversation's own path, like a client's turn: a paused
                    # thread refuses it, a shutdown waits for it, a delete cancels it.
                    await state.send_message(row.content, run_id=run_id)
            except TurnInProgress:
                continue  # another turn took the thread first: wait for it
            except ThreadPaused:
                log.info("turn %s of thread %s is not resumed: the thread is paused (it is "
                         "resumed at a start once the thread is resumed, or when its message "
                         "is sent again with its run_id)", run_id, thread_id)
                break
            except TurnFailed as exc:
                log.warning("resumed turn %s of thread %s: %s", run_id, thread_id, exc)
            done += 1
            break
    return done


async def drop_orphaned_turn_lease(rt: Runtime, thread_id: str) -> None:
    """Drop the thread's turn lease if no live node holds it (a deleted thread's orphan)."""
    await _runs_elsewhere(rt, thread_id)  # takes the free lease, then gives it back


async def _runs_elsewhere(rt: Runtime, thread_id: str) -> bool:
    """Whether another live node holds the thread's turn lease (a shared backend)."""
    probe = uuid.uuid4().hex
    holder = await rt.run_sync(rt.storage.take_turn_lease, thread_id, probe)
    if holder is not None:
        return True
    await rt.run_sync(rt.storage.release_turn_lease, thread_id, probe)
    return False


async def resume_turns(rt: Runtime, *, concurrency: int = 8) -> int:
    """Resume every thread's interrupted turns (the runtime does it at start).

    Opens every thread's store in turn to read its turn rows; runs at most
    ``concurrency`` turns at once.

    Returns:
        How many turns were resumed or failed.
    """
    limit = asyncio.Semaphore(concurrency)
    count = 0

    async def one(thread_id: str) -> None:
        nonlocal count
        async with limit:
            try:
                count += await resume_thread_turns(rt, thread_id)
            except (ThreadNotFound, RuntimeClosed):
                pass
            except Exception:
                log.exception("could not resume the turns of thread %s", thread_id)

    async with asyncio.TaskGroup() as group:
        cursor: str | None = None
        while True:
            page = await rt.list_threads(limit=_MAX_PAGE, cursor=cursor)
            for thread in page.threads:
                await limit.acquire()  # do not read ahead of the running turns
                limit.release()
                group.create_task(one(thread.id))
            cursor = page.next_cursor
            if cursor is None:
                break
    return count
