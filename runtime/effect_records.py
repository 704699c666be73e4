"""The effect records of every thread, kept in the thread's own store (`EffectRecords`).

An effect tool called inside a turn records what it applied here: `EffectRecords` is an
`runtime.storage.records.EffectRecordStore` whose ``thread_id`` picks the thread, and whose
every call runs the thread store's ``*_effect_record(s)`` methods (one transaction each, in
a worker thread) while holding the thread open (`runtime.actors.ActorTable.use`, never its
write lock: a tool runs inside a turn that may hold it). Each change is published on the
thread's stream as an ``effect_record_changed`` frame. Records live and die with the
thread: deleting it deletes its store, and so its records; records past
``RetentionPolicy.effect_records_seconds`` are deleted on the write path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

from runtime.abc import RunSync
from runtime.actors import ActorTable
from runtime.config import RetentionPolicy
from runtime.errors import ThreadNotFound
from runtime.events import RecordChange
from runtime.frames import ChangeHub
from runtime.storage.base import RuntimeStore
from runtime.storage.records import (
    Claim,
    EffectRecord,
    EffectRecordPage,
    EffectRecordStatus,
    EffectRecordStore,
)

LISTED_RESULT_CHARS = 2000
"""A recorded result longer than this (characters of its JSON text) is cut where records
are listed (``GET .../effect-records``, ``effect_record_changed`` frames): ``result`` is
null, ``resultPreview`` holds its first characters and ``resultTruncated`` is true; the
full record is at ``GET /api/threads/{tid}/effect-records/{key}``."""


def listed_record_json(record: EffectRecord) -> dict[str, Any]:
    """A record as listings and frames show it: its result cut past `LISTED_RESULT_CHARS`.

    `EffectRecord.to_json` without ``threadId``, plus ``resultTruncated``; when true,
    ``result`` is null, ``resultPreview`` its first characters and ``resultChars`` the
    full JSON text's length.
    """
    wire = record.to_json()
    wire.pop("threadId", None)
    text = record.result_json
    truncated = text is not None and len(text) > LISTED_RESULT_CHARS
    wire["resultTruncated"] = truncated
    if truncated:
        assert text is not None
        wire["result"] = None
        wire["resultPreview"] = text[:LISTED_RESULT_CHARS] + "…"
        wire["resultChars"] = len(text)
    return wire


class EffectRecords(EffectRecordStore):
    """Effect records by thread, in each thread's store (``rt.effect_records``).

    Args:
        actors: The actor table (opens a thread's store, keeps it open during a call).
        run_sync: Runs a blocking store call off the event loop.
        hub: Where record changes are published.
        now: The clock's ``now`` (seconds since the epoch, UTC).
        retention: The runtime's retention (``effect_records_seconds``).
        thread_ids: Every registered thread's id (for `purge`).
        publish: Publish ``effect_record_changed`` frames (the turns' journal, `journal`,
            does not).

    Every method raises `runtime.errors.ThreadNotFound` for an unknown thread and
    `runtime.errors.InvalidThreadId` for a malformed id, besides what the contract says.
    """

    def __init__(
        self,
        actors: ActorTable,
        run_sync: RunSync,
        hub: ChangeHub,
        now: Callable[[], float],
        retention: RetentionPolicy,
        thread_ids: Callable[[], AsyncIterator[str]],
        *,
        publish: bool = True,
    ) -> None:
        self._publishing = publish
        self._thread_ids = thread_ids
        self._actors = actors
        self._run_sync = run_sync
        self._hub = hub
        self._now = now
        self._retention = retention

    def journal(self) -> EffectRecords:
        """The same records, without frames: the store of the turns' journal."""
        return EffectRecords(self._actors, self._run_sync, self._hub, self._now,
                             self._retention, self._thread_ids, publish=False)

    def _publish(self, thread_id: str, change: RecordChange, record: EffectRecord) -> None:
        if not self._publishing:
            return
        self._hub.publish_record(thread_id, change, listed_record_json(record))

    async def get(self, thread_id: str, key: str) -> EffectRecord | None:  # noqa: D102
        async with self._actors.use(thread_id) as actor:
            record: EffectRecord | None = await self._run_sync(
                actor.store.get_effect_record, key
            )
            return record

    async def begin(  # noqa: D102
        self,
        thread_id: str,
        key: str,
        *,
        tool_name: str,
        run_id: str | None,
        owner: str,
        lease_seconds: float,
    ) -> Claim:
        async with self._actors.use(thread_id) as actor:
            store = actor.store
            claim: Claim = await self._run_sync(
                lambda: store.begin_effect_record(
                    key, tool_name=tool_name, run_id=run_id, owner=owner,
                    lease_seconds=lease_seconds, now=self._now(), retention=self._retention,
                )
            )
        if claim.claimed:
            self._publish(thread_id, RecordChange.CLAIMED, claim.record)
        return claim

    async def complete(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, result_json: str,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        async with self._actors.use(thread_id) as actor:
            store = actor.store
            record: EffectRecord = await self._run_sync(
                lambda: store.complete_effect_record(
                    key, owner=owner, result_json=result_json, now=self._now(),
                    status=status,
                )
            )
        self._publish(thread_id, RecordChange.APPLIED, record)
        return record

    async def renew(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, lease_seconds: float
    ) -> bool:
        async with self._actors.use(thread_id) as actor:
            store = actor.store
            renewed: bool = await self._run_sync(
                lambda: store.renew_effect_record(key, owner=owner, lease_seconds=lease_seconds,
                                                  now=self._now())
            )
            return renewed

    async def release(self, thread_id: str, key: str, *, owner: str) -> bool:  # noqa: D102
        async with self._actors.use(thread_id) as actor:
            store = actor.store
            record: EffectRecord | None = await self._run_sync(
                lambda: store.release_effect_record(key, owner=owner)
            )
        if record is None:
            return False
        self._publish(thread_id, RecordChange.RELEASED, record)
        return True

    async def list(  # noqa: D102
        self,
        thread_id: str,
        *,
        status: EffectRecordStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        async with self._actors.use(thread_id) as actor:
            store = actor.store
            page: EffectRecordPage = await self._run_sync(
                lambda: store.list_effect_records(status=status, limit=limit, cursor=cursor)
            )
            return page

    async def purge(self, *, older_than: datetime) -> int:
        """Delete records last changed before ``older_than`` in every thread (see the contract).

        The runtime does this by itself, per thread, by ``retention.effect_records_seconds``;
        this opens every thread in turn (through the actor table's LRU), for an earlier
        clean-up.

        Raises:
            ValueError: a naive ``older_than``.
        """
        if older_than.tzinfo is None:
            raise ValueError(f"An instant must be timezone-aware (UTC), got naive {older_than}")
        cutoff = older_than.timestamp()
        deleted = 0
        async for thread_id in self._thread_ids():
            try:
                deleted += await self._purge_in(thread_id, cutoff)
            except ThreadNotFound:
                continue  # deleted meanwhile: its records went with it
        return deleted

    async def purge_thread(self, thread_id: str) -> int:
        """Delete every record of a thread (deleting the thread does it too). Returns how many.

        Raises:
            ThreadNotFound: no such thread.
        """
        return await self._purge_in(thread_id, None)

    async def _purge_in(self, thread_id: str, cutoff: float | None) -> int:
        async with self._actors.use(thread_id) as actor:
            store = actor.store
            count: int = await self._run_sync(
                lambda: store.purge_effect_records(older_than=cutoff)
            )
            return count


class RuntimeRecords(EffectRecordStore):
    """Records in the runtime database (``rt.runtime_records``), by scope.

    The `EffectRecordStore` contract over `runtime.storage.base.RuntimeStore`'s
    ``*_record(s)`` methods, each one transaction in a worker thread; ``thread_id`` is the
    record's scope (durable turns keep their ``"cross-run"`` keys under
    `runtime.durable.CROSS_RUN_THREAD`). No frames are published.

    Args:
        store: The runtime store, once the runtime has started (a function: it is opened
            at start).
        run_sync: Runs a blocking store call off the event loop.
        now: The clock's ``now`` (seconds since the epoch, UTC).
    """

    def __init__(
        self, store: Callable[[], RuntimeStore], run_sync: RunSync, now: Callable[[], float],
    ) -> None:
        self._store = store
        self._run_sync = run_sync
        self._now = now

    async def get(self, thread_id: str, key: str) -> EffectRecord | None:  # noqa: D102
        store = self._store()
        record: EffectRecord | None = await self._run_sync(store.get_record, thread_id, key)
        return record

    async def begin(  # noqa: D102
        self, thread_id: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float,
    ) -> Claim:
        store = self._store()
        claim: Claim = await self._run_sync(lambda: store.begin_record(
            thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
            lease_seconds=lease_seconds, now=self._now(),
        ))
        return claim

    async def complete(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, result_json: str,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        store = self._store()
        record: EffectRecord = await self._run_sync(lambda: store.complete_record(
            thread_id, key, owner=owner, result_json=result_json, now=self._now(),
            status=status,
        ))
        return record

    async def renew(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, lease_seconds: float
    ) -> bool:
        store = self._store()
        renewed: bool = await self._run_sync(lambda: store.renew_record(
            thread_id, key, owner=owner, lease_seconds=lease_seconds, now=self._now(),
        ))
        return renewed

    async def release(self, thread_id: str, key: str, *, owner: str) -> bool:  # noqa: D102
        store = self._store()
        released: bool = await self._run_sync(
            lambda: store.release_record(thread_id, key, owner=owner)
        )
        return released

    async def list(  # noqa: D102
        self, thread_id: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        store = self._store()
        page: EffectRecordPage = await self._run_sync(lambda: store.list_records(
            thread_id, status=status, limit=limit, cursor=cursor
        ))
        return page

    async def purge(self, *, older_than: datetime) -> int:  # noqa: D102
        if older_than.tzinfo is None:
            raise ValueError(f"An instant must be timezone-aware (UTC), got naive {older_than}")
        store = self._store()
        count: int = await self._run_sync(
            lambda: store.purge_records(older_than=older_than.timestamp())
        )
        return count

    async def purge_thread(self, thread_id: str) -> int:  # noqa: D102
        store = self._store()
        count: int = await self._run_sync(store.delete_records, thread_id)
        return count

    async def close(self) -> None:
        """Nothing to close: the runtime closes its store."""
