"""The in-memory backend: the reference implementation of the storage contract.

Everything lives in Python objects of one `MemoryBackend`; nothing touches a disk. The data
outlives a runtime: a second `Runtime` given the same backend (after the first closed)
finds its threads, runs and alarms, as it would find a data directory. It is for tests and
as the executable statement of the contract (``runtime.storage.base``): each method is
written for clarity, not speed, and passes the same contract suite (``tests/storage/``) as
the SQLite backend. Values are stored as SQLite stores them (run args and message meta as
JSON text), so what a caller reads back has the same shape on both backends.

Thread safety: every thread's data and the registry have a lock; each method holds it for
its whole body, so each call is one transaction (all or nothing: it checks before it
changes anything).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from runtime.config import RetentionPolicy
from runtime.effects import FINISHED_STATUSES, EffectRun, EffectStatus, RunAttempt
from runtime.errors import DataDirLocked, RuntimeClosed, RuntimeStorageError, ThreadStorageError
from runtime.messages import Message, message_from_row
from runtime.recurrence import Schedule, ScheduleState
from runtime.storage.base import (
    Finish,
    FrameDraft,
    RunQuery,
    RuntimeStore,
    StorageBackend,
    ThreadInfo,
    ThreadQuery,
    ThreadStore,
    interrupted_error,
)
from runtime.storage.records import (
    Claim,
    EffectRecord,
    EffectRecordPage,
    EffectRecordStatus,
    EffectRecordTable,
    check_lease,
    check_limit,
    decode_cursor,
    instant,
)

THREAD_SCHEMA_VERSION = 9
"""The version of a thread's data this code knows (kept equal to the SQLite backend's)."""

RUNTIME_SCHEMA_VERSION = 6
"""The version of the registry and alarm index this code knows."""


log = logging.getLogger("runtime")


@dataclass(slots=True)
class _StoredRun:
    seq: int
    run: EffectRun  # with args=None; the args are kept as JSON text beside it
    args_json: str | None
    attempts: list[RunAttempt] = field(default_factory=list)


@dataclass(slots=True)
class _StoredMessage:
    id: str
    role: str
    content: str
    created_at_ts: float
    run_id: str | None
    meta: str
    data: str


@dataclass(slots=True)
class _ThreadData:
    """What the backend keeps for one thread (the counterpart of a thread file)."""

    thread_id: str
    schema_version: int = THREAD_SCHEMA_VERSION
    runs: dict[int, _StoredRun] = field(default_factory=dict)  # by seq, ascending
    seq_of: dict[str, int] = field(default_factory=dict)  # run id -> seq
    next_seq: int = 1
    messages: list[_StoredMessage] = field(default_factory=list)
    message_index: dict[str, int] = field(default_factory=dict)  # id -> position
    meta: dict[str, str] = field(default_factory=dict)
    effect_records: EffectRecordTable = field(default_factory=EffectRecordTable)
    # Recurring schedules by id, in creation order, each with its args as JSON text.
    schedules: dict[str, tuple[Schedule, str | None]] = field(default_factory=dict)
    removed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _expired(run: EffectRun, now: float, retention: RetentionPolicy) -> bool:
    """Whether a run is past its retention age (never true for pending or running)."""
    if run.finished_at_ts is None:
        return False
    if run.status in (EffectStatus.COMPLETED, EffectStatus.CANCELED):
        return run.finished_at_ts < now - retention.completed_seconds
    if run.status is EffectStatus.FAILED:
        return run.finished_at_ts < now - retention.failed_seconds
    return False


class MemoryThreadStore(ThreadStore):
    """One thread's runs, messages and meta, held by a `MemoryBackend`."""

    def __init__(self, data: _ThreadData, node_id: str | None = None) -> None:
        self.thread_id = data.thread_id
        self.node_id = node_id
        self._data = data
        self._closed = False

    # --------------------------------------------------------------- helpers

    def _open_data(self) -> _ThreadData:
        if self._closed:
            raise ThreadStorageError(self.thread_id, f"Thread {self.thread_id} is closed")
        if self._data.removed:
            raise ThreadStorageError(
                self.thread_id, f"Thread {self.thread_id}: its store was removed"
            )
        return self._data

    def _out(self, stored: _StoredRun) -> EffectRun:
        args = json.loads(stored.args_json) if stored.args_json is not None else None
        return replace(stored.run, args=args)

    def _update(self, data: _ThreadData, seq: int, **changes: object) -> EffectRun:
        stored = data.runs[seq]
        if changes.get("status") in FINISHED_STATUSES:
            changes["trace_context"] = None  # kept only while the run is unfinished
        stored.run = replace(stored.run, **changes)  # type: ignore[arg-type]
        return self._out(stored)

    @staticmethod
    def _end_attempt(stored: _StoredRun, outcome: str, at: float, error: str | None) -> None:
        if stored.attempts and stored.attempts[-1].attempt == stored.run.attempts:
            last = stored.attempts[-1]
            stored.attempts[-1] = replace(last, ended_at_ts=at, outcome=outcome, error=error)

    def run_attempts(self, run_id: str) -> list[RunAttempt]:  # noqa: D102
        with self._data.lock:
            data = self._open_data()
            seq = data.seq_of.get(run_id)
            return [] if seq is None else list(data.runs[seq].attempts)

    def _find(self, data: _ThreadData, run_id: str, status: EffectStatus) -> int | None:
        seq = data.seq_of.get(run_id)
        if seq is None or data.runs[seq].run.status is not status:
            return None
        return seq

    @staticmethod
    def _delete(data: _ThreadData, seqs: Sequence[int]) -> int:
        for seq in seqs:
            stored = data.runs.pop(seq)
            del data.seq_of[stored.run.id]
        return len(seqs)

    @staticmethod
    def _hidden(data: _ThreadData, now: float, retention: RetentionPolicy) -> set[int]:
        """The runs a read must not return (their seqs).

        Those past their age, and finished ones older than the ``max_finished`` most
        recent unexpired finished runs.
        """
        hidden = {s for s, r in data.runs.items() if _expired(r.run, now, retention)}
        finished = [
            r for s, r in data.runs.items()
            if r.run.status in FINISHED_STATUSES and s not in hidden
        ]
        if len(finished) > retention.max_finished:
            finished.sort(key=lambda r: (r.run.finished_at_ts or 0.0, r.seq), reverse=True)
            hidden.update(r.seq for r in finished[retention.max_finished:])
        return hidden

    def _prune_in(self, data: _ThreadData, now: float, retention: RetentionPolicy) -> int:
        data.effect_records.purge(older_than=instant(now - retention.effect_records_seconds))
        deleted = self._delete(
            data, [s for s, r in data.runs.items() if _expired(r.run, now, retention)]
        )
        finished = [r for r in data.runs.values() if r.run.status in FINISHED_STATUSES]
        excess = len(finished) - retention.max_finished
        if excess > 0:
            finished.sort(key=lambda r: (r.run.finished_at_ts or 0.0, r.seq))
            deleted += self._delete(data, [r.seq for r in finished[:excess]])
        return deleted

    # ------------------------------------------------------------------ runs

    def insert_run(  # noqa: D102 - contract in base
        self, run: EffectRun, *, hand_off_from: str | None = None, replay_once: bool = False
    ) -> EffectRun | None:
        args_json = (
            json.dumps(run.args, separators=(",", ":")) if run.args is not None else None
        )
        with self._data.lock:
            data = self._open_data()
            if replay_once and run.replay_of is not None:
                replays = [r for r in data.runs.values() if r.run.replay_of == run.replay_of]
                if replays:
                    return self._out(min(replays, key=lambda r: r.seq))
            if run.key is not None:
                live = [
                    r for r in data.runs.values()
                    if r.run.key == run.key
                    and r.run.status in (EffectStatus.PENDING, EffectStatus.RUNNING)
                ]
                # A pending successor wins over the running link that handed the key on.
                live.sort(key=lambda r: (r.run.status is not EffectStatus.PENDING, r.seq))
                for held in live:
                    if held.run.status is EffectStatus.PENDING or held.run.id != hand_off_from:
                        return self._out(held)
            if run.id in data.seq_of:
                raise ThreadStorageError(
                    self.thread_id,
                    f"Thread {self.thread_id}: a run with id {run.id} exists already",
                )
            seq = data.next_seq
            data.next_seq += 1
            stored = replace(
                run,
                thread_id=self.thread_id,
                args=None,
                attempts=0,
                started_at_ts=None,
                finished_at_ts=None,
                error=None,
                canceled_by=None,
            )
            data.runs[seq] = _StoredRun(seq, stored, args_json)
            data.seq_of[run.id] = seq
            return None

    def finish_and_claim(  # noqa: D102 - contract in base
        self,
        finish: Finish | None,
        now: float,
        *,
        claim: bool = True,
        retention: RetentionPolicy | None = None,
        only_names: Collection[str] | None = None,
        durable: bool = True,  # every commit is durable here (no group commit)
    ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
        wanted = None if only_names is None else set(only_names)
        with self._data.lock:
            data = self._open_data()
            finished = None
            if finish is not None:
                seq = self._find(data, finish.run_id, EffectStatus.RUNNING)
                if seq is not None and finish.attempt not in (None, data.runs[seq].run.attempts):
                    seq = None  # fenced: the run is in another attempt by now
                if seq is not None:
                    finished = self._update(
                        data, seq, status=finish.status, error=finish.error,
                        finished_at_ts=finish.finished_at, canceled_by=finish.canceled_by,
                    )
                    self._end_attempt(data.runs[seq], str(finish.status),
                                      finish.finished_at, finish.error)
                    if retention is not None:
                        self._prune_in(data, now, retention)
            if not claim:
                return finished, None, None
            pending = [
                r for r in data.runs.values()
                if r.run.status is EffectStatus.PENDING
                and (wanted is None or r.run.name in wanted)
            ]
            due = [r for r in pending if r.run.run_at_ts <= now]
            if due:
                first = min(due, key=lambda r: (r.run.run_at_ts, r.seq))
                claimed = self._update(
                    data, first.seq, status=EffectStatus.RUNNING,
                    attempts=first.run.attempts + 1, started_at_ts=now,
                )
                first.attempts.append(RunAttempt(claimed.attempts, now, None, "running",
                                                 node_id=self.node_id))
                return finished, claimed, None
            next_due = min((r.run.run_at_ts for r in pending), default=None)
            if wanted is None:
                fires = [
                    sc.next_fire_at_ts for sc, _ in data.schedules.values()
                    if sc.state is ScheduleState.ACTIVE and sc.next_fire_at_ts is not None
                ]
                next_due = min([*fires, *([] if next_due is None else [next_due])], default=None)
            return finished, None, next_due

    # ------------------------------------------------------ recurring schedules

    @staticmethod
    def _schedule_out(entry: tuple[Schedule, str | None]) -> Schedule:
        schedule, args_json = entry
        return replace(schedule, args=json.loads(args_json) if args_json is not None else None)

    def insert_schedule(self, schedule: Schedule) -> Schedule | None:  # noqa: D102
        args_json = (
            json.dumps(schedule.args, separators=(",", ":")) if schedule.args is not None
            else None
        )
        with self._data.lock:
            data = self._open_data()
            if schedule.key is not None:
                for entry in data.schedules.values():
                    if entry[0].key == schedule.key:
                        return self._schedule_out(entry)
            if schedule.id in data.schedules:
                raise ThreadStorageError(
                    self.thread_id,
                    f"Thread {self.thread_id}: a schedule with id {schedule.id} exists already",
                )
            stored = replace(
                schedule, thread_id=self.thread_id, args=None, occurrences=0, skipped=0,
                last_run_id=None, last_fire_at_ts=None,
            )
            data.schedules[schedule.id] = (stored, args_json)
            return None

    def get_schedule(self, schedule_id: str) -> Schedule | None:  # noqa: D102
        with self._data.lock:
            entry = self._open_data().schedules.get(schedule_id)
            return None if entry is None else self._schedule_out(entry)

    def list_schedules(self) -> list[Schedule]:  # noqa: D102
        with self._data.lock:
            return [self._schedule_out(e) for e in self._open_data().schedules.values()]

    def set_schedule_state(  # noqa: D102
        self, schedule_id: str, state: ScheduleState, next_fire_at: float | None
    ) -> Schedule | None:
        with self._data.lock:
            data = self._open_data()
            entry = data.schedules.get(schedule_id)
            if entry is None:
                return None
            entry = (replace(entry[0], state=state, next_fire_at_ts=next_fire_at), entry[1])
            data.schedules[schedule_id] = entry
            return self._schedule_out(entry)

    def delete_schedule(self, schedule_id: str) -> Schedule | None:  # noqa: D102
        with self._data.lock:
            entry = self._open_data().schedules.pop(schedule_id, None)
            return None if entry is None else self._schedule_out(entry)

    def due_schedules(self, now: float) -> list[Schedule]:  # noqa: D102
        with self._data.lock:
            entries = list(self._open_data().schedules.values())
            order = {e[0].id: i for i, e in enumerate(entries)}
            due = [
                e for e in entries
                if e[0].state is ScheduleState.ACTIVE
                and e[0].next_fire_at_ts is not None and e[0].next_fire_at_ts <= now
            ]
            due.sort(key=lambda e: (e[0].next_fire_at_ts, order[e[0].id]))
            return [self._schedule_out(e) for e in due]

    def next_schedule_fire(self) -> float | None:  # noqa: D102
        with self._data.lock:
            return min(
                (sc.next_fire_at_ts for sc, _ in self._open_data().schedules.values()
                 if sc.state is ScheduleState.ACTIVE and sc.next_fire_at_ts is not None),
                default=None,
            )

    def fire_schedule(  # noqa: D102
        self,
        schedule_id: str,
        fire_at: float,
        run: EffectRun | None,
        skipped: int,
        last_fire_at: float,
        next_fire_at: float | None,
    ) -> tuple[Schedule | None, EffectRun | None]:
        with self._data.lock:
            data = self._open_data()
            entry = data.schedules.get(schedule_id)
            if entry is None:
                return None, None
            current, args_json = entry
            if current.state is not ScheduleState.ACTIVE or current.next_fire_at_ts != fire_at:
                return self._schedule_out(entry), None
            stored_run = None
            if run is not None:
                if run.id in data.seq_of:
                    raise ThreadStorageError(
                        self.thread_id,
                        f"Thread {self.thread_id}: a run with id {run.id} exists already",
                    )
                seq = data.next_seq
                data.next_seq += 1
                run_args = (
                    json.dumps(run.args, separators=(",", ":")) if run.args is not None
                    else None
                )
                kept = replace(
                    run, thread_id=self.thread_id, args=None, attempts=0, started_at_ts=None,
                    finished_at_ts=None, error=None, canceled_by=None, schedule_id=schedule_id,
                )
                data.runs[seq] = _StoredRun(seq, kept, run_args)
                data.seq_of[run.id] = seq
                stored_run = self._out(data.runs[seq])
                current = replace(current, occurrences=current.occurrences + 1,
                                  last_run_id=run.id)
            current = replace(current, skipped=current.skipped + skipped,
                              last_fire_at_ts=last_fire_at, next_fire_at_ts=next_fire_at)
            data.schedules[schedule_id] = (current, args_json)
            return self._schedule_out((current, args_json)), stored_run

    def recover_interrupted(  # noqa: D102 - contract in base
        self,
        now: float,
        max_attempts: int,
        run_ids: Sequence[str] | None = None,
        *,
        retention: RetentionPolicy | None = None,
        dead_nodes_only: bool = False,
        reason: str | None = None,
    ) -> list[EffectRun]:
        with self._data.lock:
            data = self._open_data()
            wanted = None if run_ids is None else set(run_ids)
            changed: list[EffectRun] = []
            for seq, stored in list(data.runs.items()):
                run = stored.run
                if run.status is not EffectStatus.RUNNING:
                    continue
                if wanted is not None and run.id not in wanted:
                    continue
                self._end_attempt(stored, "interrupted", now, reason)
                if run.attempts >= max_attempts:
                    changed.append(self._update(
                        data, seq, status=EffectStatus.FAILED, finished_at_ts=now,
                        error=interrupted_error(run.attempts, max_attempts, reason),
                    ))
                else:
                    changed.append(self._update(
                        data, seq, status=EffectStatus.PENDING,
                        run_at_ts=min(run.run_at_ts, now),
                    ))
            if retention is not None:
                self._prune_in(data, now, retention)
            return changed

    def cancel(  # noqa: D102 - contract in base
        self,
        run_id: str,
        now: float,
        *,
        retention: RetentionPolicy | None = None,
        canceled_by: str | None = None,
    ) -> EffectRun | None:
        with self._data.lock:
            data = self._open_data()
            seq = self._find(data, run_id, EffectStatus.PENDING)
            if seq is None:
                return None
            run = self._update(data, seq, status=EffectStatus.CANCELED, finished_at_ts=now,
                               canceled_by=canceled_by)
            if retention is not None:
                self._prune_in(data, now, retention)
            return run

    def run_now(self, run_id: str, now: float) -> EffectRun | None:  # noqa: D102
        with self._data.lock:
            data = self._open_data()
            seq = self._find(data, run_id, EffectStatus.PENDING)
            if seq is None:
                return None
            return self._update(data, seq, run_at_ts=min(data.runs[seq].run.run_at_ts, now))

    def get_run(  # noqa: D102
        self, run_id: str, now: float, retention: RetentionPolicy
    ) -> EffectRun | None:
        with self._data.lock:
            data = self._open_data()
            seq = data.seq_of.get(run_id)
            if seq is None or seq in self._hidden(data, now, retention):
                return None
            return self._out(data.runs[seq])

    def list_runs(  # noqa: D102
        self,
        now: float,
        retention: RetentionPolicy,
        *,
        statuses: Sequence[EffectStatus] | None = None,
        name: str | None = None,
        limit: int = 50,
        before_seq: int | None = None,
    ) -> tuple[list[EffectRun], int | None]:
        with self._data.lock:
            data = self._open_data()
            wanted = set(statuses) if statuses else None
            hidden = self._hidden(data, now, retention)
            page: list[_StoredRun] = []
            more = False
            for seq in reversed(data.runs):
                stored = data.runs[seq]
                run = stored.run
                if before_seq is not None and seq >= before_seq:
                    continue
                if seq in hidden:
                    continue
                if wanted is not None and run.status not in wanted:
                    continue
                if name is not None and run.name != name:
                    continue
                if len(page) == limit:
                    more = True
                    break
                page.append(stored)
            cursor = page[-1].seq if more else None
            return [self._out(r) for r in page], cursor

    def count_runs(  # noqa: D102
        self, now: float, retention: RetentionPolicy, *, name: str | None = None
    ) -> dict[EffectStatus, int]:
        with self._data.lock:
            data = self._open_data()
            counts = dict.fromkeys(EffectStatus, 0)
            hidden = self._hidden(data, now, retention)
            for seq, stored in data.runs.items():
                run = stored.run
                if (name is None or run.name == name) and seq not in hidden:
                    counts[run.status] += 1
            return counts

    def pending_runs(self, name: str | None = None) -> list[EffectRun]:  # noqa: D102
        with self._data.lock:
            data = self._open_data()
            pending = [
                r for r in data.runs.values()
                if r.run.status is EffectStatus.PENDING and (name is None or r.run.name == name)
            ]
            pending.sort(key=lambda r: (r.run.run_at_ts, r.seq))
            return [self._out(r) for r in pending]

    def prune(self, now: float, retention: RetentionPolicy) -> int:  # noqa: D102
        with self._data.lock:
            return self._prune_in(self._open_data(), now, retention)

    # -------------------------------------------------------- effect records

    def get_effect_record(self, key: str) -> EffectRecord | None:  # noqa: D102
        with self._data.lock:
            return self._open_data().effect_records.get(self.thread_id, key)

    def begin_effect_record(  # noqa: D102
        self,
        key: str,
        *,
        tool_name: str,
        run_id: str | None,
        owner: str,
        lease_seconds: float,
        now: float,
        retention: RetentionPolicy | None = None,
    ) -> Claim:
        check_lease(lease_seconds)
        with self._data.lock:
            table = self._open_data().effect_records
            claim = table.begin(
                self.thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
                lease_seconds=lease_seconds, now=now,
            )
            if retention is not None:  # the reference deletes at once
                table.purge(older_than=instant(now - retention.effect_records_seconds))
            return claim

    def complete_effect_record(  # noqa: D102
        self, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        with self._data.lock:
            return self._open_data().effect_records.complete(
                self.thread_id, key, owner=owner, result_json=result_json, now=now,
                status=status,
            )

    def renew_effect_record(  # noqa: D102
        self, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        with self._data.lock:
            return self._open_data().effect_records.renew(
                self.thread_id, key, owner=owner, lease_seconds=lease_seconds, now=now)

    def release_effect_record(self, key: str, *, owner: str) -> EffectRecord | None:  # noqa: D102
        with self._data.lock:
            table = self._open_data().effect_records
            record = table.get(self.thread_id, key)
            if record is None or not table.release(self.thread_id, key, owner=owner):
                return None
            return record

    def expire_effect_leases(self, *, keep_owner_prefix: str, now: float) -> int:  # noqa: D102
        with self._data.lock:
            return self._open_data().effect_records.expire_leases(
                self.thread_id, keep_owner_prefix=keep_owner_prefix, now=now
            )

    def purge_effect_records(self, *, older_than: float | None) -> int:  # noqa: D102
        with self._data.lock:
            table = self._open_data().effect_records
            if older_than is None:
                return table.purge_thread(self.thread_id)
            return table.purge(older_than=instant(older_than))

    def list_effect_records(  # noqa: D102
        self,
        *,
        status: EffectRecordStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        check_limit(limit)
        if cursor is not None:
            decode_cursor(cursor)
        with self._data.lock:
            return self._open_data().effect_records.list(
                self.thread_id, status=status, limit=limit, cursor=cursor, hide_journal=True
            )

    # ------------------------------------------------------------------ meta

    def set_meta(  # noqa: D102 - contract in base
        self, key: str, value: str, *, fence: str | None = None
    ) -> None:
        with self._data.lock:
            self._open_data().meta[key] = value

    def get_meta(self, key: str) -> str | None:  # noqa: D102 - contract in base
        with self._data.lock:
            return self._open_data().meta.get(key)

    # -------------------------------------------------------------- messages

    def insert_messages(  # noqa: D102 - contract in base
        self, messages: Sequence[Message], *, fence: str | None = None
    ) -> None:
        rows = [
            _StoredMessage(
                m.id, str(m.role), m.content, m.created_at_ts, m.run_id, m.meta_json(), m.data
            )
            for m in messages
        ]
        with self._data.lock:
            data = self._open_data()
            ids = [r.id for r in rows]
            if len(set(ids)) != len(ids) or any(i in data.message_index for i in ids):
                raise ThreadStorageError(
                    self.thread_id,
                    f"Thread {self.thread_id}: a message id of the batch exists already",
                )
            for row in rows:
                data.message_index[row.id] = len(data.messages)
                data.messages.append(row)

    def _message(self, row: _StoredMessage) -> Message:
        return message_from_row(
            self.thread_id, id=row.id, role=row.role, content=row.content,
            created_at_ts=row.created_at_ts, run_id=row.run_id, meta=row.meta, data=row.data,
        )

    def list_messages(  # noqa: D102
        self,
        *,
        limit: int = 50,
        after_id: str | None = None,
        before_id: str | None = None,
        latest: bool = False,
    ) -> tuple[list[Message], str | None, str | None] | None:
        with self._data.lock:
            data = self._open_data()
            rows = data.messages
            if before_id is not None or latest:
                end = len(rows)
                if before_id is not None:
                    found = data.message_index.get(before_id)
                    if found is None:
                        return None
                    end = found
                start = max(0, end - limit)
                page = [self._message(r) for r in rows[start:end]]
                newer = before_id is not None  # the message it was asked to page back from
                return (
                    page,
                    page[-1].id if page and newer else None,
                    page[0].id if page and start > 0 else None,
                )
            start = 0
            if after_id is not None:
                found = data.message_index.get(after_id)
                if found is None:
                    return None
                start = found + 1
            page = [self._message(r) for r in rows[start:start + limit]]
            return (
                page,
                page[-1].id if start + limit < len(rows) else None,
                page[0].id if page and after_id is not None else None,
            )

    def get_message(self, message_id: str) -> Message | None:  # noqa: D102
        with self._data.lock:
            data = self._open_data()
            index = data.message_index.get(message_id)
            return None if index is None else self._message(data.messages[index])

    def all_messages(self) -> list[Message]:  # noqa: D102
        with self._data.lock:
            return [self._message(r) for r in self._open_data().messages]

    def close(self) -> None:  # noqa: D102
        self._closed = True


class MemoryRuntimeStore(RuntimeStore):
    """The registry and alarm index of a `MemoryBackend`."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend
        self._closed = False

    def _check(self) -> MemoryBackend:
        if self._closed:
            raise RuntimeClosed("The memory backend's runtime store is closed")
        return self._backend

    def add_thread(  # noqa: D102
        self, info: ThreadInfo, *, alarm_at: float | None = None
    ) -> bool:
        with self._backend.lock:
            data = self._check()
            if info.id in data.threads:
                return False
            data.threads[info.id] = replace(
                info, paused=False, last_activity_ts=info.created_at_ts
            )
            if alarm_at is not None:
                data.alarms[info.id] = min(data.alarms.get(info.id, alarm_at), alarm_at)
            return True

    def get_thread(self, thread_id: str) -> ThreadInfo | None:  # noqa: D102
        with self._backend.lock:
            return self._check().threads.get(thread_id)

    def list_threads(  # noqa: D102
        self, limit: int, after: tuple[float, str] | None, query: ThreadQuery | None = None
    ) -> tuple[list[ThreadInfo], tuple[float, str] | None]:
        q = query or ThreadQuery()

        def key(i: ThreadInfo) -> tuple[float, str]:
            if q.by_activity and i.last_activity_ts is not None:
                return (i.last_activity_ts, i.id)
            return (i.created_at_ts, i.id)

        with self._backend.lock:
            infos = [
                i for i in self._check().threads.values()
                if (q.user_id is None or i.user_id == q.user_id)
                and (q.agent_id is None or i.agent_id == q.agent_id)
                and (q.tag is None or q.tag in i.tags)
                and (after is None or key(i) < after)
            ]
        infos.sort(key=key, reverse=True)
        page = infos[:limit]
        cursor = key(page[-1]) if len(infos) > limit else None
        return page, cursor

    def touch_threads(self, activity: Mapping[str, float]) -> dict[str, float]:  # noqa: D102
        with self._backend.lock:
            self._touch(self._check().threads, activity)
        return {}

    @staticmethod
    def _touch(threads: dict[str, ThreadInfo], activity: Mapping[str, float]) -> None:
        for tid, ts in activity.items():
            info = threads.get(tid)
            if info is not None and (info.last_activity_ts is None or ts > info.last_activity_ts):
                threads[tid] = replace(info, last_activity_ts=ts)

    def set_paused(self, thread_id: str, paused: bool) -> bool:  # noqa: D102
        with self._backend.lock:
            threads = self._check().threads
            info = threads.get(thread_id)
            if info is None:
                return False
            threads[thread_id] = replace(info, paused=paused)
            return True

    def delete_thread(  # noqa: D102 - contract in base
        self, thread_id: str, *, frame: FrameDraft | None = None, now: float = 0.0,
        notify: tuple[str, str] | None = None,
    ) -> bool:
        del frame, now, notify  # no cluster bus: nothing to announce
        with self._backend.lock:
            backend = self._check()
            backend.alarms.pop(thread_id, None)
            for run_id in [k for k, r in backend.run_index.items() if r.thread_id == thread_id]:
                del backend.run_index[run_id]
            return backend.threads.pop(thread_id, None) is not None

    # ------------------------------------------------------------ run index

    def index_runs(self, runs: Sequence[EffectRun]) -> dict[str, float]:  # noqa: D102
        with self._backend.lock:
            backend = self._check()
            for run in runs:
                if run.thread_id in backend.threads:
                    previous = backend.run_index.get(run.id)
                    entry = replace(run, args=None, trace_context=None, waiting_for=None)
                    if previous is not None:  # what never changes stays as first written
                        entry = replace(entry, name=previous.name,
                                        created_at_ts=previous.created_at_ts,
                                        replay_of=previous.replay_of)
                    backend.run_index[run.id] = entry
            latest: dict[str, float] = {}
            for r in runs:
                ts = max(r.created_at_ts, r.started_at_ts or 0.0, r.finished_at_ts or 0.0)
                latest[r.thread_id] = max(ts, latest.get(r.thread_id, ts))
            self._touch(backend.threads, latest)
        return {}

    def _matching(
        self, query: RunQuery, now: float, retention: RetentionPolicy, *, statuses: bool
    ) -> list[EffectRun]:
        backend = self._check()
        out = []
        replayed = (
            {r.replay_of for r in backend.run_index.values() if r.replay_of is not None}
            if query.replayed is not None else set()
        )
        for run in backend.run_index.values():
            if _expired(run, now, retention):
                continue
            if query.replayed is not None and (run.id in replayed) != query.replayed:
                continue
            if statuses and query.statuses is not None and run.status not in query.statuses:
                continue
            if query.name is not None and run.name != query.name:
                continue
            if query.thread_id is not None and run.thread_id != query.thread_id:
                continue
            if query.since is not None and run.run_at_ts < query.since:
                continue
            if query.until is not None and run.run_at_ts >= query.until:
                continue
            if query.user_id is not None or query.tag is not None:
                info = backend.threads.get(run.thread_id)
                if info is None:
                    continue
                if query.user_id is not None and info.user_id != query.user_id:
                    continue
                if query.tag is not None and query.tag not in info.tags:
                    continue
            out.append(run)
        return out

    def list_indexed_runs(  # noqa: D102
        self,
        query: RunQuery,
        now: float,
        retention: RetentionPolicy,
        limit: int,
        before: tuple[float, str] | None = None,
    ) -> tuple[list[EffectRun], tuple[float, str] | None]:
        with self._backend.lock:
            runs = [
                r for r in self._matching(query, now, retention, statuses=True)
                if before is None or (r.created_at_ts, r.id) < before
            ]
        runs.sort(key=lambda r: (r.created_at_ts, r.id), reverse=True)
        page = runs[:limit]
        cursor = (page[-1].created_at_ts, page[-1].id) if len(runs) > limit else None
        return page, cursor

    def count_indexed_runs(  # noqa: D102
        self, query: RunQuery, now: float, retention: RetentionPolicy
    ) -> dict[EffectStatus, int]:
        counts = dict.fromkeys(EffectStatus, 0)
        with self._backend.lock:
            for run in self._matching(query, now, retention, statuses=False):
                counts[run.status] += 1
        return counts

    def prune_run_index(self, now: float, retention: RetentionPolicy) -> int:  # noqa: D102
        with self._backend.lock:
            index = self._check().run_index
            expired = [k for k, r in index.items() if _expired(r, now, retention)]
            for run_id in expired:
                del index[run_id]
            return len(expired)

    def run_index_complete(self) -> bool:  # noqa: D102
        with self._backend.lock:
            return self._check().run_index_is_complete

    def set_run_index_complete(self, complete: bool) -> None:  # noqa: D102
        with self._backend.lock:
            self._check().run_index_is_complete = complete

    def set_alarm(self, thread_id: str, due_at: float | None) -> None:  # noqa: D102
        with self._backend.lock:
            alarms = self._check().alarms
            if due_at is None:
                alarms.pop(thread_id, None)
            else:
                alarms[thread_id] = due_at

    def lower_alarm(self, thread_id: str, due_at: float) -> None:  # noqa: D102
        with self._backend.lock:
            alarms = self._check().alarms
            alarms[thread_id] = min(alarms.get(thread_id, due_at), due_at)

    def move_alarms(  # noqa: D102
        self, changes: Sequence[tuple[str, float | None, float | None]]
    ) -> list[tuple[str, float | None]]:
        with self._backend.lock:
            alarms = self._check().alarms
            applied: list[tuple[str, float | None]] = []
            for thread_id, expected, target in changes:
                if expected is None:
                    if target is not None:
                        alarms[thread_id] = min(alarms.get(thread_id, target), target)
                    continue
                if alarms.get(thread_id) != expected:
                    continue  # lowered (or removed) meanwhile: left alone
                if target is None:
                    del alarms[thread_id]
                else:
                    alarms[thread_id] = target
                applied.append((thread_id, target))
            return applied

    def get_record(self, scope: str, key: str) -> EffectRecord | None:  # noqa: D102
        with self._backend.lock:
            return self._check().records.get(scope, key)

    def begin_record(  # noqa: D102
        self, scope: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float, now: float,
    ) -> Claim:
        with self._backend.lock:
            return self._check().records.begin(
                scope, key, tool_name=tool_name, run_id=run_id, owner=owner,
                lease_seconds=lease_seconds, now=now,
            )

    def complete_record(  # noqa: D102
        self, scope: str, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus,
    ) -> EffectRecord:
        with self._backend.lock:
            return self._check().records.complete(
                scope, key, owner=owner, result_json=result_json, now=now, status=status,
            )

    def renew_record(  # noqa: D102
        self, scope: str, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        with self._backend.lock:
            return self._check().records.renew(
                scope, key, owner=owner, lease_seconds=lease_seconds, now=now)

    def release_record(self, scope: str, key: str, *, owner: str) -> bool:  # noqa: D102
        with self._backend.lock:
            return self._check().records.release(scope, key, owner=owner)

    def list_records(  # noqa: D102
        self, scope: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        with self._backend.lock:
            return self._check().records.list(scope, status=status, limit=limit, cursor=cursor)

    def delete_records(self, scope: str) -> int:  # noqa: D102
        with self._backend.lock:
            return self._check().records.purge_thread(scope)

    def purge_records(self, *, older_than: float) -> int:  # noqa: D102
        with self._backend.lock:
            return self._check().records.purge(older_than=instant(older_than))

    def load_alarms(self, until: float | None = None) -> list[tuple[str, float]]:  # noqa: D102
        with self._backend.lock:
            return [(t, due) for t, due in self._check().alarms.items()
                    if until is None or due < until]

    def close(self) -> None:  # noqa: D102
        self._closed = True


class MemoryBackend(StorageBackend):
    """Everything in memory, for tests: ``Runtime(..., storage=MemoryBackend())``.

    One runtime at a time may use it (`open` refuses a second one, as the SQLite backend's
    data-dir lock does); its data stays for the next runtime given the same backend.
    """

    kind = "memory"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: dict[str, ThreadInfo] = {}
        self.alarms: dict[str, float] = {}
        self.records = EffectRecordTable()  # runtime-level records (RuntimeStore.*_record)
        self.run_index: dict[str, EffectRun] = {}
        self.run_index_is_complete = True
        self.schema_version = RUNTIME_SCHEMA_VERSION
        self._thread_data: dict[str, _ThreadData] = {}
        self._in_use = False

    def open(self) -> MemoryRuntimeStore:  # noqa: D102 - contract in base
        with self.lock:
            if self._in_use:
                raise DataDirLocked(
                    "The memory backend is in use by another runtime; one runtime per backend"
                )
            if self.schema_version > RUNTIME_SCHEMA_VERSION:
                raise RuntimeStorageError(
                    f"Runtime store of the memory backend has schema version "
                    f"{self.schema_version}, newer than this runtime's "
                    f"{RUNTIME_SCHEMA_VERSION}; upgrade thread-effects"
                )
            self._in_use = True
            # A store no registry entry names (a crash during a create or delete) is
            # unreachable: discarded, as the SQLite backend removes such files.
            for thread_id in [t for t in self._thread_data if t not in self.threads]:
                log.warning("removing the store of %s: no registry entry (left by a crash "
                            "during a create or delete)", thread_id)
                self._thread_data.pop(thread_id).removed = True
        return MemoryRuntimeStore(self)

    def create_thread_store(self, info: ThreadInfo) -> MemoryThreadStore:  # noqa: D102
        data = _ThreadData(info.id)
        data.meta["thread_id"] = info.id
        data.meta["created_at"] = repr(info.created_at_ts)
        with self.lock:
            leftover = self._thread_data.get(info.id)
            if leftover is not None:
                leftover.removed = True
            self._thread_data[info.id] = data
        return MemoryThreadStore(data, self.node_id)

    def open_thread_store(self, thread_id: str) -> MemoryThreadStore:  # noqa: D102
        with self.lock:
            data = self._thread_data.get(thread_id)
        if data is None:
            raise ThreadStorageError(
                thread_id,
                f"Thread {thread_id}: its store is missing although the thread is "
                f"registered; delete the thread",
            )
        if data.schema_version > THREAD_SCHEMA_VERSION:
            raise ThreadStorageError(
                thread_id,
                f"Thread {thread_id}: store has schema version {data.schema_version}, newer "
                f"than this runtime's {THREAD_SCHEMA_VERSION}; upgrade thread-effects",
            )
        return MemoryThreadStore(data, self.node_id)

    def remove_thread_store(self, thread_id: str) -> None:  # noqa: D102
        with self.lock:
            data = self._thread_data.pop(thread_id, None)
        if data is not None:
            data.removed = True

    def set_thread_schema_version(self, thread_id: str, version: int) -> None:
        """Stamp a thread's stored data with a schema version (tests of version refusal).

        Raises:
            KeyError: the thread has no store here.
        """
        with self.lock:
            self._thread_data[thread_id].schema_version = version

    def close(self) -> None:  # noqa: D102
        with self.lock:
            self._in_use = False
