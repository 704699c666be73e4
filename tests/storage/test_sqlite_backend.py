"""What only the SQLite backend has: the data-dir lock, file names, and the files themselves."""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from unittest.mock import ANY

import pytest

from runtime import EffectStatus, InvalidThreadId, RetentionPolicy
from runtime.effects import EffectRun
from runtime.errors import DataDirLocked
from runtime.storage.base import Finish, ThreadInfo
from runtime.storage.sqlite import SQLiteBackend

T0 = 1_800_000_000.0


def test_the_lock_names_its_holder_and_is_released_on_close(tmp_path: Path) -> None:
    first = SQLiteBackend(tmp_path)
    rtdb = first.open()
    with pytest.raises(DataDirLocked, match=rf"{tmp_path} is in use by pid {os.getpid()}"):
        SQLiteBackend(tmp_path).open()
    rtdb.close()
    first.close()
    second = SQLiteBackend(tmp_path)
    second.open().close()
    second.close()


def test_thread_ids_that_are_not_plain_file_names_are_refused(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path)
    for bad in ("../x", "", "a/b", "a" * 65, "é"):
        with pytest.raises(InvalidThreadId, match="must match"):
            backend.thread_path(bad)
        with pytest.raises(InvalidThreadId):
            backend.remove_thread_store(bad)
    assert backend.thread_path("t-1_a") == tmp_path / "threads" / "t-1_a.sqlite"


def test_an_invalid_synchronous_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous must be 'FULL' or 'NORMAL', got 'OFF'"):
        SQLiteBackend(tmp_path, "OFF")


def test_reads_never_write_to_the_file(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path)
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    for i in range(6):
        run = EffectRun(f"r{i}", "t", "record", EffectStatus.PENDING, None, T0 + i, T0)
        store.insert_run(run)
        store.finish_and_claim(None, T0 + i)
        status = EffectStatus.FAILED if i % 2 else EffectStatus.COMPLETED
        store.finish_and_claim(Finish(run.id, status, None, T0 + i), T0 + i, claim=False)
    # A second connection sees data_version change whenever another one commits.
    watcher = sqlite3.connect(backend.thread_path("t"))
    try:
        before = watcher.execute("PRAGMA data_version").fetchone()[0]
        # Past retention by age and by count: everything hidden, nothing deleted.
        policy = RetentionPolicy(max_finished=1, failed_seconds=1, completed_seconds=1)
        later = T0 + 86_400
        assert store.list_runs(later, policy) == ([], None)
        assert store.get_run("r5", later, policy) is None
        assert sum(store.count_runs(later, policy).values()) == 0
        assert store.pending_runs() == []
        assert store.all_messages() == []
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == before
        assert watcher.execute("SELECT count(*) FROM effect_runs").fetchone()[0] == 6
    finally:
        watcher.close()
        store.close()
        rtdb.close()
        backend.close()


def test_a_runtime_database_from_before_runtime_records_is_migrated(tmp_path: Path) -> None:
    from runtime.storage.records import EffectRecordStatus
    from runtime.storage.schema import RUNTIME_MIGRATIONS
    from runtime.storage.sqlite import RUNTIME_SCHEMA_VERSION

    # A runtime.sqlite at version 2 (threads, alarms, pause marks).
    path = tmp_path / "runtime.sqlite"
    conn = sqlite3.connect(path)
    for step in (0, 1):
        for statement in RUNTIME_MIGRATIONS[step]:
            conn.execute(statement)
    conn.execute("PRAGMA user_version=2")
    conn.commit()
    conn.close()
    backend = SQLiteBackend(tmp_path)
    rtdb = backend.open()
    try:
        assert rtdb.list_threads(10, None)[0] == []
        claim = rtdb.begin_record("s", "k", tool_name="t", run_id=None, owner="o",
                                  lease_seconds=60, now=T0)
        assert claim.claimed
        rtdb.complete_record("s", "k", owner="o", result_json="2", now=T0,
                             status=EffectRecordStatus.SUCCEEDED)
    finally:
        rtdb.close()
        backend.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == RUNTIME_SCHEMA_VERSION == 6
        assert conn.execute("SELECT thread_id, key, result FROM effect_records").fetchall() == [
            ("s", "k", "2")
        ]
    finally:
        conn.close()


