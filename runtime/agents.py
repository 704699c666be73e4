"""Agents: what serves a thread's conversation, one per file in ``agents/agents/``.

The application folder follows the Standard Agents file conventions, in Python::

    agents/
      agents/<name>.py   define_agent(name, instructions, tools=[...], hooks=[...], model=None)
      tools/<name>.py    define_tool(description, args_schema, execute)      (runtime.tools)
      hooks/<id>.py      define_hook(hook, id, execute)                       (runtime.hooks)
      api/...            define_thread_endpoint(handler)                      (runtime.endpoints)
      effects/<name>.py  define_effect(description, schema, fn)              (runtime.effects)

An agent names its tools and hooks by file name; a hook runs only for threads whose agent
lists it. Each file holds exactly one definition, whose name is the file name. A bad file
(import error, no or several definitions, a name that does not match, an agent naming a
tool or hook that does not exist) stops startup with an `AgentDefinitionError` naming it.

A thread is served by the agent given when it was created (``agent_id``); without one, by
the app's only agent, or by the one marked ``default=True``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from runtime.discovery import app_package, load_module_file, single_definition
from runtime.effects import EFFECT_NAME_RE
from runtime.errors import AgentDefinitionError, AgentNotFound
from runtime.hooks import HookDefinition, HookPoint
from runtime.tools import ToolDefinition

if TYPE_CHECKING:
    from pydantic_ai.models import Model

    from runtime.thread import ThreadState

AGENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}\Z")
"""Agent names (and so agent file names): lower case, digits, ``_`` and ``-``."""

Instructions = str | Callable[["ThreadState"], str | Awaitable[str]]

D = TypeVar("D")


@dataclass(frozen=True, slots=True)
class AgentDefinition:
    """What `define_agent` returns.

    Attributes:
        name: The agent id (equal to its file name); threads are created with it.
        instructions: The system instructions: text, or ``fn(state) -> str`` (async or
            sync) computed at each turn.
        tools: Names of the tools (files in ``agents/tools/``) the model may call.
        hooks: Ids of the hooks (files in ``agents/hooks/``) that run for its threads,
            in this order.
        model: A pydantic-ai model name (``"openai:gpt-4o-mini"``) or ``Model``; None =
            the runtime's ``model`` setting, or the offline demo model when that is unset.
        default: Serves threads created without an ``agent_id`` when the app has several
            agents.
        description: A line for people choosing an agent (``GET /api/agents``, the
            pane's "New thread"); never sent to the model.
    """

    name: str
    instructions: Instructions
    tools: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    model: str | Model | None = None
    default: bool = False
    description: str | None = None


def define_agent(
    name: str,
    instructions: Instructions,
    tools: Sequence[str] = (),
    hooks: Sequence[str] = (),
    model: str | Model | None = None,
    *,
    default: bool = False,
    description: str | None = None,
) -> AgentDefinition:
    """Define an agent; assign the result to a module-level name in ``agents/agents/<name>.py``.

    Example::

        agent = define_agent(
            "assistant",
            "You are a helpful assistant. Use set_reminder for reminders.",
            tools=["set_reminder"],
            hooks=["welcome"],
        )

    Args:
        name: The agent id, ``^[a-z][a-z0-9_-]{0,63}$``, equal to the file name.
        instructions: System instructions: text, or ``fn(state)`` returning text.
        tools: Tool names (files in ``agents/tools/``).
        hooks: Hook ids (files in ``agents/hooks/``), run in this order.
        model: A pydantic-ai model name or ``Model``; None = the runtime's setting.
        default: Serve threads created without an ``agent_id``.
        description: What the agent is for, shown to people choosing one (not to the
            model).

    Returns:
        An `AgentDefinition`.

    Raises:
        ValueError: a malformed name, empty instructions, or a tool or hook listed twice.
        TypeError: instructions neither text nor callable, a tool/hook name not a string,
            or a description that is not text.
    """
    if not isinstance(name, str) or not AGENT_NAME_RE.match(name):
        raise ValueError(
            f"define_agent: name must match ^[a-z][a-z0-9_-]{{0,63}}$, got {name!r}"
        )
    if isinstance(instructions, str):
        if not instructions.strip():
            raise ValueError(f"define_agent({name!r}): instructions must not be empty")
    elif not callable(instructions):
        raise TypeError(
            f"define_agent({name!r}): instructions must be text or a function, "
            f"got {instructions!r}"
        )
    if description is not None and not isinstance(description, str):
        raise TypeError(f"define_agent({name!r}): description must be text, got {description!r}")
    for kind, names in (("tools", tools), ("hooks", hooks)):
        if isinstance(names, str):
            raise TypeError(f"define_agent({name!r}): {kind} must be a list of names")
        for item in names:
            if not isinstance(item, str):
                raise TypeError(
                    f"define_agent({name!r}): {kind} are listed by name (a string), got {item!r}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"define_agent({name!r}): {kind} lists a name twice")
    return AgentDefinition(
        name=name,
        instructions=instructions,
        tools=tuple(tools),
        hooks=tuple(hooks),
        model=model,
        default=bool(default),
        description=description,
    )


@dataclass
class AgentApp:
    """The app's agents, tools and hooks, as loaded from its folder.

    Attributes:
        agents: Agent id → definition.
        tools: Tool name → definition.
        hooks: Hook id → definition.
        files: Definition name → the file it came from, for error messages.
    """

    agents: dict[str, AgentDefinition] = field(default_factory=dict)
    tools: dict[str, ToolDefinition] = field(default_factory=dict)
    hooks: dict[str, HookDefinition] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    def default_agent_id(self) -> str | None:
        """The agent that serves threads created without an ``agent_id``, if there is one."""
        if len(self.agents) == 1:
            return next(iter(self.agents))
        defaults = [a.name for a in self.agents.values() if a.default]
        return defaults[0] if defaults else None

    def agent_for_new_thread(self, agent_id: str | None) -> str | None:
        """The ``agent_id`` to record for a new thread.

        Without agents in the app, any value is kept as a free-form label.

        Raises:
            AgentNotFound: ``agent_id`` names no agent of the app, or it is None and the
                app has several agents of which none is the default.
        """
        if not self.agents:
            return agent_id
        if agent_id is None:
            chosen = self.default_agent_id()
            if chosen is None:
                names = ", ".join(sorted(self.agents))
                raise AgentNotFound(
                    f"No agent_id given and no default agent among {names}; pass agent_id "
                    f"or mark one agent default=True"
                )
            return chosen
        if agent_id not in self.agents:
            raise AgentNotFound(self._unknown(agent_id))
        return agent_id

    def _unknown(self, agent_id: str) -> str:
        names = ", ".join(sorted(self.agents)) or "none"
        return f"Agent not found: {agent_id} (agents: {names})"

    def agent(self, agent_id: str | None) -> AgentDefinition:
        """The agent serving a thread whose ``agent_id`` is this.

        Raises:
            AgentNotFound: no such agent (or None and no default).
        """
        chosen = agent_id if agent_id is not None else self.default_agent_id()
        if chosen is None:
            raise AgentNotFound("No agent serves this thread: the app defines no default agent")
        defn = self.agents.get(chosen)
        if defn is None:
            raise AgentNotFound(self._unknown(chosen))
        return defn

    def hooks_for(self, agent_id: str | None, point: HookPoint) -> list[HookDefinition]:
        """The hooks of ``point`` that the thread's agent lists, in its order.

        A thread without a known agent has none.
        """
        chosen = agent_id if agent_id is not None else self.default_agent_id()
        defn = self.agents.get(chosen) if chosen is not None else None
        if defn is None:
            return []
        return [self.hooks[h] for h in defn.hooks if self.hooks[h].hook is point]

    def tools_for(self, agent: AgentDefinition) -> list[ToolDefinition]:
        """The agent's tools, in its order."""
        return [self.tools[name] for name in agent.tools]


def load_definition(path: Path, module_name: str, kind: type[D], what: str) -> D:
    """Import one file and return the single ``kind`` object it defines at module level.

    Raises:
        AgentDefinitionError: naming the file, on an import error or when it defines no
            or several such objects.
    """
    module = load_module_file(path, module_name, AgentDefinitionError)
    return single_definition(module, kind, path, what, AgentDefinitionError)


def module_prefix(app_dir: Path) -> str:
    """The ``sys.modules`` package of an app folder's files (unique per folder).

    It is registered as a package (see `runtime.discovery.app_package`), so files can
    import their ``_helper.py`` files relatively.
    """
    return app_package(app_dir)


def _py_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]


