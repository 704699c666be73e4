"""The extension point: how layers above the core plug into a `runtime.Runtime`.

The core (threads, actors, dispatcher, executor, runs, `Runtime`) never imports the
conversation layer (agents, tools, hooks, turns). That layer is an `Extension`: the
runtime calls it at start, before a thread is created (to choose its agent), after a
thread is created (its hooks), and `ThreadState`'s conversation methods go to the
`Conversation` it provides. An extension may also expose attributes on the runtime
(``rt.agents``, ``rt.turns`` for the conversation layer) through `Extension.attributes`.

Wiring: ``Runtime(extensions=[...])`` takes them explicitly; ``Runtime()`` (no
``extensions``) uses the *default extensions*, registered with
`register_default_extension`. ``import runtime`` registers the conversation layer as a
default (``runtime/__init__.py`` imports `runtime.conversation`, which registers itself),
so an app with ``agents/`` keeps its turns, hooks and thread endpoints unchanged;
``Runtime(extensions=[])`` is a runtime of effects only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from runtime.messages import Message, MessagePage, MessageRole, TurnResult
    from runtime.supervisor import Runtime
    from runtime.thread import ThreadState


class Conversation(Protocol):
    """What `ThreadState`'s conversation methods call (see their docstrings)."""

    async def get_messages(
        self,
        state: ThreadState,
        *,
        limit: int,
        after: str | None,
        before: str | None,
        latest: bool,
    ) -> MessagePage:
        """`ThreadState.get_messages`."""
        ...

    async def get_message(self, state: ThreadState, message_id: str) -> Message:
        """`ThreadState.get_message`."""
        ...

    async def inject_message(
        self, state: ThreadState, content: str, role: MessageRole | str
    ) -> Message:
        """`ThreadState.inject_message`."""
        ...

    async def send_message(
        self, state: ThreadState, content: str, *, run_id: str | None = None
    ) -> TurnResult:
        """`ThreadState.send_message`."""
        ...


class Extension:
    """A part of the application the runtime calls at fixed points; override what you need.

    Every method has a do-nothing default.
    """

    name = "extension"
    """A short name, for messages."""

    async def start(self, runtime: Runtime) -> None:
        """Load what the extension needs (after effects are discovered, before any thread).

        Blocking work goes through ``runtime.run_sync``. An exception stops the start.
        """

    async def serving(self, runtime: Runtime) -> None:
        """The runtime has started and serves calls (alarms re-armed); resume work here.

        Called at the end of ``Runtime.start``; start long work as a task, do not wait
        for it. An exception is logged and does not stop the runtime.
        """

    async def drain(self, runtime: Runtime, grace_seconds: float) -> None:
        """A shutdown began: return once the extension's running work has ended.

        Called beside the wait for running effects, within ``shutdown_grace_seconds``
        (it is cancelled when the grace ends): every call is still served meanwhile.
        """

    async def thread_deleting(self, runtime: Runtime, thread_id: str) -> None:
        """A thread is being deleted: stop what it runs (before its store is removed)."""

    def lease_lost(self, runtime: Runtime, why: str) -> None:
        """This node's lease on a shared backend may have expired: stop what it runs.

        Other nodes take over what a node whose lease expired held (its runs, its turns),
        so the extension stops its own such work now (``why``: the backend's reason).
        Called on the event loop, at most once per loss; must not block. Never called on
        SQLite or memory.
        """

    async def close(self, runtime: Runtime) -> None:
        """The runtime has stopped (every run ended or was interrupted)."""

    def agent_for_new_thread(self, agent_id: str | None) -> str | None:
        """The agent a new thread gets (raise to refuse the create); default: as given."""
        return agent_id

    async def thread_created(self, state: ThreadState) -> None:
        """A thread was created (its store and registry entry exist)."""

    def conversation(self) -> Conversation | None:
        """The conversation this extension serves, if any."""
        return None

    def attributes(self) -> dict[str, Any]:
        """Attributes it exposes on the runtime (``rt.<name>``)."""
        return {}


_DEFAULTS: list[Callable[[], Extension]] = []


def register_default_extension(factory: Callable[[], Extension]) -> None:
    """Make every ``Runtime()`` built without ``extensions=`` get ``factory()``.

    Registering the same factory twice has no effect.
    """
    if factory not in _DEFAULTS:
        _DEFAULTS.append(factory)


def default_extensions() -> list[Extension]:
    """New instances of the registered default extensions, in registration order."""
    return [factory() for factory in _DEFAULTS]