def test_open_removes_only_orphan_thread_files_and_logs_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SQLiteBackend(tmp_path)
    rtdb = backend.open()
    kept = ThreadInfo(id="kept", created_at_ts=1.0)
    assert rtdb.add_thread(kept)
    backend.create_thread_store(kept).close()
    backend.create_thread_store(ThreadInfo(id="gone", created_at_ts=1.0)).close()
    rtdb.close()
    backend.close()
    threads = backend.threads_dir
    (threads / "gone.sqlite-wal").write_bytes(b"")  # its WAL, left beside it
    (threads / "lone-wal.sqlite-wal").write_bytes(b"")  # a WAL whose file already went
    foreign = ["notes.txt", "a.b.sqlite", "x.sqlite.bak", "backup.db"]
    for name in foreign:
        (threads / name).write_text("not a thread file")

    rtdb = backend.open()
    rtdb.close()
    backend.close()

    left = sorted(os.listdir(threads))
    assert left == sorted([*foreign, "kept.sqlite"])
    assert "gone.sqlite" in caplog.text and "no registry entry" in caplog.text


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_the_wal_is_checkpointed_off_the_committing_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synchronous: str
) -> None:
    import runtime.storage.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "CHECKPOINT_WAL_BYTES", 64 * 1024)
    backend = SQLiteBackend(tmp_path, synchronous)
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    checkpointer = backend._checkpointer
    assert checkpointer is not None
    try:
        # SQLite's own checkpoint would run in the committing call (on the event loop with
        # NORMAL; in a call a caller or a drain waits for with FULL).
        conn = store._conn
        assert conn is not None
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        for i in range(400):
            run = EffectRun(f"r{i}", "t", "record", EffectStatus.PENDING, {"pad": "x" * 500},
                            T0 + i, T0)
            store.insert_run(run)
        deadline = time.monotonic() + 10
        while checkpointer.done == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.done >= 1
        # The checkpoint copied the WAL into the file; nothing was lost.
        assert os.path.getsize(backend.thread_path("t")) > 64 * 1024
        reader = sqlite3.connect(backend.thread_path("t"))
        try:
            assert reader.execute("SELECT count(*) FROM effect_runs").fetchone()[0] == 400
        finally:
            reader.close()
    finally:
        store.close()
        rtdb.close()
        backend.close()
    # The backend's close stopped the checkpointing thread; a closed store is skipped.
    assert not any(t.name == "thread-effects-checkpoint" for t in threading.enumerate())
    store.checkpoint_aside()



