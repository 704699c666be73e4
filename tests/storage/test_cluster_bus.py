"""The cluster bus: LISTEN/NOTIFY between backends sharing one PostgreSQL schema.

Two backends opened on one schema in this process stand for two nodes; everything goes
through the real server (127.0.0.1:5432).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest

from runtime.storage.base import MAX_PAYLOAD_BYTES
from runtime.storage.memory import MemoryBackend
from runtime.storage.pg_bus import server_channel
from runtime.storage.postgres import PostgresBackend, PostgresRuntimeStore, split_schema
from runtime.storage.sqlite import SQLiteBackend

_node_ids = itertools.count(1)


async def _open(url: str) -> PostgresBackend:
    return (await _open_with_store(url))[0]


async def _open_with_store(url: str) -> tuple[PostgresBackend, PostgresRuntimeStore]:
    # Several nodes on one schema in this process: each with its own node id.
    backend = PostgresBackend(url, node_id=f"bus-node-{next(_node_ids)}")
    return backend, await asyncio.to_thread(backend.open)


@pytest.fixture
async def nodes(pg_url: str) -> AsyncIterator[tuple[PostgresBackend, PostgresBackend]]:
    a = await _open(pg_url)
    b = await _open(pg_url)
    try:
        yield a, b
    finally:
        await asyncio.to_thread(a.close)
        await asyncio.to_thread(b.close)


class Inbox:
    """What one listener received, awaitable."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.resyncs = 0
        self._changed = asyncio.Event()

    def __call__(self, payload: str) -> None:
        self.payloads.append(payload)
        self._changed.set()

    def resync(self) -> None:
        self.resyncs += 1
        self._changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(10.0):
            while not done():
                self._changed.clear()
                await self._changed.wait()


async def test_a_notification_from_one_node_reaches_every_listener_of_the_other(
    nodes: tuple[PostgresBackend, PostgresBackend],
) -> None:
    a, b = nodes
    first, second, other = Inbox(), Inbox(), Inbox()
    b.cluster.listen("wake", first, on_reconnect=first.resync)
    b.cluster.listen("wake", second)
    b.cluster.listen("frames", other)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)
    await first.until(lambda: first.resyncs == 1)  # told when the listening took effect

    await asyncio.to_thread(a.cluster.notify, "wake", "t1 12.5")
    await asyncio.to_thread(a.cluster.notify, "wake", "t2 \x00 é")  # NUL and UTF-8 kept
    await first.until(lambda: len(first.payloads) == 2)
    await second.until(lambda: len(second.payloads) == 2)
    assert first.payloads == second.payloads == ["t1 12.5", "t2 \x00 é"]
    assert other.payloads == []  # another channel hears nothing

    b.cluster.unlisten("wake", second)
    await asyncio.to_thread(a.cluster.notify, "wake", "t3")
    await first.until(lambda: len(first.payloads) == 3)
    assert second.payloads == ["t1 12.5", "t2 \x00 é"]


async def test_a_notification_queued_in_a_transaction_is_sent_at_commit_only(
    nodes: tuple[PostgresBackend, PostgresBackend],
) -> None:
    a, b = nodes
    inbox = Inbox()
    b.cluster.listen("runs", inbox)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)

    def rolled_back() -> None:
        with pytest.raises(ZeroDivisionError), a.transaction() as cur:
            a.cluster.notify_sql(cur, "runs", "lost")
            raise ZeroDivisionError

    def committed() -> None:
        with a.transaction() as cur:
            a.cluster.notify_sql(cur, "runs", "one")
            a.cluster.notify_sql(cur, "runs", "two")

    await asyncio.to_thread(rolled_back)
    await asyncio.to_thread(committed)
    await inbox.until(lambda: len(inbox.payloads) == 2)
    assert inbox.payloads == ["one", "two"]


async def test_schemas_sharing_a_database_do_not_hear_each_other(pg_url: str) -> None:
    base, schema = split_schema(pg_url)
    mine = await _open(pg_url)
    theirs = await _open(f"{base}?schema={schema}_other")
    try:
        heard = Inbox()
        theirs.cluster.listen("wake", heard)
        assert await asyncio.to_thread(theirs.cluster.flush, 10.0)
        await asyncio.to_thread(mine.cluster.notify, "wake", "not yours")
        await asyncio.to_thread(theirs.cluster.notify, "wake", "yours")
        await heard.until(lambda: len(heard.payloads) == 1)
        assert heard.payloads == ["yours"]
    finally:
        await asyncio.to_thread(mine.close)
        await asyncio.to_thread(theirs.close)


