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

from typing import TYPE_CHECKING, Any

from runtime import hooks as _hooks
from runtime import turns
from runtime.agents import AgentApp, load_agent_app
from runtime.extension import Extension, register_default_extension

if TYPE_CHECKING:
    from runtime.messages import Message, MessagePage, MessageRole, TurnResult
    from runtime.supervisor import Runtime
    from runtime.thread import ThreadState


class ConversationExtension(Extension):
    """Agents, tools, hooks and turns for a runtime (see the module docstring)."""

    name = "conversation"

    def __init__(self) -> None:
        self.agents = AgentApp()  # filled at start from the app folder
        self.turns = turns.TurnTracker()

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
        """See `ThreadState.send_message`."""
        return await turns.run_turn(state, content, run_id=run_id)

    async def serving(self, runtime: Runtime) -> None:
        """Resume the turns an earlier process left running (`runtime.turns.resume_turns`)."""
        if self.agents.agents:
            self.turns.start_resuming(runtime)

    async def close(self, runtime: Runtime) -> None:
        """Stop resuming turns (a turn stopped here is resumed at the next start)."""
        await self.turns.stop_resuming()


register_default_extension(ConversationExtension)