@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_run_index_writes_skip_the_fsync_and_every_other_write_keeps_it(
    tmp_path: Path, synchronous: str
) -> None:
    # The index is rebuilt from the thread files after a crash (its complete mark is
    # False while a runtime runs), so its batches commit at NORMAL; alarm rows, the
    # registry and the mark itself stay at the store's own setting.
    backend = SQLiteBackend(tmp_path, synchronous)
    rtdb = backend.open()
    conn = rtdb._conn
    assert conn is not None
    level = {"FULL": 2, "NORMAL": 1}[synchronous]
    seen: list[tuple[str, int]] = []

    def trace(sql: str) -> None:
        if not sql.startswith("PRAGMA"):
            seen.append((sql.split()[0], level_now[0]))
        elif sql.startswith("PRAGMA synchronous="):
            level_now[0] = {"FULL": 2, "NORMAL": 1}[sql.split("=")[1]]

    level_now = [level]
    try:
        rtdb.add_thread(ThreadInfo(id="t", created_at_ts=T0))
        conn.set_trace_callback(trace)
        rtdb.index_runs([EffectRun("r1", "t", "record", EffectStatus.COMPLETED, None, T0, T0,
                                   finished_at_ts=T0)])
        index = list(seen)
        seen.clear()
        assert rtdb.prune_run_index(T0 + 365 * 86400, RetentionPolicy()) == 1
        prune = list(seen)
        seen.clear()
        rtdb.lower_alarm("t", T0 + 5)
        rtdb.set_run_index_complete(False)
        rtdb.touch_threads({"t": T0 + 9})
        others = list(seen)
        conn.set_trace_callback(None)
        assert {op for op, _ in index} >= {"INSERT", "COMMIT"}
        assert {op for op, _ in prune} >= {"DELETE", "COMMIT"}
        assert all(at == 1 for _, at in index + prune), index + prune
        assert {op for op, _ in others} >= {"INSERT", "UPDATE", "COMMIT"}
        assert all(at == level for _, at in others), others
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
        # What the NORMAL commits wrote is there for the next connection.
        reader = sqlite3.connect(backend.runtime_path)
        try:
            assert reader.execute("SELECT count(*) FROM run_index").fetchone()[0] == 0
            assert reader.execute("SELECT due_at FROM alarms").fetchall() == [(T0 + 5,)]
        finally:
            reader.close()
    finally:
        rtdb.close()
        backend.close()


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_a_claim_alone_skips_the_fsync_and_every_outcome_and_schedule_keeps_it(
    tmp_path: Path, synchronous: str
) -> None:
    # Under FULL a claim with no outcome commits at NORMAL: a process crash keeps it, and
    # the next FULL commit of the file (the run's outcome at the latest) syncs it. The
    # schedule, the outcome and an outcome with the next claim stay at the store's level.
    backend = SQLiteBackend(tmp_path, synchronous)
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    conn = store._conn  # type: ignore[attr-defined]
    level = {"FULL": 2, "NORMAL": 1}[synchronous]
    level_now = [level]
    commits: list[int] = []

    def trace(sql: str) -> None:
        if sql.startswith("PRAGMA synchronous="):
            level_now[0] = {"FULL": 2, "NORMAL": 1}[sql.split("=")[1]]
        elif sql == "COMMIT":
            commits.append(level_now[0])

    try:
        conn.set_trace_callback(trace)
        a = EffectRun("a", "t", "record", EffectStatus.PENDING, None, T0, T0)
        b = EffectRun("b", "t", "record", EffectStatus.PENDING, None, T0, T0)
        for r in (a, b):
            store.insert_run(r)
        assert commits == [level, level]
        commits.clear()
        _, claimed, _ = store.finish_and_claim(None, T0)
        assert claimed is not None and claimed.id == "a"
        assert commits == [1]
        commits.clear()
        # The outcome and the next claim in one transaction: synced.
        finished, claimed, _ = store.finish_and_claim(Finish("a", EffectStatus.COMPLETED,
                                                             None, T0 + 1), T0 + 1)
        assert finished is not None and claimed is not None and claimed.id == "b"
        assert commits == [level]
        commits.clear()
        store.finish_and_claim(Finish("b", EffectStatus.COMPLETED, None, T0 + 2), T0 + 2,
                               claim=False)
        assert commits == [level]
        commits.clear()
        # Nothing due: a probe that writes nothing, and the connection is back at its level.
        assert store.claim_inline(T0 + 3) == (None, None, None)
        assert commits == []
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
    finally:
        conn.set_trace_callback(None)
        store.close()
        rtdb.close()
        backend.close()
    # What the claim committed without its own fsync is in the file for the next process.
    reader = sqlite3.connect(backend.thread_path("t"))
    try:
        assert reader.execute(
            "SELECT id, status, attempts FROM effect_runs ORDER BY id").fetchall() == [
            ("a", "completed", 1), ("b", "completed", 1)]
    finally:
        reader.close()


