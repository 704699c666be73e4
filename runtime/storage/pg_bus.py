"""The cluster bus on PostgreSQL: ``LISTEN``/``NOTIFY`` between the nodes of one schema.

Each node (process) holds one dedicated listening connection, driven by a thread of its
own: it waits on the connection's socket and on a wake-up pipe, hands each notification to
its callbacks on their event loop (``call_soon_threadsafe``, so in arrival order), runs the
``LISTEN`` of channels added meanwhile, and checks an idle connection every
`CHECK_SECONDS`. When the connection is lost it reconnects with backoff (`RETRY_FIRST_SECONDS`
doubling to `RETRY_MAX_SECONDS` while attempts fail, from the start again after a connection
that listened) and then calls every channel's ``on_reconnect``:
notifications sent while it was down are lost, so listeners resync from the tables.

Channel names on the server are ``<schema>:<channel>`` (so apps sharing a database on
different schemas never hear each other), or, when that would pass PostgreSQL's 63-byte
identifier limit, ``te:`` followed by a hash of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.storage.base import (
    FRAMES_CHANNEL,
    WAKE_CHANNEL,
    AnnouncedFrame,
    ClusterBus,
    FrameDraft,
    check_channel,
    check_payload,
    encode_frames,
    encode_wake,
)

if TYPE_CHECKING:
    import psycopg

    from runtime.storage.postgres import PostgresBackend

log = logging.getLogger("runtime")

CHECK_SECONDS = 5.0
"""How often an idle listening connection is checked (``SELECT 1``): a cut network shows
no error until something is sent."""

RETRY_FIRST_SECONDS = 0.2
RETRY_MAX_SECONDS = 10.0
"""After the listening connection is lost, reconnecting is tried after 0.2 s, doubling
to 10 s while the attempts fail; once a connection listens again, the next loss starts
over at 0.2 s."""

_MAX_NAME_BYTES = 63  # PostgreSQL's identifier limit (NAMEDATALEN - 1)


@dataclass(frozen=True, slots=True)
class _Listener:
    callback: Callable[[str], None]
    on_reconnect: Callable[[], None] | None
    loop: asyncio.AbstractEventLoop


def server_channel(schema: str, channel: str) -> str:
    """The channel name on the server for ``channel`` of ``schema`` (see the module doc)."""
    name = f"{schema}:{channel}"
    if len(name.encode()) > _MAX_NAME_BYTES:
        name = "te:" + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()
    return name


class PostgresClusterBus(ClusterBus):
    """`ClusterBus` over one PostgreSQL schema (`PostgresBackend.cluster`).

    `start` (called by `PostgresBackend.open`) opens the listening connection's thread;
    `stop` (by `PostgresBackend.close`) ends it. Callbacks registered before `start` begin
    receiving once it runs.
    """

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._listeners: dict[str, list[_Listener]] = {}
        self._names: dict[str, str] = {}  # server channel name -> channel
        self._listening: set[str] = set()  # channels LISTENed on the current connection
        self._changed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._connected = False
        self.sender = secrets.token_hex(8)
        """This process's id in what it sends (`encode_frames`): tells its own apart."""

    # ------------------------------------------------------------------ public API

    def _name(self, channel: str) -> str:
        return server_channel(self._backend.schema, channel)

    def listen(  # noqa: D102 - contract in base
        self, channel: str, callback: Callable[[str], None], *,
        on_reconnect: Callable[[], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        check_channel(channel)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    f"Cluster listen on {channel!r}: no event loop is running here; call "
                    f"it on the event loop or pass loop="
                ) from None
        with self._lock:
            self._listeners.setdefault(channel, []).append(
                _Listener(callback, on_reconnect, loop))
            self._names[self._name(channel)] = channel
            new = channel not in self._listening
        if new:
            self._wake()
        elif on_reconnect is not None:
            # Already listened to: this listener is in effect at once.
            self._call(loop, on_reconnect, channel)

    def unlisten(self, channel: str, callback: Callable[[str], None]) -> None:  # noqa: D102
        with self._lock:
            listeners = self._listeners.get(channel)
            if not listeners:
                return
            listeners[:] = [x for x in listeners if x.callback is not callback]
            if not listeners:
                del self._listeners[channel]
        # The connection stays LISTENing (cheap); notifications nobody wants are dropped.

    def notify(self, channel: str, payload: str) -> None:  # noqa: D102 - contract in base
        check_channel(channel)
        self._check(channel, payload)
        with self._backend.transaction() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", (self._name(channel), payload))

    def notify_sql(self, cursor: Any, channel: str, payload: str) -> None:  # noqa: D102
        check_channel(channel)
        self._check(channel, payload)
        cursor.execute("SELECT pg_notify(%s, %s)", (self._name(channel), payload))

    def flush(self, timeout: float) -> bool:  # noqa: D102 - contract in base
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (self._connected and self._listening.issuperset(self._listeners)):
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._changed.wait(left)
        return True

    @property
    def connected(self) -> bool:  # noqa: D102 - contract in base
        return self._connected

    @property
    def node(self) -> str:
        """The sender named in wake-ups: this process's node id (what nodes rank by)."""
        return self._backend.node_id or self.sender

    def wake_params(self, thread_id: str, due_at: float) -> tuple[str, str]:
        """The ``pg_notify`` channel and payload `wake_in` sends, for a statement of its own."""
        return self._name(WAKE_CHANNEL), encode_wake(self.node, thread_id, due_at)

    def wake_in(self, cursor: Any, thread_id: str, due_at: float) -> None:
        """Announce, in the caller's transaction, a run of ``thread_id`` due at ``due_at``.

        On `WAKE_CHANNEL`, sent at commit; read with `decode_wake`.
        """
        cursor.execute("SELECT pg_notify(%s, %s)",
                       (self._name(WAKE_CHANNEL), encode_wake(self.node, thread_id, due_at)))

    # ------------------------------------------------------------ frames across nodes

    def append_frames(  # noqa: D102 - contract in base
        self, drafts: Sequence[FrameDraft], now: float,
    ) -> list[int]:
        if not drafts:
            return []
        # Frames all numbered in their changes' transactions (a caller scheduling run
        # after run) need no counter: the append is then one statement, autocommitted,
        # which saves the BEGIN and COMMIT round trips of every batch.
        single = all(d.seq is not None for d in drafts)
        with self._backend.transaction(single=single) as cur:
            return self.append_frames_in(cur, drafts, now)

    def append_frames_in(
        self, cur: Any, drafts: Sequence[FrameDraft], now: float,
    ) -> list[int]:
        """`append_frames` in the caller's transaction (``cur``): announced at its commit.

        The frames are numbered (their threads' counter rows locked until the commit),
        stored, and announced as this node's (`sender`) when the transaction commits; not
        at all if it rolls back.

        Returns:
            The frames' ``seq``s, in order.
        """
        if not drafts:
            return []
        counts: dict[str, int] = {}
        for d in drafts:
            if d.seq is None:  # a draft numbered in its change's transaction keeps it
                counts[d.thread_id] = counts.get(d.thread_id, 0) + 1
        threads = sorted(counts)
        # Every thread's counter in one statement (in thread-id order, so two nodes'
        # batches never lock counters in opposite orders), then the frames and their
        # notifications in another. Not in psycopg's pipeline mode: it saves the BEGIN's
        # round trip but cost twice the CPU per transaction (measured: 550 vs 280 µs).
        nxt = {
            str(thread_id): int(last) - counts[str(thread_id)] + 1
            for thread_id, last in cur.execute(
                "INSERT INTO frame_counters (thread_id, last_seq) "
                "SELECT * FROM unnest(%b::text[], %b::bigint[]) ORDER BY 1 "
                "ON CONFLICT (thread_id) DO UPDATE SET last_seq = "
                "frame_counters.last_seq + excluded.last_seq RETURNING thread_id, last_seq",
                (threads, [counts[t] for t in threads]),
            ).fetchall()
        } if threads else {}
        seqs: list[int] = []
        columns: tuple[list[str], list[int], list[str], list[str]] = ([], [], [], [])
        announced: list[AnnouncedFrame] = []
        for d in drafts:
            if d.seq is not None:
                seq = d.seq
            else:
                seq = nxt[d.thread_id]
                nxt[d.thread_id] = seq + 1
            text = d.render(seq)
            seqs.append(seq)
            for column, value in zip(columns, (d.thread_id, seq, d.kind, text),
                                     strict=True):
                column.append(value)  # type: ignore[attr-defined]
            announced.append(AnnouncedFrame(d.thread_id, seq, d.kind, text))
        # The arrays go in binary (%b): in text form psycopg escapes every quote of
        # every frame's JSON with a regular expression, most of the append's CPU.
        # A frame numbered in its change's transaction and stored already (a batch
        # retried after a commit whose answer was lost) is not stored twice.
        cur.execute(
            "WITH ins AS (INSERT INTO frames (thread_id, frame_seq, kind, frame, "
            "created_at) SELECT t, s, k, f, %s FROM unnest(%b::text[], %b::bigint[], "
            "%b::text[], %b::text[]) AS u(t, s, k, f) ON CONFLICT DO NOTHING) "
            "SELECT pg_notify(%s, p) FROM unnest(%b::text[]) p",
            (now, *columns, self._name(FRAMES_CHANNEL),
             encode_frames(self.sender, announced)),
        )
        return seqs

    def read_frames(  # noqa: D102 - contract in base
        self, thread_id: str, after_seq: int, upto_seq: int | None = None,
    ) -> list[tuple[int, str, str]]:
        with self._backend.transaction() as cur:
            rows = cur.execute(
                "SELECT frame_seq, kind, frame FROM frames WHERE thread_id = %s "
                "AND frame_seq > %s AND (%s::bigint IS NULL OR frame_seq <= %s) "
                "ORDER BY frame_seq",
                (thread_id, after_seq, upto_seq, upto_seq),
            ).fetchall()
        return [(int(r[0]), r[1], r[2]) for r in rows]

    def prune_frames(self, older_than: float) -> int:  # noqa: D102 - contract in base
        with self._backend.transaction() as cur:
            n = cur.execute("DELETE FROM frames WHERE created_at < %s", (older_than,)).rowcount
            cur.execute(
                "DELETE FROM frame_counters c WHERE NOT EXISTS (SELECT 1 FROM threads t "
                "WHERE t.id = c.thread_id) AND NOT EXISTS (SELECT 1 FROM frames f "
                "WHERE f.thread_id = c.thread_id)"
            )
        return n

    @staticmethod
    def _check(channel: str, payload: str) -> None:
        from runtime.storage.postgres import escape_nul

        check_payload(channel, payload)
        # The connection writes NUL-escaped text (`escape_nul`): that is what must fit.
        check_payload(channel, payload, len(escape_nul(payload).encode("utf-8",
                                                                          "surrogatepass")))

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        """Start the listening thread (idempotent). It connects on its own, with backoff."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._thread = threading.Thread(
                target=self._run, args=(self._stop, self._wake_r),
                name=f"thread-effects-cluster-bus:{self._backend.schema}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop listening and close the connection (idempotent); callbacks stay registered."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
            self._changed.notify_all()
        if thread is None:
            return
        with contextlib.suppress(OSError):
            os.write(wake_w, b"x")
        thread.join(timeout=5.0)
        for fd in (wake_r, wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        fd = self._wake_w
        if fd >= 0:
            with contextlib.suppress(OSError):  # a full pipe already wakes the thread
                os.write(fd, b"x")

    def _call(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., None],
              channel: str, *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("cluster channel %r: a listener failed", channel)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            loop.call_soon_threadsafe(run)

    def _deliver(self, name: str, payload: str) -> None:
        from runtime.storage.postgres import unescape_nul

        with self._lock:
            channel = self._names.get(name)
            listeners = list(self._listeners.get(channel, ())) if channel else []
        if not listeners:
            return
        assert channel is not None
        payload = unescape_nul(payload)
        for x in listeners:
            self._call(x.loop, x.callback, channel, payload)

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        return psycopg.connect(self._backend.url,
                               **self._backend._connect_kwargs("thread-effects-bus"))

    def _listen_new(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """LISTEN every channel not listened to yet; tell their listeners it took effect."""
        from psycopg import sql

        with self._lock:
            todo = [c for c in self._listeners if c not in self._listening]
        for channel in todo:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._name(channel))))
            with self._lock:
                self._listening.add(channel)
                listeners = list(self._listeners.get(channel, ()))
                self._changed.notify_all()
            for x in listeners:
                if x.on_reconnect is not None:
                    self._call(x.loop, x.on_reconnect, channel)

    def _run(self, stop: threading.Event, wake_r: int) -> None:
        delay = RETRY_FIRST_SECONDS
        lost_before = False
        while not stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:
                if stop.is_set():
                    break
                if not lost_before:
                    log.error("cluster bus of schema %s: cannot connect (%s); retrying",
                              self._backend.schema, exc)
                    lost_before = True
                stop.wait(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            self._conn = conn
            try:
                with self._lock:
                    self._listening.clear()
                self._serve(conn, stop, wake_r, reconnected=lost_before)
            except Exception as exc:
                if stop.is_set():
                    break
                log.warning("cluster bus of schema %s: the listening connection was lost "
                            "(%s); reconnecting", self._backend.schema, exc)
                lost_before = True
            finally:
                with self._lock:
                    if self._connected:  # it listened: the next loss starts over
                        delay = RETRY_FIRST_SECONDS
                    self._connected = False
                    self._listening.clear()
                    self._changed.notify_all()
                self._conn = None
                with contextlib.suppress(Exception):
                    conn.close()
            if not stop.is_set():
                stop.wait(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)

    def _drain(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Hand out every notification the connection has received (reads what is there)."""
        pgconn = conn.pgconn
        pgconn.consume_input()  # never blocks; raises if the connection is gone
        encoding = conn.info.encoding
        while (n := pgconn.notifies()) is not None:
            self._deliver(n.relname.decode(encoding), n.extra.decode(encoding))

    def _serve(self, conn: psycopg.Connection[tuple[Any, ...]], stop: threading.Event,
               wake_r: int, *, reconnected: bool) -> None:
        # Notifications that arrive while a statement runs here (a LISTEN, the check) are
        # handed to this handler by psycopg; the others are read by `_drain`.
        conn.add_notify_handler(lambda n: self._deliver(n.channel, n.payload))
        self._listen_new(conn)
        with self._lock:
            self._connected = True
            self._changed.notify_all()
        if reconnected:
            log.warning("cluster bus of schema %s: listening again", self._backend.schema)
        checked = time.monotonic()
        sock = conn.fileno()
        while not stop.is_set():
            self._drain(conn)
            ready, _, _ = select.select([sock, wake_r], [], [], CHECK_SECONDS)
            if stop.is_set():
                return
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                self._listen_new(conn)
            if sock in ready:
                checked = time.monotonic()
            elif time.monotonic() - checked >= CHECK_SECONDS:
                # Bounded: a silent network cut would leave it waiting (reconnects).
                from runtime.storage.postgres import CHECK_DEADLINE_SECONDS

                with self._backend._bounded(conn, CHECK_DEADLINE_SECONDS):
                    conn.execute("SELECT 1")
                checked = time.monotonic()
