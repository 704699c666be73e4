"""Turns: a user message to a thread, answered by its agent through pydantic-ai.

Life of a turn (`run_turn`, or ``await state.send_message(text)``)::

    the thread's turn slot is taken (one turn at a time: a second message raises
    TurnInProgress, HTTP 409) ─► the user message is stored (before/after_create_message
    hooks) ─► the history is rebuilt from the stored messages ─► pydantic-ai runs the
    agent: model requests (filter_messages hooks as a history processor), tool calls with
    the ThreadState as dependencies (after_tool_call_success/failure hooks) ─► the turn's
    new messages are stored, then messages injected during the turn ─► the slot is freed

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
import logging
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import trace

from runtime import hooks as _hooks
from runtime.agents import AgentApp, AgentDefinition
from runtime.errors import (
    MessageNotFound,
    ModelNotAvailable,
    TurnFailed,
    TurnInProgress,
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
"""``(thread_id, run_id)`` in code running inside a turn (tools, hooks, what they spawn), so
that code injecting into its own thread never waits for the turn it is part of."""


@dataclass
class ActiveTurn:
    """A running turn: its id, and messages injected by its own tools and hooks."""

    run_id: str
    injected: list[Message] = field(default_factory=list)


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    turn: ActiveTurn | None = None  # the turn holding or waiting for the lock


class TurnTracker:
    """Per runtime: which threads run a turn, and the pydantic-ai agents built so far."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self._agents: dict[int, Agent[ThreadState, str]] = {}
        self.model_override: Model | None = None  # see runtime.testing.override_model
        self.models: dict[str, Model] = {}  # model names resolved at startup (resolve_models)

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
                yield
        finally:
            if turn is not None:
                slot.turn = None
            slot.users -= 1
            if slot.users == 0:
                self._slots.pop(thread_id, None)

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
    async with rt.actors.writing(thread_id, created_at_ts) as actor:
        await rt.run_sync(actor.store.insert_messages, messages)
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


async def run_turn(state: ThreadState, content: str) -> TurnResult:
    """See `ThreadState.send_message`."""
    content = check_content(content)
    rt = state.runtime
    tid = state.thread_id
    app = rt.agents
    agent = app.agent(state.agent_id)
    run_id = _new_id()
    turn = ActiveTurn(run_id)
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
            return await _run_turn(state, content, agent, turn, plain)
    finally:
        _CURRENT_TURN.reset(token)


async def _run_turn(
    state: ThreadState,
    content: str,
    agent: AgentDefinition,
    turn: ActiveTurn,
    plain: ThreadState,
) -> TurnResult:
    rt = state.runtime
    tid = state.thread_id
    app = rt.agents
    run_id = turn.run_id
    before = app.hooks_for(agent.name, HookPoint.BEFORE_CREATE_MESSAGE)
    after = app.hooks_for(agent.name, HookPoint.AFTER_CREATE_MESSAGE)
    from pydantic_ai import capture_run_messages
    from pydantic_ai.messages import ModelResponse

    async with rt.turns.exclusive(tid, turn=turn):
        turn_state = plain.with_context(execution=Execution(run_id=run_id, step=0))
        user = message_from_model(
            tid, text_model_message(MessageRole.USER, content), id=_new_id(),
            created_at_ts=rt.clock.now(), run_id=run_id,
        )
        user = await _hooks.before_create_message(before, turn_state, user)
        await _store(rt, tid, [user])
        await _hooks.after_create_message(after, turn_state, user)

        stored = await _all_messages(plain)
        pydantic_agent = rt.turns.pydantic_agent(app, agent)
        failure: Exception | None = None
        with capture_run_messages() as captured:
            try:
                result = await pydantic_agent.run(
                    None,
                    message_history=history(stored),
                    deps=turn_state,
                    run_id=run_id,
                    model=resolve_model(rt, agent),
                )
            except Exception as exc:
                failure = exc
        if failure is None:
            new = result.new_messages()
        else:
            log.warning("turn %s of thread %s failed: %r", run_id, tid, failure)
            # Tool calls that completed are kept with their results, so the conversation
            # shows what they did (an effect they scheduled is not undone); the step the
            # model failed in is not. What tools and hooks injected is kept too.
            new = completed_steps(captured, run_id)
        steps = sum(1 for m in new if isinstance(m, ModelResponse))
        end_state = plain.with_context(execution=Execution(run_id=run_id, step=steps))
        created: list[Message] = []
        for model_message in new:
            message = message_from_model(
                tid, model_message, id=_new_id(), created_at_ts=rt.clock.now(), run_id=run_id
            )
            created.append(await _hooks.before_create_message(before, end_state, message))
        created.extend(turn.injected)
        await _store(rt, tid, created)
    # Outside the slot: a hook here may inject (it then waits for the slot like any caller).
    for message in created:
        await _hooks.after_create_message(after, end_state, message)
    if failure is not None:
        reason = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
        why = f"Turn {run_id} of thread {tid} failed: {reason}"
        raise TurnFailed(tid, run_id, why) from failure
    replies = [
        m for m in created if m.role is MessageRole.ASSISTANT and m.content and not m.injected
    ]
    return TurnResult(run_id, replies[-1] if replies else None, [user, *created])