def test_a_claim_on_the_loop_never_waits_for_a_store_another_thread_holds(
    tmp_path: Path,
) -> None:
    # `claim_inline` is called on the event loop: while a storage thread holds the store
    # (a listing, a schedule waiting for its fsync) it answers None at once, claims
    # nothing, and the caller sends `finish_and_claim` to a storage thread instead.
    backend = SQLiteBackend(tmp_path)
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    try:
        store.insert_run(EffectRun("a", "t", "record", EffectStatus.PENDING, None, T0, T0))
        held = threading.Event()
        release = threading.Event()

        def hold() -> None:
            def tx(c: sqlite3.Connection) -> None:
                held.set()
                release.wait(10)
            store._tx(tx, write=False)  # type: ignore[attr-defined]

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        started = time.monotonic()
        assert store.claim_inline(T0) is None
        assert time.monotonic() - started < 0.5
        release.set()
        holder.join(10)
        assert [r.id for r in store.pending_runs()] == ["a"]
        _, claimed, next_due = store.claim_inline(T0) or (None, None, None)
        assert claimed is not None and claimed.id == "a" and claimed.attempts == 1
        assert next_due is None
    finally:
        store.close()
        rtdb.close()
        backend.close()


def test_a_group_commit_flushes_the_wal_once_before_anything_is_read_or_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FULL: an outcome with the next claim and ``durable=False`` commits at NORMAL; one
    # fdatasync of the WAL (or the next FULL commit that writes) makes it durable, and
    # every read, a commit that claims nothing and the close come after such a flush.
    backend = SQLiteBackend(tmp_path, "FULL")
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    conn = store._conn  # type: ignore[attr-defined]
    assert store.group_commit
    log: list[str] = []
    fdatasync = os.fdatasync

    def counted(fd: int) -> None:
        fdatasync(fd)
        log.append("flush")

    def trace(sql: str) -> None:
        if sql.startswith("PRAGMA synchronous="):
            log.append(sql.split("=")[1])
        elif sql == "COMMIT":
            log.append("COMMIT")

    def taken() -> list[str]:
        # "NORMAL" then "COMMIT" then "FULL": a commit without its own fsync.
        got = [x for x in log if x != "FULL"]
        log.clear()
        return got

    def finish(run_id: str, at: float, **kw: object) -> tuple[object, ...]:
        return store.finish_and_claim(Finish(run_id, EffectStatus.COMPLETED, None, at), at,
                                      **kw)  # type: ignore[arg-type]

    try:
        for i in range(6):
            store.insert_run(EffectRun(f"r{i}", "t", "record", EffectStatus.PENDING, None,
                                       T0, T0))
        monkeypatch.setattr(os, "fdatasync", counted)
        conn.set_trace_callback(trace)
        store.finish_and_claim(None, T0)
        assert taken() == ["NORMAL", "COMMIT"]
        finish("r0", T0 + 1, durable=False)
        assert taken() == ["NORMAL", "COMMIT"]
        # A read flushes first, once.
        got = store.get_run("r0", T0 + 1, RetentionPolicy())
        assert got is not None and got.status is EffectStatus.COMPLETED
        store.get_run("r1", T0 + 1, RetentionPolicy())
        assert taken() == ["flush"]
        # A FULL commit that writes syncs what came before it: no flush of its own.
        finish("r1", T0 + 2, durable=False)
        store.insert_run(EffectRun("r9", "t", "record", EffectStatus.PENDING, None,
                                   T0 + 99, T0))
        assert taken() == ["NORMAL", "COMMIT", "COMMIT"]
        store.sync()
        assert taken() == []
        # `sync`: one flush for several outcomes, then nothing to do.
        finish("r2", T0 + 3, durable=False)
        finish("r3", T0 + 4, durable=False)
        store.sync()
        store.sync()
        assert taken() == ["NORMAL", "COMMIT", "NORMAL", "COMMIT", "flush"]
        # A durable outcome after an unsynced one: its FULL commit syncs both.
        finish("r4", T0 + 5, durable=False)
        finish("r5", T0 + 6)
        assert taken() == ["NORMAL", "COMMIT", "COMMIT"]
        # The last outcome of a group claims nothing: flushed before the call returns.
        store.finish_and_claim(None, T0 + 99)
        taken()
        finish("r9", T0 + 100, durable=False)
        assert taken() == ["NORMAL", "COMMIT", "flush"]
        # On the caller's thread: never a flush, not even when it claims nothing (the
        # caller syncs off the loop), and declined while another thread holds the store.
        for rid in ("rc", "rd"):
            store.insert_run(EffectRun(rid, "t", "record", EffectStatus.PENDING, None,
                                       T0 + 99, T0))
        store.finish_and_claim(None, T0 + 100)
        taken()
        assert store.finish_inline(Finish("rc", EffectStatus.COMPLETED, None, T0 + 100),
                                   T0 + 100) is not None
        assert store.finish_inline(Finish("rd", EffectStatus.COMPLETED, None, T0 + 100),
                                   T0 + 100) == (ANY, None, None)
        assert taken() == ["NORMAL", "COMMIT", "NORMAL", "COMMIT"]
        with store._lock:  # type: ignore[attr-defined]
            assert store.finish_inline(Finish("rd", EffectStatus.FAILED, None, T0), T0) is None
        store.sync()
        assert taken() == ["flush"]
        # What is committed without a flush is in the file for a crash's next process.
        store.finish_and_claim(None, T0 + 100)
        reader = sqlite3.connect(backend.thread_path("t"))
        try:
            assert reader.execute("SELECT count(*) FROM effect_runs WHERE status = "
                                  "'completed'").fetchone()[0] == 9
        finally:
            reader.close()
        # Closed with an outcome still unsynced: flushed first.
        for rid in ("ra", "rb"):
            store.insert_run(EffectRun(rid, "t", "record", EffectStatus.PENDING, None,
                                       T0 + 100, T0))
        store.finish_and_claim(None, T0 + 100)
        finish("ra", T0 + 101, durable=False)
        taken()
        store.close()
        assert taken() == ["flush"]
    finally:
        store.close()
        rtdb.close()
        backend.close()


