"""Agents, tools and hooks as files: which agent serves a thread, and clear startup errors
for files that are not valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from runtime import (
    AgentDefinitionError,
    AgentNotFound,
    Runtime,
    define_agent,
    define_tool,
)

AGENT = "from runtime import define_agent\nagent = define_agent({name!r}, 'Be brief.'{extra})\n"
TOOL = (
    "from runtime import define_tool\n"
    "async def run(state):\n    return 'ok'\n"
    "tool = define_tool('Does a thing.', run)\n"
)
HOOK = (
    "from runtime import define_hook\n"
    "async def run(state):\n    return None\n"
    "hook = define_hook('after_thread_created', {id!r}, run)\n"
)


def make_app(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def agent_file(name: str, extra: str = "") -> str:
    return AGENT.format(name=name, extra=extra)


async def start(tmp_path: Path, files: dict[str, str]) -> Runtime:
    rt = Runtime(app_dir=make_app(tmp_path / "app", files), data_dir=tmp_path / "data",
                 load_packages=False)
    await rt.start()
    return rt


async def test_the_only_agent_serves_threads_created_without_agent_id(tmp_path: Path) -> None:
    rt = await start(tmp_path, {"agents/solo.py": agent_file("solo")})
    try:
        assert (await rt.create_thread()).agent_id == "solo"
        assert (await rt.create_thread(agent_id="solo")).agent_id == "solo"
        with pytest.raises(AgentNotFound, match="Agent not found: ghost"):
            await rt.create_thread(agent_id="ghost")
        assert [t.agent_id for t in (await rt.list_threads()).threads] == ["solo", "solo"]
    finally:
        await rt.close()


async def test_with_several_agents_the_default_one_serves(tmp_path: Path) -> None:
    rt = await start(tmp_path, {
        "agents/first.py": agent_file("first"),
        "agents/second.py": agent_file("second", ", default=True"),
    })
    try:
        assert (await rt.create_thread()).agent_id == "second"
        assert (await rt.create_thread(agent_id="first")).agent_id == "first"
    finally:
        await rt.close()


async def test_with_several_agents_and_no_default_agent_id_is_required(tmp_path: Path) -> None:
    rt = await start(tmp_path, {
        "agents/first.py": agent_file("first"),
        "agents/second.py": agent_file("second"),
    })
    try:
        with pytest.raises(AgentNotFound, match="no default agent among first, second"):
            await rt.create_thread()
        assert (await rt.list_threads()).threads == []  # nothing was created
    finally:
        await rt.close()


async def test_without_agents_agent_id_is_a_free_label_and_turns_need_an_agent(
    tmp_path: Path,
) -> None:
    rt = await start(tmp_path, {})
    try:
        thread = await rt.create_thread(agent_id="anything")
        assert thread.agent_id == "anything"
        with pytest.raises(AgentNotFound, match="anything"):
            await thread.send_message("hello")
        assert (await thread.get_messages()).messages == []
    finally:
        await rt.close()


@pytest.mark.parametrize(
    ("files", "bad_file", "message"),
    [
        ({"agents/a.py": agent_file("a", ", tools=['missing']")}, "agents/a.py",
         "lists tool 'missing', but there is no tools/missing.py"),
        ({"agents/a.py": agent_file("a", ", hooks=['nope']")}, "agents/a.py",
         "lists hook 'nope', but there is no hooks/nope.py"),
        ({"agents/a.py": agent_file("b")}, "agents/a.py",
         "the agent's name is 'b' but its file is 'a.py'"),
        ({"agents/a.py": "x = 1\n"}, "agents/a.py", "defines no agent"),
        ({"agents/a.py": agent_file("a") + "other = agent.__class__(**{"
          "f: getattr(agent, f) for f in agent.__dataclass_fields__})\n"},
         "agents/a.py", "defines 2 agents"),
        ({"agents/a.py": "import does_not_exist\n"}, "agents/a.py",
         "import failed (line 1): ModuleNotFoundError"),
        ({"agents/a.py": agent_file("a", ", default=True"),
          "agents/b.py": agent_file("b", ", default=True")}, "agents",
         "several agents are marked default (a, b)"),
        ({"tools/Bad-Name.py": TOOL}, "tools/Bad-Name.py", "snake_case"),
        ({"tools/t.py": "x = 1\n"}, "tools/t.py", "defines no tool"),
        ({"hooks/h.py": HOOK.format(id="other")}, "hooks/h.py",
         "the hook's id is 'other' but its file is 'h.py'"),
    ],
)
async def test_a_bad_file_stops_startup_naming_it(
    tmp_path: Path, files: dict[str, str], bad_file: str, message: str
) -> None:
    rt = Runtime(app_dir=make_app(tmp_path / "app", files), data_dir=tmp_path / "data",
                 load_packages=False)
    with pytest.raises(AgentDefinitionError) as caught:
        await rt.start()
    assert str(tmp_path / "app" / bad_file) in str(caught.value)
    assert message in str(caught.value)
    # The data directory was released: a corrected app starts.
    make_app(tmp_path / "fixed", {})
    async with Runtime(app_dir=tmp_path / "fixed", data_dir=tmp_path / "data",
                       load_packages=False):
        pass


async def test_files_starting_with_underscore_are_not_definitions(tmp_path: Path) -> None:
    rt = await start(tmp_path, {
        "agents/solo.py": agent_file("solo", ", tools=['t']"),
        "agents/_shared.py": "PROMPT = 'x'\n",
        "tools/t.py": TOOL,
        "tools/__init__.py": "",
    })
    try:
        assert sorted(rt.agents.agents) == ["solo"]
        assert sorted(rt.agents.tools) == ["t"]
    finally:
        await rt.close()


async def test_files_import_their_helper_files_relatively(tmp_path: Path) -> None:
    import httpx
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from starlette.applications import Starlette

    from runtime.http import thread_endpoint_routes
    from runtime.testing import override_model

    app_dir = make_app(tmp_path / "app", {
        "_shared.py": "APP_WIDE = 'app-wide'\n",
        "effects/_h.py": "PREFIX = 'from effects/_h'\n",
        "effects/e.py": (
            "from runtime import define_effect\n"
            "from ._h import PREFIX\n"
            "from .._shared import APP_WIDE\n"
            "async def run(state):\n"
            "    await state.inject_message(f'{PREFIX} {APP_WIDE}')\n"
            "effect = define_effect('Posts.', run)\n"
        ),
        "tools/_common.py": "ANSWER = 'tool helper'\n",
        "tools/t.py": (
            "from runtime import define_tool\n"
            "from ._common import ANSWER\n"
            "async def run(state):\n"
            "    await state.schedule_effect('e')\n"
            "    return ANSWER\n"
            "tool = define_tool('Does a thing.', run)\n"
        ),
        "hooks/_texts.py": "GREETING = 'hook helper'\n",
        "hooks/hello.py": (
            "from runtime import define_hook\n"
            "from ._texts import GREETING\n"
            "async def run(state):\n"
            "    await state.inject_message(GREETING)\n"
            "hook = define_hook('after_thread_created', 'hello', run)\n"
        ),
        "agents/_prompts.py": "PROMPT = 'Be brief.'\n",
        "agents/solo.py": (
            "from runtime import define_agent\n"
            "from ._prompts import PROMPT\n"
            "agent = define_agent('solo', PROMPT, tools=['t'], hooks=['hello'])\n"
        ),
        "api/_util.py": "def label():\n    return 'api helper'\n",
        "api/notes/_more.py": "NESTED = 'nested helper'\n",
        "api/notes/[note_id].py": (
            "from runtime import define_thread_endpoint\n"
            "from .._util import label\n"
            "from ._more import NESTED\n"
            "async def run(request, state, params):\n"
            "    return {'label': label(), 'nested': NESTED, 'id': params['note_id']}\n"
            "endpoint = define_thread_endpoint(run)\n"
        ),
    })
    calls = [
        ModelResponse(parts=[ToolCallPart("t", {})]),
        ModelResponse(parts=[TextPart("done")]),
    ]
    async with Runtime(app_dir=app_dir, data_dir=tmp_path / "data",
                       load_packages=False) as rt:
        thread = await rt.create_thread()
        with override_model(rt, FunctionModel(lambda messages, info: calls.pop(0))):
            result = await thread.send_message("go")
        await rt.wait_idle()
        contents = [m.content for m in (await thread.get_messages()).messages]
        assert contents[0] == "hook helper"
        assert result.messages[2].tool_results[0].content == "tool helper"
        assert contents[-1] == "from effects/_h app-wide"

        web = Starlette(routes=thread_endpoint_routes(app_dir))
        web.state.runtime = rt
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            res = await client.get(f"/api/threads/{thread.thread_id}/notes/n1")
        assert res.status_code == 200, res.text
        assert res.json() == {"label": "api helper", "nested": "nested helper", "id": "n1"}


def test_define_agent_and_define_tool_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="name must match"):
        define_agent("Bad Name", "x")
    with pytest.raises(ValueError, match="instructions must not be empty"):
        define_agent("a", "  ")
    with pytest.raises(TypeError, match="list of names"):
        define_agent("a", "x", tools="set_reminder")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twice"):
        define_agent("a", "x", hooks=["h", "h"])
    agent = define_agent("a", lambda state: "dynamic", tools=["t"])
    assert agent.tools == ("t",) and callable(agent.instructions)

    class Args(BaseModel):
        n: int

    async def run(state: object, args: Args) -> int:
        return args.n

    tool = define_tool("Counts.", Args, run)
    assert tool.json_schema()["properties"]["n"]["type"] == "integer"
    assert define_tool("No args.", run).json_schema()["properties"] == {}
    with pytest.raises(ValueError, match="description"):
        define_tool("", Args, run)
    with pytest.raises(TypeError, match="BaseModel"):
        define_tool("x", dict, run)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="callable"):
        define_tool("x", Args, 42)  # type: ignore[call-overload]


async def test_dynamic_instructions_see_the_thread(tmp_path: Path) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.testing import override_model

    rt = await start(tmp_path, {
        "agents/solo.py": (
            "from runtime import define_agent\n"
            "async def instructions(state):\n"
            "    return f'You serve {state.user_id} in {state.thread_id}.'\n"
            "agent = define_agent('solo', instructions)\n"
        ),
    })
    seen: list[str | None] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info.instructions)
        return ModelResponse(parts=[TextPart("hi")])

    try:
        thread = await rt.create_thread("t1", user_id="ada")
        with override_model(rt, FunctionModel(answer)):
            await thread.send_message("hello")
    finally:
        await rt.close()
    assert seen == ["You serve ada in t1."]
