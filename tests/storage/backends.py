"""Backend-neutral helpers for tests that look at what the runtime stored (any backend).

Tests use these instead of SQL against the files, so that they run on every backend;
raw SQL stays only in tests about the files themselves (corruption, migrations, legacy
rows). A new backend joins by adding its name to `BACKENDS` and a branch to
`make_backend` (and, if it cannot be read through the contract while a runtime holds it,
to `stored_alarms`).
"""

from __future__ import annotations

from pathlib import Path

from runtime import RetentionPolicy, Runtime
from runtime.effects import EffectRun
from runtime.errors import ThreadStorageError
from runtime.storage.base import StorageBackend
from runtime.storage.memory import MemoryBackend
from runtime.storage.sqlite import SQLiteBackend, SQLiteRuntimeStore

BACKENDS = ("sqlite", "memory", "postgres")
"""Every backend the runtime tests run on (pytest parameter ids)."""

_EVERYTHING = RetentionPolicy(completed_seconds=1e12, failed_seconds=1e12)


def make_backend(name: str, data_dir: Path) -> StorageBackend:
    """A fresh backend by name (``data_dir`` is where the SQLite files go)."""
    if name == "sqlite":
        return SQLiteBackend(data_dir)
    if name == "memory":
        return MemoryBackend()
    if name == "postgres":  # a fresh schema in this test session's database
        from runtime.storage.postgres import PostgresBackend
        from tests.pg import fresh_url

        return PostgresBackend(fresh_url())
    raise ValueError(f"unknown backend {name!r}; one of {', '.join(BACKENDS)}")


def same_data(backend: StorageBackend) -> StorageBackend:
    """A backend on the data ``backend`` holds, for a second runtime (the memory one itself)."""
    if isinstance(backend, SQLiteBackend):
        return SQLiteBackend(backend.data_dir, backend.synchronous)
    if backend.kind == "postgres":
        from runtime.storage.postgres import PostgresBackend

        assert isinstance(backend, PostgresBackend)
        return PostgresBackend(backend.url, schema=backend.schema)
    return backend


def stored_alarms(rt: Runtime) -> dict[str, float]:
    """The durable alarm index as stored now (readable while the runtime runs)."""
    backend = rt.storage
    if isinstance(backend, MemoryBackend):
        with backend.lock:
            return dict(backend.alarms)
    if backend.kind == "postgres":  # a second connection: the runtime holds the lock
        from tests.pg import query

        url = f"{backend.url}?schema={backend.schema}"  # type: ignore[attr-defined]
        return {str(t): float(d) for t, d in query(url, "SELECT thread_id, due_at FROM alarms")}  # type: ignore[arg-type]
    assert isinstance(backend, SQLiteBackend)
    # A second connection: the runtime's own is in use; WAL lets both read.
    store = SQLiteRuntimeStore(backend.runtime_path)
    try:
        return dict(store.load_alarms())
    finally:
        store.close()


def stored_runs(backend: StorageBackend, thread_id: str) -> list[EffectRun]:
    """Every run a thread's store holds, newest first, including those past retention.

    Call it when no runtime holds the backend (or, for SQLite, while one does).
    """
    if backend.kind == "postgres" and not backend.connection_held():
        # A closed PostgreSQL backend opens no store: read through one on the same data.
        twin = same_data(backend)
        twin.open().close()
        try:
            return stored_runs(twin, thread_id)
        finally:
            twin.close()
    store = backend.open_thread_store(thread_id)
    try:
        runs, _ = store.list_runs(0.0, _EVERYTHING, limit=1_000_000)
        return runs
    finally:
        store.close()


def has_thread_store(backend: StorageBackend, thread_id: str) -> bool:
    """Whether the backend holds a store for the thread (SQLite: its file exists)."""
    if isinstance(backend, SQLiteBackend):
        return backend.thread_path(thread_id).exists()
    if backend.kind == "postgres":  # readable whether or not the backend is open
        from tests.pg import query

        url = f"{backend.url}?schema={backend.schema}"  # type: ignore[attr-defined]
        return bool(query(url, "SELECT 1 FROM thread_meta WHERE thread_id = %s", (thread_id,)))
    assert isinstance(backend, MemoryBackend)
    try:
        backend.open_thread_store(thread_id).close()
    except ThreadStorageError:
        return False
    return True
