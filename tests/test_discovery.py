"""Discovery of package effects: the rules for a package's effects folder, and how names
resolve between the app and packages.

The installed-distribution path (entry points read by importlib.metadata) is covered in
test_packages.py; here each package is an importable folder handed to
`load_package_effects` with its entry point, so every rule gets its own small package.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from runtime import EffectDefinition, EffectDefinitionError, EffectNotFound, define_effect
from runtime.discovery import PACKAGES_GROUP, EffectRegistry, load_package_effects

GOOD = """
from pydantic import BaseModel
from runtime import define_effect

class Args(BaseModel):
    text: str

async def fn(state, args): ...

effect = define_effect("Does a thing.", Args, fn)
"""

MakePackage = Callable[[dict[str, str]], tuple[EntryPoint, Path]]
_counter = itertools.count()


@pytest.fixture
def make_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakePackage]:
    """``make_package({relative path: source})`` → (entry point, package folder)."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    made: list[str] = []

    def make(files: dict[str, str]) -> tuple[EntryPoint, Path]:
        module = f"te_discovery_pkg_{next(_counter)}"
        made.append(module)
        root = site / module
        root.mkdir()
        (root / "__init__.py").write_text("")
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(textwrap.dedent(text))
        importlib.invalidate_caches()
        return EntryPoint("pkg", module, PACKAGES_GROUP), root

    yield make
    for name in list(sys.modules):
        if any(name == m or name.startswith(f"{m}.") for m in made):
            del sys.modules[name]


OWNER = "package 'pkg' (distribution an unknown distribution)"


def test_each_file_of_the_effects_folder_is_one_effect_named_by_the_file(
    make_package: MakePackage,
) -> None:
    ep, _ = make_package({
        "effects/__init__.py": "",
        "effects/send_reminder.py": GOOD,
        "effects/_shared.py": "LIMIT = 3\n",  # a private helper, not an effect
        "effects/cleanup.py": """
            from runtime import define_effect
            from ._shared import LIMIT

            def cleanup(state): ...

            effect = define_effect(f"Keeps {LIMIT}.", cleanup)
            """,
        "effects/nested/ignored.py": GOOD,  # only files directly in effects/
        "effects/notes.txt": "not python",
    })
    effects = load_package_effects("pkg", ep)
    assert sorted(effects) == ["cleanup", "send_reminder"]
    assert effects["cleanup"].description == "Keeps 3."  # relative imports work
    assert effects["send_reminder"].qualified_name == "pkg/send_reminder"
    assert {d.package_id for d in effects.values()} == {"pkg"}


def test_the_effects_folder_needs_no_init_file(make_package: MakePackage) -> None:
    ep, _ = make_package({"effects/ping.py": GOOD})
    assert list(load_package_effects("pkg", ep)) == ["ping"]



def test_a_package_without_an_effects_folder_exports_no_effects(
    make_package: MakePackage,
) -> None:
    ep, _ = make_package({"tools.py": "X = 1\n"})
    assert load_package_effects("pkg", ep) == {}

@pytest.mark.parametrize(
    ("filename", "text", "problem"),
    [
        ("SendReminder.py", GOOD,
         "effect file names must be snake_case (^[a-z][a-z0-9_]*$), so 'SendReminder.py' "
         "is not a valid effect name"),
        ("empty.py", "X = 1\n",
         "defines no effect; assign define_effect(...) to a module-level name, "
         "e.g. `effect = define_effect(...)`"),
        ("twice.py", GOOD + "\nother = define_effect('Other.', Args, fn)\n",
         "defines 2 effects; one file holds exactly one effect (its name is the file name)"),
        ("broken.py", "\n\nimport te_discovery_no_such_module\n",
         "import failed (line 3): ModuleNotFoundError: "
         "No module named 'te_discovery_no_such_module'"),
    ],
)
def test_a_bad_file_names_the_package_and_the_file(
    make_package: MakePackage, filename: str, text: str, problem: str
) -> None:
    ep, root = make_package({"effects/good.py": GOOD, f"effects/{filename}": text})
    with pytest.raises(EffectDefinitionError) as info:
        load_package_effects("pkg", ep)
    assert str(info.value) == f"{OWNER}: {root / 'effects' / filename}: {problem}"