def test_a_flush_in_progress_leaves_the_store_free_and_covers_what_came_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `sync` waits for the disk without the store's lock: an outcome and a claim on the
    # loop go on meanwhile, and one committed during the flush is flushed by the next.
    backend = SQLiteBackend(tmp_path, "FULL")
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    entered, go = threading.Event(), threading.Event()
    fdatasync = os.fdatasync
    flushes: list[int] = []

    def slow(fd: int) -> None:
        entered.set()
        assert go.wait(30)
        fdatasync(fd)
        flushes.append(fd)

    try:
        for i in range(3):
            store.insert_run(EffectRun(f"r{i}", "t", "record", EffectStatus.PENDING, None,
                                       T0, T0))
        store.finish_and_claim(None, T0)
        done = store.finish_inline(Finish("r0", EffectStatus.COMPLETED, None, T0 + 1), T0 + 1)
        assert done is not None and done[1] is not None and done[1].id == "r1"
        monkeypatch.setattr(os, "fdatasync", slow)
        flusher = threading.Thread(target=store.sync)
        flusher.start()
        assert entered.wait(30)
        # The flush is on the disk: the store still answers on the caller's thread.
        done = store.finish_inline(Finish("r1", EffectStatus.COMPLETED, None, T0 + 2), T0 + 2)
        assert done is not None and done[1] is not None and done[1].id == "r2"
        go.set()
        flusher.join(30)
        assert len(flushes) == 1
        # r1's outcome was committed after that flush began: the next one covers it.
        store.sync()
        assert len(flushes) == 2
        store.sync()
        assert len(flushes) == 2
    finally:
        go.set()
        store.close()
        rtdb.close()
        backend.close()


def test_a_normal_store_has_no_group_commit_and_every_outcome_keeps_its_level(
    tmp_path: Path,
) -> None:
    backend = SQLiteBackend(tmp_path, "NORMAL")
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    try:
        assert not store.group_commit
        for i in range(2):
            store.insert_run(EffectRun(f"r{i}", "t", "record", EffectStatus.PENDING, None,
                                       T0, T0))
        store.finish_and_claim(None, T0)
        finished, claimed, _ = store.finish_and_claim(
            Finish("r0", EffectStatus.COMPLETED, None, T0), T0, durable=False)
        assert finished is not None and claimed is not None and claimed.id == "r1"
        store.sync()
        assert store._wal_fd is None  # type: ignore[attr-defined]
    finally:
        store.close()
        rtdb.close()
        backend.close()


