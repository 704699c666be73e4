"""Defining effects and discovering them in agents/effects/ (app effects)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from runtime import EffectDefinitionError, Runtime, ThreadState, define_effect

GOOD = """
from pydantic import BaseModel
from runtime import define_effect

class Args(BaseModel):
    text: str

async def fn(state, args): ...

effect = define_effect("Does a thing.", Args, fn)
"""


class Args(BaseModel):
    n: int


async def _fn(state: ThreadState, args: Args) -> None: ...


def _app(tmp_path: Path, files: dict[str, str]) -> Path:
    effects = tmp_path / "app" / "effects"
    effects.mkdir(parents=True)
    for name, text in files.items():
        (effects / name).write_text(textwrap.dedent(text))
    return tmp_path / "app"


def test_define_effect_forms_and_validation() -> None:
    with_args = define_effect("Has args.", Args, _fn, timeout_seconds=5)
    assert (with_args.schema, with_args.timeout_seconds, with_args.is_async) == (Args, 5.0, True)
    no_args = define_effect("No args.", lambda state: None)
    assert no_args.schema is None and not no_args.is_async
    with pytest.raises(ValueError, match="description"):
        define_effect("  ", Args, _fn)
    with pytest.raises(TypeError, match="BaseModel subclass"):
        define_effect("x", dict, _fn)
    with pytest.raises(TypeError, match="callable"):
        define_effect("x", Args, 42)
    with pytest.raises(ValueError, match="timeout_seconds"):
        define_effect("x", Args, _fn, timeout_seconds=0)


async def test_effects_are_named_by_their_file(tmp_path: Path) -> None:
    app = _app(tmp_path, {
        "send_reminder.py": GOOD,
        "_helpers.py": "X = 1\n",  # private helper files are not effects
        "__init__.py": "",
    })
    (app / "effects" / "nested").mkdir()
    (app / "effects" / "nested" / "ignored.py").write_text(GOOD)
    async with Runtime(app_dir=app, data_dir=tmp_path / "data", load_packages=False) as rt:
        assert [d.name for d in rt.registry.all()] == ["send_reminder"]
        assert rt.registry.resolve("send_reminder").description == "Does a thing."


@pytest.mark.parametrize(
    ("filename", "text", "message"),
    [
        ("SendReminder.py", GOOD, r"SendReminder\.py.*must be snake_case"),
        ("2fast.py", GOOD, r"2fast\.py.*must be snake_case"),
        ("empty.py", "X = 1\n", r"empty\.py: defines no effect"),
        ("twice.py", GOOD + "\nother = define_effect('Other.', Args, fn)\n",
         r"twice\.py: defines 2 effects"),
        ("broken.py", "import nonexistent_module_xyz\n",
         r"broken\.py: import failed.*ModuleNotFoundError.*nonexistent_module_xyz"),
        ("syntax.py", "def (:\n", r"syntax\.py: import failed.*SyntaxError"),
        ("exits.py", "import sys\nsys.exit(2)\n", r"exits\.py: import failed.*SystemExit"),
    ],
)
async def test_a_bad_effect_file_stops_startup_naming_the_file(
    tmp_path: Path, filename: str, text: str, message: str
) -> None:
    app = _app(tmp_path, {"good.py": GOOD, filename: text})
    rt = Runtime(app_dir=app, data_dir=tmp_path / "data", load_packages=False)
    with pytest.raises(EffectDefinitionError, match=message):
        await rt.start()
    # The data directory is released: a fixed app starts on it at once.
    (app / "effects" / filename).unlink()
    async with Runtime(app_dir=app, data_dir=tmp_path / "data", load_packages=False) as ok:
        assert [d.name for d in ok.registry.all()] == ["good"]


async def test_two_runtimes_of_different_apps_keep_their_own_modules(tmp_path: Path) -> None:
    a = _app(tmp_path / "a", {"same.py": GOOD.replace("Does a thing.", "From A.")})
    b = _app(tmp_path / "b", {"same.py": GOOD.replace("Does a thing.", "From B.")})
    async with Runtime(app_dir=a, data_dir=tmp_path / "da", load_packages=False) as ra, \
            Runtime(app_dir=b, data_dir=tmp_path / "db", load_packages=False) as rb:
        assert ra.registry.resolve("same").description == "From A."
        assert rb.registry.resolve("same").description == "From B."


def test_ids_are_unique_time_ordered_and_valid_thread_ids() -> None:
    import time

    from runtime.effects import new_id
    from runtime.supervisor import validate_thread_id

    ids = [new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and validate_thread_id(i) == i for i in ids)
    later = (time.sleep(0.002), new_id())[1]
    assert later[:12] > ids[0][:12]  # the millisecond prefix orders ids by creation