async def test_after_the_listening_connection_is_terminated_it_reconnects_and_says_so(
    nodes: tuple[PostgresBackend, PostgresBackend], pg_url: str,
) -> None:
    a, b = nodes
    inbox = Inbox()
    b.cluster.listen("wake", inbox, on_reconnect=inbox.resync)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)
    await inbox.until(lambda: inbox.resyncs == 1)

    base, _ = split_schema(pg_url)
    name = f"thread-effects-bus:{b.schema}"
    with psycopg.connect(base, autocommit=True) as admin:
        pids = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchall()
        assert len(pids) == 2  # one listening connection per node
        mine = b.cluster._conn
        assert mine is not None
        admin.execute("SELECT pg_terminate_backend(%s)", (mine.info.backend_pid,))

    await inbox.until(lambda: inbox.resyncs == 2)  # listening again: resync
    assert await asyncio.to_thread(b.cluster.flush, 10.0)
    assert b.cluster.connected
    await asyncio.to_thread(a.cluster.notify, "wake", "after")
    await inbox.until(lambda: inbox.payloads == ["after"])


async def test_each_loss_of_the_listening_connection_is_retried_after_the_first_delay(
    nodes: tuple[PostgresBackend, PostgresBackend], pg_url: str,
) -> None:
    # Before, every cut doubled the gap (0.2, 0.4, ... 10 s) for the
    # process's life, although each reconnect had worked.
    _, b = nodes
    inbox = Inbox()
    b.cluster.listen("wake", inbox, on_reconnect=inbox.resync)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)
    await inbox.until(lambda: inbox.resyncs == 1)
    base, _ = split_schema(pg_url)
    gaps = []
    with psycopg.connect(base, autocommit=True) as admin:
        for cut in range(1, 7):
            conn = b.cluster._conn
            assert conn is not None
            started = time.monotonic()
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            await inbox.until(lambda cut=cut: inbox.resyncs == cut + 1)  # type: ignore[misc]
            gaps.append(time.monotonic() - started)
    # 0.2 s each (plus the connect); before, the sixth took 6.4 s.
    assert max(gaps) < 1.5, gaps


async def test_bad_channels_and_oversized_payloads_are_refused(
    nodes: tuple[PostgresBackend, PostgresBackend],
) -> None:
    a, _ = nodes
    with pytest.raises(ValueError, match="Invalid cluster channel name 'Wake Up'"):
        a.cluster.listen("Wake Up", print)
    with pytest.raises(ValueError, match="Invalid cluster channel name"):
        a.cluster.notify("x" * 41, "")
    with pytest.raises(ValueError, match=f"7901 bytes, over the limit of {MAX_PAYLOAD_BYTES}"):
        a.cluster.notify("wake", "x" * 7901)
    with pytest.raises(ValueError, match="over the limit"):
        a.cluster.notify("wake", "é" * 3951)  # 7,902 bytes in UTF-8
    await asyncio.to_thread(a.cluster.notify, "wake", "x" * MAX_PAYLOAD_BYTES)


def test_listening_needs_an_event_loop(pg_url: str) -> None:
    backend = PostgresBackend(pg_url)
    with pytest.raises(RuntimeError, match="no event loop is running"):
        backend.cluster.listen("wake", print)


def test_long_schema_names_get_a_hashed_channel_within_the_identifier_limit() -> None:
    assert server_channel("app", "wake") == "app:wake"
    long = server_channel("s" * 63, "x" * 40)
    assert long.startswith("te:") and len(long) <= 63
    assert long != server_channel("s" * 63, "x" * 39 + "y")


def test_backends_without_a_server_have_no_cluster(tmp_path: object) -> None:
    assert MemoryBackend().cluster is None
    assert SQLiteBackend(tmp_path).cluster is None  # type: ignore[arg-type]