def load_agent_app(app_dir: Path | None) -> AgentApp:
    """Load ``agents/``, ``tools/`` and ``hooks/`` of an app folder.

    Args:
        app_dir: The application folder; None or missing folders mean no definitions.

    Returns:
        The loaded `AgentApp`.

    Raises:
        AgentDefinitionError: naming the file (see the module docstring).
    """
    app = AgentApp()
    if app_dir is None:
        return app
    root = Path(app_dir).resolve()
    prefix = module_prefix(root)
    for kind in ("tools", "hooks", "agents"):
        if (root / kind).is_dir():
            app_package(root, kind)  # so relative imports of helper files work
    for path in _py_files(root / "tools"):
        if not EFFECT_NAME_RE.match(path.stem):
            raise AgentDefinitionError(
                f"{path}: tool file names must be snake_case (^[a-z][a-z0-9_]*$)"
            )
        tool = load_definition(path, f"{prefix}.tools.{path.stem}", ToolDefinition, "tool")
        if tool.name and tool.name != path.stem:
            raise AgentDefinitionError(
                f"{path}: the tool's name is {tool.name!r} but its file is {path.name!r}; a "
                f"tool file is named after its tool"
            )
        # replace keeps the definition's class (an effect tool stays one).
        app.tools[path.stem] = replace(tool, name=path.stem)
        app.files[f"tool:{path.stem}"] = path
    for path in _py_files(root / "hooks"):
        hook = load_definition(path, f"{prefix}.hooks.{path.stem}", HookDefinition, "hook")
        if hook.id != path.stem:
            raise AgentDefinitionError(
                f"{path}: the hook's id is {hook.id!r} but its file is {path.name!r}; a hook "
                f"file is named after its id"
            )
        app.hooks[hook.id] = hook
        app.files[f"hook:{hook.id}"] = path
    defaults: list[str] = []
    for path in _py_files(root / "agents"):
        agent = load_definition(path, f"{prefix}.agents.{path.stem}", AgentDefinition, "agent")
        if agent.name != path.stem:
            raise AgentDefinitionError(
                f"{path}: the agent's name is {agent.name!r} but its file is {path.name!r}; "
                f"an agent file is named after its agent"
            )
        for tool_name in agent.tools:
            if tool_name not in app.tools:
                known = ", ".join(sorted(app.tools)) or "none"
                raise AgentDefinitionError(
                    f"{path}: agent {agent.name!r} lists tool {tool_name!r}, but there is no "
                    f"tools/{tool_name}.py (tools: {known})"
                )
        for hook_id in agent.hooks:
            if hook_id not in app.hooks:
                known = ", ".join(sorted(app.hooks)) or "none"
                raise AgentDefinitionError(
                    f"{path}: agent {agent.name!r} lists hook {hook_id!r}, but there is no "
                    f"hooks/{hook_id}.py (hooks: {known})"
                )
        if agent.default:
            defaults.append(agent.name)
        app.agents[agent.name] = agent
        app.files[f"agent:{agent.name}"] = path
    if len(defaults) > 1:
        raise AgentDefinitionError(
            f"{root / 'agents'}: several agents are marked default ({', '.join(defaults)}); "
            f"at most one may be"
        )
    return app
