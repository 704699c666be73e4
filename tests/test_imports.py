"""What `import runtime` loads: an app with effects only needs neither pydantic-ai nor SQLModel.

Nor psycopg: only the PostgreSQL backend (`runtime.storage.postgres`, a database URL) loads it.

pydantic-ai (≈ 50 MiB) is imported when an app defines agents (at startup) or a message is
converted to or from its form; SQLModel and SQLAlchemy (≈ 18 MiB) only generate the schema
(runtime/storage/schema.py, checked by tests/test_schema.py). Each check runs in a fresh
interpreter, since this test process has imported both already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pydantic_ai", "sqlmodel", "sqlalchemy", "psycopg", "psycopg_pool")


def run_fresh(code: str, tmp_path: Path) -> dict[str, object]:
    """Run ``code`` in a new interpreter; it prints one JSON object as its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(ROOT), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


PRELUDE = """
import asyncio, json, sys
from pathlib import Path

HEAVY = {heavy!r}


def loaded():
    return sorted({{m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY}})

"""


def test_an_effects_only_app_imports_neither_pydantic_ai_nor_sqlmodel(tmp_path: Path) -> None:
    code = PRELUDE.format(heavy=HEAVY) + """
import runtime
import runtime.http  # what the server imports
from runtime.testing import FakeClock  # noqa: F401  (test doubles: no pydantic-ai either)

after_import = loaded()


async def main():
    root, data = Path(sys.argv[1]), Path(sys.argv[2])
    async with runtime.Runtime(
        app_dir=root / "tests" / "apps" / "core", data_dir=data, load_packages=False
    ) as rt:
        state = await rt.create_thread("t1")
        run_id = await state.schedule_effect("record", {"key": "k"}, delay=0)
        await rt.wait_idle()
        run = await state.get_run(run_id)
        return str(run.status)


status = asyncio.run(main())
print(json.dumps({"after_import": after_import, "after_run": loaded(), "status": status}))
"""
    result = run_fresh(code, tmp_path)
    assert result == {"after_import": [], "after_run": [], "status": "completed"}
    assert (tmp_path / "record.jsonl").read_text().count('"key": "k"') == 1


def test_an_app_with_agents_loads_pydantic_ai_at_startup_and_runs_a_turn(tmp_path: Path) -> None:
    code = PRELUDE.format(heavy=HEAVY) + """
import runtime

after_import = loaded()


async def main():
    root, data = Path(sys.argv[1]), Path(sys.argv[2])
    async with runtime.Runtime(
        app_dir=root / "agents", data_dir=data, load_packages=False
    ) as rt:
        after_start = loaded()  # imported at startup (in a worker thread), not by a turn
        state = await rt.create_thread("t1")
        result = await state.send_message("remind me in 1 hour to stretch")
        runs = await state.list_runs()
        return after_start, result.reply.content, [r.name for r in runs.runs]


after_start, reply, runs = asyncio.run(main())
print(json.dumps({"after_import": after_import, "after_start": after_start, "reply": reply,
                  "runs": runs, "after_turn": loaded()}))
"""
    result = run_fresh(code, tmp_path)
    assert result["after_import"] == []
    assert result["after_start"] == ["pydantic_ai"]
    assert result["after_turn"] == ["pydantic_ai"]  # SQLModel is never needed
    assert result["reply"] == "OK, I'll remind you to stretch in 1 hour."
    assert result["runs"] == ["send_reminder"]
