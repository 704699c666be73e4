"""The layers of runtime/ (docs/design.md, "The layers"): each module imports only its own
layer and those below, counting every import (top level, ``TYPE_CHECKING``, inside
functions). The core never imports the conversation layer; that layer registers itself
through `runtime.extension`. The core and the conversation layer use only public members of
each other's objects (no ``rt._use``, ``rt._hub``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "runtime"

LAYERS: dict[int, tuple[str, ...]] = {
    0: ("runtime.errors", "runtime.config", "runtime.ids", "runtime.abc", "runtime._text",
        "runtime._limits", "runtime.keys", "runtime.outage"),
    1: ("runtime.effects", "runtime.events", "runtime.messages", "runtime.recurrence"),
    2: ("runtime.storage", "runtime.alarms", "runtime.frames", "runtime.discovery",
        "runtime.watchdog", "runtime.pacing"),
    3: ("runtime.thread", "runtime.actors", "runtime.dispatcher", "runtime.executor",
        "runtime.effect_records",
        "runtime.runs", "runtime.extension", "runtime.supervisor", "runtime.telemetry",
        "runtime.run_index", "runtime.all_runs", "runtime.schedules", "runtime.cluster"),
    4: ("runtime.tools", "runtime.hooks", "runtime.agents", "runtime.agent_loop",
        "runtime.turns", "runtime.conversation", "runtime.demo_model",
        "runtime.effect_tools", "runtime._effect_toolset", "runtime.durable"),
    5: ("runtime.http", "runtime.endpoints", "runtime._http_errors", "runtime.testing",
        "runtime.metrics",
        "runtime.serve", "runtime.cli", "runtime"),
}
"""Layer → modules (a package name covers its submodules)."""

CORE = 3
CONVERSATION = 4


def layer_of(module: str) -> int | None:
    """The layer of a ``runtime`` module; the longest matching prefix wins."""
    best: tuple[int, int] | None = None
    for layer, names in LAYERS.items():
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (layer, len(name))
    return best[0] if best is not None else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    root = PACKAGE.parent
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def imports_of(source: str, importer: str, is_package: bool = False) -> list[tuple[str, int]]:
    """Every ``runtime`` module that ``source`` imports, with the line, wherever it is."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "runtime"
            ]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = importer.split(".")
                if not is_package:
                    package = package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            if base.split(".")[0] != "runtime":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if _is_module(sub) else base, node.lineno))
    return found


def violations(source: str, importer: str, is_package: bool = False) -> list[str]:
    """What in ``source`` breaks the layering, one line each."""
    mine = layer_of(importer)
    if mine is None:
        return [f"{importer} is in no layer: add it to LAYERS in tests/test_layers.py"]
    out = []
    for imported, line in imports_of(source, importer, is_package):
        theirs = layer_of(imported)
        if theirs is None:
            out.append(f"{importer}:{line} imports {imported}, which is in no layer")
        elif theirs > mine:
            out.append(
                f"{importer}:{line} (layer {mine}) imports {imported} (layer {theirs})"
            )
    return out


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_imports_only_its_layer_and_below() -> None:
    problems = []
    for path in _modules():
        problems += violations(
            path.read_text(), module_name(path), is_package=path.name == "__init__.py"
        )
    assert problems == []


def test_the_core_imports_no_conversation_module() -> None:
    problems = []
    for path in _modules():
        name = module_name(path)
        layer = layer_of(name)
        if layer is None or layer > CORE:
            continue
        for imported, line in imports_of(path.read_text(), name, path.name == "__init__.py"):
            if layer_of(imported) == CONVERSATION:
                problems.append(f"{name}:{line} imports {imported}")
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "from runtime.turns import run_turn\n",
        "import runtime.agents\n",
        "from runtime import hooks\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runtime.turns import X\n",
        "def f():\n    from runtime.agent_loop import build_agent\n",
        "from . import turns\n",
        "from .conversation import ConversationExtension\n",
        "import runtime\n",
    ],
)
def test_the_check_sees_a_core_module_importing_the_conversation_layer(source: str) -> None:
    assert violations(source, "runtime.thread") != []


def test_the_check_allows_lower_layers() -> None:
    source = (
        "from runtime.storage.base import ThreadStore\nfrom runtime.errors import X\n"
        "from runtime import effects\nfrom .alarms import AlarmIndex\n"
    )
    assert violations(source, "runtime.thread") == []


def private_reaches(source: str) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` (a module alias ``_x`` is fine)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        if not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id[0] == "_"):
            continue
        out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_the_core_and_the_conversation_layer_use_only_public_members_of_other_objects() -> None:
    problems = []
    for path in _modules():
        layer = layer_of(module_name(path))
        if layer in (CORE, CONVERSATION):
            problems += [f"{module_name(path)}:{p}" for p in private_reaches(path.read_text())]
    assert problems == []


def test_the_private_check_sees_a_reach_into_the_runtime() -> None:
    assert private_reaches("async def f(rt):\n    async with rt._use('t') as a: pass\n") != []
    assert private_reaches("def f(self):\n    return self._x, _hooks.run\n") == []