def test_new_files_get_1_kib_pages_and_older_files_keep_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime.storage import sqlite as sqlite_backend

    def page_size(path: Path) -> int:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(conn.execute("PRAGMA page_size").fetchone()[0])
        finally:
            conn.close()

    # A data dir made by a runtime from before (SQLite's default page size).
    monkeypatch.setattr(sqlite_backend, "PAGE_SIZE_BYTES", 4096)
    old = SQLiteBackend(tmp_path)
    rtdb = old.open()
    info = ThreadInfo(id="old", created_at_ts=T0)
    old.create_thread_store(info).close()
    assert rtdb.add_thread(info)
    rtdb.close()
    old.close()
    monkeypatch.undo()

    backend = SQLiteBackend(tmp_path)
    backend.open()
    try:
        new = backend.create_thread_store(ThreadInfo(id="new", created_at_ts=T0))
        older = backend.open_thread_store("old")
        for store in (new, older):
            run = EffectRun("r", "t", "record", EffectStatus.PENDING, None, T0, T0)
            store.insert_run(run)
            _, claimed, _ = store.finish_and_claim(None, T0)
            assert claimed is not None and claimed.status is EffectStatus.RUNNING
            done, _, _ = store.finish_and_claim(
                Finish("r", EffectStatus.COMPLETED, None, T0 + 1), T0 + 1, claim=False)
            assert done is not None and done.status is EffectStatus.COMPLETED
            store.close()
    finally:
        backend.close()
    assert page_size(backend.thread_path("new")) == 1024
    assert page_size(backend.thread_path("old")) == 4096  # fixed when the file was made
    assert page_size(backend.runtime_path) == 4096
    fresh = SQLiteBackend(tmp_path / "fresh")
    fresh.open()
    fresh.close()
    assert page_size(fresh.runtime_path) == 1024


