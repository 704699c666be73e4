"""The checked-in DDL (runtime/storage/schema.py) is what the SQLModel models generate.

The models in runtime/storage/models.py are the single definition of the schema; the SQLite
backend runs the generated module so that SQLModel is not imported at run time. Regenerate
it with ``.venv/bin/python -m runtime.storage.models``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from runtime.storage import models, schema, sqlite

ROOT = Path(__file__).resolve().parent.parent


def test_the_checked_in_schema_is_what_the_models_generate() -> None:
    assert models.SCHEMA_PATH == Path(schema.__file__)
    assert models.SCHEMA_PATH.read_text(encoding="utf-8") == models.schema_source(), (
        "runtime/storage/schema.py is out of date: run .venv/bin/python -m runtime.storage.models"
    )


def test_the_migrations_are_the_models_ddl_step_by_step() -> None:
    for generated, steps in (
        (schema.THREAD_MIGRATIONS, models.THREAD_MIGRATION_MODELS),
        (schema.RUNTIME_MIGRATIONS, models.RUNTIME_MIGRATION_MODELS),
    ):
        assert generated == {n: tuple(models.sqlite_ddl(*m)) for n, m in steps.items()}
    assert sqlite.THREAD_MIGRATIONS is schema.THREAD_MIGRATIONS
    assert sqlite.RUNTIME_MIGRATIONS is schema.RUNTIME_MIGRATIONS
    assert len(schema.THREAD_MIGRATIONS) == sqlite.THREAD_SCHEMA_VERSION
    assert len(schema.RUNTIME_MIGRATIONS) == sqlite.RUNTIME_SCHEMA_VERSION


def test_every_model_is_created_by_a_migration() -> None:
    for steps, wanted in (
        (schema.THREAD_MIGRATIONS, models.THREAD_MODELS),
        (schema.RUNTIME_MIGRATIONS, models.RUNTIME_MODELS),
    ):  # two files: a thread's and runtime.sqlite
        conn = sqlite3.connect(":memory:")
        for statements in steps.values():
            for statement in statements:
                conn.execute(statement)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {m.__tablename__ for m in wanted}


def test_the_check_command_reports_drift_by_its_exit_status() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.storage.models", "--check"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