def test_a_syntax_error_names_the_package_and_the_file(make_package: MakePackage) -> None:
    ep, root = make_package({"effects/syntax.py": "def (:\n"})
    with pytest.raises(EffectDefinitionError) as info:
        load_package_effects("pkg", ep)
    assert str(info.value).startswith(
        f"{OWNER}: {root / 'effects' / 'syntax.py'}: import failed: SyntaxError: "
    )


def test_a_failing_helper_import_points_at_the_effect_files_line(
    make_package: MakePackage,
) -> None:
    ep, root = make_package({
        "effects/_helper.py": "RATE = 1 / 0\n",
        "effects/uses_helper.py": "from runtime import define_effect\n"
                                  "from ._helper import RATE\n",
    })
    with pytest.raises(EffectDefinitionError) as info:
        load_package_effects("pkg", ep)
    assert str(info.value) == (
        f"{OWNER}: {root / 'effects' / 'uses_helper.py'}: import failed (line 2): "
        f"ZeroDivisionError: division by zero"
    )


def test_a_failing_effects_init_is_reported_as_itself(make_package: MakePackage) -> None:
    ep, root = make_package({
        "effects/__init__.py": "\nraise RuntimeError('bad init')\n",
        "effects/ping.py": GOOD,
    })
    with pytest.raises(EffectDefinitionError) as info:
        load_package_effects("pkg", ep)
    assert str(info.value) == (
        f"{OWNER}: {root / 'effects' / '__init__.py'}: import failed (line 2): "
        f"RuntimeError: bad init"
    )

def test_a_package_that_fails_to_import_names_the_package(make_package: MakePackage) -> None:
    ep, _ = make_package({"__init__.py": "raise RuntimeError('needs configuration')\n"})
    with pytest.raises(EffectDefinitionError) as info:
        load_package_effects("pkg", ep)
    assert str(info.value) == (
        f"{OWNER}: cannot import {ep.module!r}: RuntimeError: needs configuration"
    )


# ------------------------------------------------------------------- resolving names


def _effect(name: str, package_id: str | None = None) -> EffectDefinition:
    defn = define_effect(f"{package_id or 'app'} {name}", lambda state: None)
    return replace(defn, name=name, package_id=package_id)


def _registry() -> EffectRegistry:
    return EffectRegistry(
        app={"ping": _effect("ping"), "note": _effect("note")},
        packages={"billing": {"ping": _effect("ping", "billing")}},
    )


@pytest.mark.parametrize(
    ("name", "package_id", "found"),
    [
        ("ping", None, "app ping"),  # a short name in the app: the app's effect
        ("billing/ping", None, "billing ping"),  # a qualified name from anywhere
        ("billing/ping", "other", "billing ping"),
        ("ping", "billing", "billing ping"),  # a short name in a package: its own
        ("note", None, "app note"),
    ],
)
def test_names_resolve_by_where_the_caller_is(
    name: str, package_id: str | None, found: str
) -> None:
    assert _registry().resolve(name, package_id=package_id).description == found


@pytest.mark.parametrize(
    ("name", "package_id", "message"),
    [
        ("nope/ping", None, "Effect not found: nope/ping (no package \"nope\" is installed)"),
        ("billing/note", None,
         "Effect not found: billing/note (package \"billing\" has no effect \"note\")"),
        ("note", "billing",
         "Effect not found: note (package \"billing\" has no effect \"note\"; inside a package "
         "a short name means the package's own effect)"),
        ("ping", "nope",
         "Effect not found: ping (the caller belongs to package \"nope\", which is not "
         "installed)"),
        ("nope", None, "Effect not found: nope"),
    ],
)
def test_unknown_names_say_what_was_asked_for(
    name: str, package_id: str | None, message: str
) -> None:
    with pytest.raises(EffectNotFound) as info:
        _registry().resolve(name, package_id=package_id)
    assert str(info.value) == message
    assert info.value.name == name
