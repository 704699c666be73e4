"""The PostgreSQL server the tests use: a fresh database per test session, a schema per test.

The server is the local one on 127.0.0.1:5432 (``scripts/test.sh`` starts it when it is not
answering); `session_database` creates ``te_test_<pid>_<random>`` and drops it at the end,
and every test gets a new schema in it (`new_schema`), so its tables start empty.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

SERVER_URL = os.environ.get("THREAD_EFFECTS_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
"""The server, without a database name."""

_schemas = itertools.count()

session_url: str | None = None
"""This session's database (set by the ``pg_database`` fixture of tests/conftest.py)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def session_database() -> Iterator[str]:
    """Create a fresh database for this test session; yield its URL; drop it afterwards.

    Databases left by sessions whose process is gone (killed mid-run) are dropped first.
    """
    name = f"te_test_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as conn:
        for (old,) in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'te\\_test\\_%'"
        ).fetchall():
            pid = old.split("_")[2]
            if pid.isdigit() and not _alive(int(pid)):
                conn.execute(f"DROP DATABASE IF EXISTS {old} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{SERVER_URL}/{name}"
    finally:
        with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def new_schema() -> str:
    """A schema name no test of this session used yet."""
    return f"t{next(_schemas)}"


def fresh_url() -> str:
    """This session's database URL with a schema no test used yet."""
    assert session_url is not None, "the pg_database fixture has not run"
    return f"{session_url}?schema={new_schema()}"


def query(url: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Rows of one statement on a backend's schema (``url`` with its ``schema`` parameter)."""
    from runtime.storage.postgres import split_schema

    base, schema = split_schema(url)
    with psycopg.connect(base, autocommit=True,
                         options=f"-c search_path={schema or 'public'}") as conn:
        return list(conn.execute(sql, params).fetchall())  # type: ignore[arg-type]


def set_schema_version(url: str, schema: str, version: int) -> None:
    """Stamp a (closed) PostgreSQL backend's schema with a schema version."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.schema_version SET version = %s", (version,))