def _as_version(pg_url: str, version: int) -> None:
    """A fresh schema left as ``version`` left it (what later steps add is dropped)."""
    from runtime.storage.pg_schema import SCHEMA_VERSION

    assert SCHEMA_VERSION == 5
    backend = PostgresBackend(pg_url)
    backend.open().close()
    backend.close()
    base, schema = split_schema(pg_url)
    with psycopg.connect(base, autocommit=True) as conn:
        if version < 5:  # step 4: the effects each node runs
            conn.execute(f"ALTER TABLE {schema}.nodes DROP COLUMN effects")
        if version < 4:  # step 3: which nodes claim runs
            conn.execute(f"ALTER TABLE {schema}.nodes DROP COLUMN claims")
        if version < 3:  # step 2: node leases, turn leases, each attempt's node
            conn.execute(f"DROP TABLE {schema}.nodes, {schema}.turn_leases")
            conn.execute(f"ALTER TABLE {schema}.run_attempts DROP COLUMN node_id")
        if version < 2:  # step 1: frames across nodes, the alarms' due index
            conn.execute(f"DROP TABLE {schema}.frames, {schema}.frame_counters")
            conn.execute(f"DROP INDEX {schema}.ix_alarms_due")
        conn.execute(f"UPDATE {schema}.schema_version SET version = %s", (version,))


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_older_schema_is_migrated_step_by_step_to_hold_frames_and_node_leases(
    pg_url: str, version: int,
) -> None:
    _as_version(pg_url, version)
    backend = PostgresBackend(pg_url)
    backend.open().close()
    try:
        assert backend.schema_version() == 5
        with backend.transaction() as cur:
            assert cur.execute("SELECT count(*) FROM frames").fetchone() == (0,)
            assert cur.execute("SELECT to_regclass('ix_alarms_due') IS NOT NULL").fetchone() \
                == (True,)
            assert cur.execute("SELECT count(*) FROM turn_leases").fetchone() == (0,)
            assert cur.execute("SELECT node_id, claims, effects FROM nodes").fetchall() == [
                (backend.node_id, True, None)]  # recorded once the runtime knows its effects
            assert cur.execute("SELECT count(node_id) FROM run_attempts").fetchone() == (0,)
    finally:
        backend.close()


async def test_frames_are_numbered_per_thread_stored_announced_and_pruned(
    nodes: tuple[PostgresBackend, PostgresBackend],
) -> None:
    from runtime.storage.base import FrameDraft, decode_frames

    a, b = nodes
    inbox = Inbox()
    b.cluster.listen("frames", inbox)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)

    def draft(thread_id: str, size: int = 10) -> FrameDraft:
        return FrameDraft(thread_id, "effect_changed",
                          lambda seq: f'{{"seq":{seq},"pad":"{"x" * size}"}}')

    seqs = await asyncio.to_thread(
        a.cluster.append_frames, [draft("t1"), draft("t2"), draft("t1"), draft("t1", 9000)],
        1000.0)
    assert seqs == [1, 1, 2, 3]
    assert await asyncio.to_thread(b.cluster.append_frames, [draft("t1")], 2000.0) == [4]
    await inbox.until(lambda: len(inbox.payloads) == 2)
    sender, frames = decode_frames(inbox.payloads[0])
    assert sender == a.cluster.sender
    assert [(f.thread_id, f.seq) for f in frames] == [("t1", 1), ("t2", 1), ("t1", 2), ("t1", 3)]
    assert frames[0].text == '{"seq":1,"pad":"xxxxxxxxxx"}'
    assert frames[3].text is None  # too large to carry: read it from the table
    stored = await asyncio.to_thread(a.cluster.read_frames, "t1", 1, 3)
    assert [s for s, _, _ in stored] == [2, 3]
    assert len(stored[1][2]) > 9000
    assert await asyncio.to_thread(a.cluster.prune_frames, 1500.0) == 4
    assert [s for s, _, _ in await asyncio.to_thread(a.cluster.read_frames, "t1", 0)] == [4]


async def test_frames_numbered_in_their_changes_keep_their_numbers_and_are_stored_once(
    nodes: tuple[PostgresBackend, PostgresBackend],
) -> None:
    from runtime.storage.base import FrameDraft, decode_frames

    a, b = nodes
    inbox = Inbox()
    b.cluster.listen("frames", inbox)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)

    def numbered(thread_id: str, seq: int, text: str) -> FrameDraft:
        # As a run's ``scheduled`` frame, numbered by the statement that stored the run.
        return FrameDraft(thread_id, "effect_changed", lambda s: f'{{"seq":{s},"x":"{text}"}}',
                          seq)

    batch = [numbered("t1", 7, "a"), numbered("t2", 3, "b"), numbered("t1", 8, "c")]
    assert await asyncio.to_thread(a.cluster.append_frames, batch, 1000.0) == [7, 3, 8]
    # The same batch again (its commit's answer lost, retried): stored once, kept as it was.
    retried = [numbered("t1", 7, "other")]
    assert await asyncio.to_thread(a.cluster.append_frames, retried, 1001.0) == [7]
    await inbox.until(lambda: len(inbox.payloads) == 2)
    sender, frames = decode_frames(inbox.payloads[0])
    assert sender == a.cluster.sender
    assert [(f.thread_id, f.seq, f.text) for f in frames] == [
        ("t1", 7, '{"seq":7,"x":"a"}'), ("t2", 3, '{"seq":3,"x":"b"}'),
        ("t1", 8, '{"seq":8,"x":"c"}')]
    assert await asyncio.to_thread(a.cluster.read_frames, "t1", 0) == [
        (7, "effect_changed", '{"seq":7,"x":"a"}'), (8, "effect_changed", '{"seq":8,"x":"c"}')]
    # They took no number: the thread's next unnumbered frame follows its counter (none yet).
    plain = FrameDraft("t2", "effect_changed", lambda s: f'{{"seq":{s}}}')
    assert await asyncio.to_thread(a.cluster.append_frames, [plain], 1002.0) == [1]