def test_none_binds_as_null_through_an_adapter_and_an_applications_own_adapter_stays(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from runtime.storage import sqlite as sqlite_backend  # registers the adapter

    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] == sqlite_backend._NOTHING.get
    conn = sqlite3.connect(":memory:")
    try:
        assert conn.execute("SELECT ? IS NULL, typeof(?)", (None, None)).fetchone() == (
            1, "null")
    finally:
        conn.close()
    # A store's None fields are stored as NULL and read back as None.
    backend = SQLiteBackend(tmp_path)
    backend.open()
    try:
        store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
        store.insert_run(EffectRun("r", "t", "record", EffectStatus.PENDING, None, T0, T0))
        [run] = store.pending_runs()
        assert (run.args, run.key, run.replay_of, run.schedule_id) == (None, None, None, None)
        store.close()
    finally:
        backend.close()
    conn = sqlite3.connect(backend.thread_path("t"))
    try:
        assert conn.execute("SELECT typeof(args), typeof(\"key\"), typeof(replay_of) "
                            "FROM effect_runs").fetchone() == ("null", "null", "null")
    finally:
        conn.close()
    # An application that registered its own adapter of None first keeps it.
    code = (
        "import sqlite3\n"
        "def mine(value): return 'none'\n"
        "sqlite3.register_adapter(type(None), mine)\n"
        "import runtime.storage.sqlite\n"
        "assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is mine\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _dead_weakrefs() -> int:
    """Weak references the collector tracks whose object is gone."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is weakref.ref and o() is None)


def test_a_busy_store_leaves_no_dead_cursor_references_for_the_collector(
    tmp_path: Path,
) -> None:
    # sqlite3 keeps a weak reference to every cursor a connection made and prunes the
    # dead ones every 200 cursors: a cursor per statement left up to 200 per open file
    # for every full collection to walk. The stores run theirs on one kept cursor.
    backend = SQLiteBackend(tmp_path, "NORMAL")
    rtdb = backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    assert rtdb.add_thread(ThreadInfo(id="t", created_at_ts=T0))
    try:
        before = _dead_weakrefs()
        most = 0  # the dead references pile up, then are pruned: look along the way
        for i in range(150):  # 9 statements each: over 1,300 on one connection
            run = EffectRun(f"r{i}", "t", "record", EffectStatus.PENDING, {"i": i}, T0 + i, T0)
            assert store.insert_run(run) is None
            _, claimed, _ = store.finish_and_claim(None, T0 + i)
            assert claimed is not None and claimed.id == run.id
            done, _, _ = store.finish_and_claim(
                Finish(run.id, EffectStatus.COMPLETED, None, T0 + i, attempt=1), T0 + i,
                claim=False)
            assert done is not None and done.status is EffectStatus.COMPLETED
            rtdb.index_runs([done])
            if i % 10 == 9:
                most = max(most, _dead_weakrefs() - before)
        assert [a.outcome for a in store.run_attempts("r149")] == ["completed"]
        assert most < 10  # a cursor per statement: 100 to 200
    finally:
        store.close()
        rtdb.close()
        backend.close()


def test_a_finish_answers_the_run_as_written_whether_this_store_claimed_it_or_not(
    tmp_path: Path,
) -> None:
    # A store answers a finish of a run it claimed from what the claim returned (not the
    # whole row again); the answer must still be the row as written, args included.
    backend = SQLiteBackend(tmp_path, "NORMAL")
    backend.open()
    store = backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0))
    retention = RetentionPolicy()
    try:
        for i, args in enumerate(({"n": [1]}, None)):
            assert store.insert_run(EffectRun(
                f"r{i}", "t", "record", EffectStatus.PENDING, args, T0 + i, T0, key=f"k{i}",
                trace_context="00-ab" if i else None)) is None
        _, claimed, _ = store.finish_and_claim(None, T0 + 5)
        assert claimed is not None and claimed.id == "r0" and claimed.args == {"n": [1]}
        claimed.args["n"].append(2)  # what an effect may do to the args it was given
        finished, second, _ = store.finish_and_claim(
            Finish("r0", EffectStatus.FAILED, "boom", T0 + 6, attempt=1), T0 + 6)
        assert finished == store.get_run("r0", T0 + 6, retention)
        assert finished == EffectRun(
            "r0", "t", "record", EffectStatus.FAILED, {"n": [1]}, T0, T0, T0 + 5, T0 + 6, 1,
            "boom", key="k0")
        assert second is not None and second.id == "r1" and second.trace_context == "00-ab"
        # A stale attempt writes nothing and answers nothing.
        stale, _, _ = store.finish_and_claim(
            Finish("r1", EffectStatus.COMPLETED, None, T0 + 7, attempt=2), T0 + 7, claim=False)
        assert stale is None
        # Claimed by the store before it was closed: the file opened again answers from
        # the row.
        store.close()
        store = backend.open_thread_store("t")
        finished, _, _ = store.finish_and_claim(
            Finish("r1", EffectStatus.CANCELED, None, T0 + 8, canceled_by="u", attempt=1),
            T0 + 8, claim=False)
        assert finished == store.get_run("r1", T0 + 8, retention)
        assert finished == EffectRun(
            "r1", "t", "record", EffectStatus.CANCELED, None, T0 + 1, T0, T0 + 6, T0 + 8, 1,
            key="k1", canceled_by="u")
        # Interrupted, claimed again: the finish answers the second attempt.
        assert store.insert_run(EffectRun(
            "r2", "t", "record", EffectStatus.PENDING, {"x": 1}, T0, T0)) is None
        _, claimed, _ = store.finish_and_claim(None, T0 + 9)
        assert claimed is not None and claimed.id == "r2"
        [requeued] = store.recover_interrupted(T0 + 10, 3)
        assert requeued.status is EffectStatus.PENDING
        _, claimed, _ = store.finish_and_claim(None, T0 + 11)
        assert claimed is not None and claimed.attempts == 2
        finished, _, _ = store.finish_and_claim(
            Finish("r2", EffectStatus.COMPLETED, None, T0 + 12, attempt=2), T0 + 12,
            claim=False)
        assert finished == store.get_run("r2", T0 + 12, retention)
        assert finished is not None and (finished.started_at_ts, finished.attempts) == (
            T0 + 11, 2)
    finally:
        store.close()
        backend.close()
