"""Events: what happens to a thread, as delivered to its subscribers (docs/design.md, "Frames").

Every event class lives here. A thread has two kinds of event, numbered on one sequence
(``seq``) so that a subscriber that sees a gap knows it missed something of either kind:

- `EffectChanged`: a run was scheduled, started, finished, ... (``effect_changed`` frame);
- `MessageCreated`: a message was stored in the conversation (``message_created`` frame);
- `EffectRecordChanged`: an effect tool claimed, applied or released an effect key
  (``effect_record_changed`` frame);
- `ScheduleChanged`: a recurring schedule was created, fired, skipped a fire, paused,
  resumed or canceled (``schedule_changed`` frame);
- `ThreadDeleted`: the thread was deleted (``thread_deleted`` frame), sent only to the
  subscribers of every thread (a thread's own subscriptions end instead);
- `RelayedFrame`: any of those, published by another node of a shared backend (its frame).

Each has ``thread_id``, ``seq``, ``to_frame()`` and ``frame_text()`` (``to_frame()`` as
compact JSON, made once per event and shared by every WebSocket client that sends it).
`runtime.frames.ChangeHub` numbers and delivers them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

from runtime.effects import EffectRun
from runtime.messages import Message
from runtime.recurrence import Schedule

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
"""The one JSON encoder of frames (compact, ASCII-escaped, as ``json.dumps`` would)."""


def _frame_text(
    event: EffectChanged | MessageCreated | EffectRecordChanged | ScheduleChanged | ThreadDeleted,
) -> str:
    """``event.to_frame()`` as compact JSON, made on the first call and kept on the event."""
    text = event._text
    if text is None:
        text = _ENCODE(event.to_frame())
        object.__setattr__(event, "_text", text)
    return text


def _frame_bytes(event: ThreadEvent) -> bytes:
    """``event.frame_text()`` encoded, made on the first call and kept on the event."""
    data = event._bytes
    if data is None:
        data = event.frame_text().encode("ascii")
        object.__setattr__(event, "_bytes", data)
    return data


class RunChange(StrEnum):
    """What happened to a run, as carried by a change event."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    REQUEUED = "requeued"
    RESCHEDULED = "rescheduled"