async def test_a_threads_deletion_numbers_stores_and_announces_its_frame_in_its_own_transaction(
    nodes: tuple[PostgresBackend, PostgresBackend], pg_url: str,
) -> None:
    _, b = nodes
    inbox = Inbox()
    b.cluster.listen("frames", inbox)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)
    a, store = await _open_with_store(pg_url)
    try:
        await _delete_announced(a, store, inbox)
    finally:
        await asyncio.to_thread(a.close)


async def _delete_announced(
    a: PostgresBackend, store: PostgresRuntimeStore, inbox: Inbox,
) -> None:
    from runtime.storage.base import FrameDraft, ThreadInfo, decode_frames

    assert await asyncio.to_thread(store.add_thread, ThreadInfo(id="t1", created_at_ts=1.0))
    assert await asyncio.to_thread(a.cluster.append_frames, [
        FrameDraft("t1", "effect_changed", lambda seq: f'{{"seq":{seq}}}')], 1000.0) == [1]
    rendered: list[int] = []

    def deleted(thread_id: str) -> FrameDraft:
        def render(seq: int) -> str:
            rendered.append(seq)
            return f'{{"eventType":"thread_deleted","seq":{seq}}}'
        return FrameDraft(thread_id, "thread_deleted", render)

    assert await asyncio.to_thread(store.delete_thread, "t1", frame=deleted("t1"), now=1001.0)
    # A thread that does not exist (deleted already): no frame, no number taken.
    assert not await asyncio.to_thread(store.delete_thread, "t1", frame=deleted("t1"),
                                       now=1002.0)
    assert rendered == [2]
    await inbox.until(lambda: len(inbox.payloads) == 2)
    sender, frames = decode_frames(inbox.payloads[1])
    assert sender == a.cluster.sender
    assert [(f.thread_id, f.seq, f.kind, f.text) for f in frames] == [
        ("t1", 2, "thread_deleted", '{"eventType":"thread_deleted","seq":2}')]
    assert await asyncio.to_thread(a.cluster.read_frames, "t1", 1) == [
        (2, "thread_deleted", '{"eventType":"thread_deleted","seq":2}')]
    assert await asyncio.to_thread(store.get_thread, "t1") is None


async def test_a_threads_deletion_sends_its_notification_at_its_commit_only_if_it_existed(
    nodes: tuple[PostgresBackend, PostgresBackend], pg_url: str,
) -> None:
    from runtime.storage.base import FrameDraft, ThreadInfo

    _, b = nodes
    inbox = Inbox()
    b.cluster.listen("commands", inbox)
    assert await asyncio.to_thread(b.cluster.flush, 10.0)
    a, store = await _open_with_store(pg_url)
    try:
        assert await asyncio.to_thread(store.add_thread, ThreadInfo(id="t1", created_at_ts=1.0))
        for _ in range(2):  # the second finds no thread: nothing is sent
            await asyncio.to_thread(
                store.delete_thread, "t1",
                frame=FrameDraft("t1", "thread_deleted", lambda seq: f'{{"seq":{seq}}}'),
                now=1001.0, notify=("commands", '{"op":"deleted","thread":"t1"}'))
        await asyncio.to_thread(a.cluster.notify, "commands", "last")
        await inbox.until(lambda: "last" in inbox.payloads)
        assert inbox.payloads == ['{"op":"deleted","thread":"t1"}', "last"]
        assert await asyncio.to_thread(store.add_thread, ThreadInfo(id="t2", created_at_ts=1.0))
        with pytest.raises(ValueError):  # checked as `notify` checks it: nothing deleted
            await asyncio.to_thread(store.delete_thread, "t2",
                                    notify=("commands", "x" * 9000))
        assert await asyncio.to_thread(store.get_thread, "t2") is not None
    finally:
        await asyncio.to_thread(a.close)