@dataclass(frozen=True, slots=True)
class EffectChanged:
    """A change of one run, delivered to the thread's subscribers. Never carries the args.

    Attributes:
        thread_id: The thread.
        seq: Grows by one per event of the thread within this process (starts at 1), so
            a subscriber that sees a gap knows it missed events.
        change: What happened.
        run: The run after the change (its ``args`` are not part of `data`).
    """

    thread_id: str
    seq: int
    change: RunChange
    run: EffectRun = field(repr=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def data(self) -> dict[str, Any]:
        """The frame payload: the run's wire form without args, plus ``change``."""
        d = self.run.to_json(include_args=False)
        d.pop("threadId", None)
        d["change"] = str(self.change)
        return d

    def to_frame(self) -> dict[str, Any]:
        """The ``effect_changed`` WebSocket frame."""
        return {
            "type": "event",
            "eventType": "effect_changed",
            "threadId": self.thread_id,
            "seq": self.seq,
            "data": self.data,
        }

    def frame_text(self) -> str:
        """``to_frame()`` as compact JSON text; made on the first call, then the same string."""
        return _frame_text(self)

    def frame_bytes(self) -> bytes:
        """`frame_text` encoded (ASCII, hence UTF-8); made on the first call, then kept."""
        return _frame_bytes(self)


@dataclass(frozen=True, slots=True)
class MessageCreated:
    """A message stored in a thread, delivered to the thread's subscribers.

    Published once per stored message (the user's, the model's, tool results, injected
    ones), in the order they are stored, on the same per-thread sequence as
    `EffectChanged`.

    Attributes:
        thread_id: The thread.
        seq: The thread's event number, shared with run changes (see `EffectChanged`).
        message: The message as stored (after the ``before_create_message`` hooks).
    """

    thread_id: str
    seq: int
    message: Message = field(repr=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def data(self) -> dict[str, Any]:
        """The frame payload: the message exactly as ``GET .../messages/{id}`` returns it."""
        return self.message.to_json()

    def to_frame(self) -> dict[str, Any]:
        """The ``message_created`` WebSocket frame."""
        return {
            "type": "event",
            "eventType": "message_created",
            "threadId": self.thread_id,
            "seq": self.seq,
            "data": self.data,
        }

    def frame_text(self) -> str:
        """``to_frame()`` as compact JSON text; made on the first call, then the same string."""
        return _frame_text(self)

    def frame_bytes(self) -> bytes:
        """`frame_text` encoded (ASCII, hence UTF-8); made on the first call, then kept."""
        return _frame_bytes(self)


class RecordChange(StrEnum):
    """What happened to an effect record."""

    CLAIMED = "claimed"
    """A call holds the key (status ``in_progress``), new or taken over from an expired lease."""
    APPLIED = "applied"
    """The result is recorded (status ``applied``)."""
    RELEASED = "released"
    """The call failed: its in-progress record is gone, nothing is recorded."""


@dataclass(frozen=True, slots=True)
class EffectRecordChanged:
    """A change of one effect record (`runtime.storage.records`), for the thread's subscribers.

    Attributes:
        thread_id: The thread.
        seq: The thread's event number, shared with run changes (see `EffectChanged`).
        change: What happened.
        record: The record after the change, as ``GET .../effect-records`` shows it (for
            ``released``: as it was before it was dropped).
    """

    thread_id: str
    seq: int
    change: RecordChange
    record: dict[str, Any] = field(repr=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def data(self) -> dict[str, Any]:
        """The frame payload: the record's wire form plus ``change``."""
        return {**self.record, "change": str(self.change)}

    def to_frame(self) -> dict[str, Any]:
        """The ``effect_record_changed`` WebSocket frame."""
        return {
            "type": "event",
            "eventType": "effect_record_changed",
            "threadId": self.thread_id,
            "seq": self.seq,
            "data": self.data,
        }

    def frame_text(self) -> str:
        """``to_frame()`` as compact JSON text; made on the first call, then the same string."""
        return _frame_text(self)

    def frame_bytes(self) -> bytes:
        """`frame_text` encoded (ASCII, hence UTF-8); made on the first call, then kept."""
        return _frame_bytes(self)


class ScheduleChange(StrEnum):
    """What happened to a recurring schedule."""

    CREATED = "created"
    FIRED = "fired"
    """A fire time came: its occurrence run was stored (``lastRunId``)."""
    SKIPPED = "skipped"
    """A fire time came while its previous occurrence was pending or running: nothing was
    stored, ``skipped`` grew by one."""
    PAUSED = "paused"
    RESUMED = "resumed"
    CANCELED = "canceled"
    """It was deleted (its runs stay)."""


@dataclass(frozen=True, slots=True)
class ScheduleChanged:
    """A change of one recurring schedule, for the thread's subscribers. Never carries args.

    Attributes:
        thread_id: The thread.
        seq: The thread's event number, shared with run changes (see `EffectChanged`).
        change: What happened.
        schedule: The schedule after the change (as it was, for ``canceled``).
    """

    thread_id: str
    seq: int
    change: ScheduleChange
    schedule: Schedule = field(repr=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def data(self) -> dict[str, Any]:
        """The frame payload: the schedule's wire form without args, plus ``change``."""
        d = self.schedule.to_json(include_args=False)
        d.pop("threadId", None)
        d["change"] = str(self.change)
        return d

    def to_frame(self) -> dict[str, Any]:
        """The ``schedule_changed`` WebSocket frame."""
        return {
            "type": "event",
            "eventType": "schedule_changed",
            "threadId": self.thread_id,
            "seq": self.seq,
            "data": self.data,
        }

    def frame_text(self) -> str:
        """``to_frame()`` as compact JSON text; made on the first call, then the same string."""
        return _frame_text(self)

    def frame_bytes(self) -> bytes:
        """`frame_text` encoded (ASCII, hence UTF-8); made on the first call, then kept."""
        return _frame_bytes(self)


@dataclass(frozen=True, slots=True)
class ThreadDeleted:
    """A thread was deleted: for the subscribers of every thread (`Runtime.subscribe_runs`).

    The thread's own subscriptions end instead (their iteration stops). Sent after the
    thread and its runs are gone, so a client that holds its runs drops them.

    Attributes:
        thread_id: The deleted thread.
        seq: The thread's next event number (see `EffectChanged`); its last event.
    """

    thread_id: str
    seq: int
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def to_frame(self) -> dict[str, Any]:
        """The ``thread_deleted`` WebSocket frame (no ``data``)."""
        return {
            "type": "event",
            "eventType": "thread_deleted",
            "threadId": self.thread_id,
            "seq": self.seq,
        }

    def frame_text(self) -> str:
        """``to_frame()`` as compact JSON text; made on the first call, then the same string."""
        return _frame_text(self)

    def frame_bytes(self) -> bytes:
        """`frame_text` encoded (ASCII, hence UTF-8); made on the first call, then kept."""
        return _frame_bytes(self)


@dataclass(frozen=True, slots=True)
class RelayedFrame:
    """An event another node published, as its frame (a backend several nodes share).

    A subscriber on this node gets the events published here as their own classes, and
    those published on another node as this: the frame's text, exactly as that node made
    it (docs/scale-out.md, "Frames across nodes").

    Attributes:
        thread_id: The thread.
        seq: The thread's event number (shared by every node).
        event_type: The frame's ``eventType`` (``effect_changed``, ``message_created``,
            ``effect_record_changed``, ``schedule_changed``, ``thread_deleted``).
        text: The frame as compact JSON.
    """

    thread_id: str
    seq: int
    event_type: str
    text: str = field(repr=False)
    _bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def to_frame(self) -> dict[str, Any]:
        """The frame, parsed."""
        frame: dict[str, Any] = json.loads(self.text)
        return frame

    def frame_text(self) -> str:
        """The frame's JSON text, as the node that published it made it."""
        return self.text

    def frame_bytes(self) -> bytes:
        """`frame_text` encoded (ASCII, hence UTF-8); made on the first call, then kept."""
        return _frame_bytes(self)


EVENT_TYPES: dict[type, str] = {
    EffectChanged: "effect_changed",
    MessageCreated: "message_created",
    EffectRecordChanged: "effect_record_changed",
    ScheduleChanged: "schedule_changed",
    ThreadDeleted: "thread_deleted",
}
"""The frame ``eventType`` of each event class."""


ThreadEvent: TypeAlias = (
    EffectChanged | MessageCreated | EffectRecordChanged | ScheduleChanged | ThreadDeleted
    | RelayedFrame
)
"""What a `runtime.frames.Subscription` yields (`ThreadDeleted`: only to those of every
thread)."""
