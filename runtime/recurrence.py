"""Recurring schedules: when a schedule fires next, and the `Schedule` record itself.

A schedule (`runtime.thread.ThreadState.schedule_recurring`) makes one run of an effect at
each of its fire times, either on a cron expression in a time zone (APScheduler 3's
`CronTrigger`, zones from `zoneinfo`) or every N seconds. This module only computes fire
times and checks the arguments; `runtime.schedules` stores schedules and fires them.

Fire times:

- ``every``: ``created_at + k * every`` for k = 1, 2, ...; the grid is anchored at the
  schedule's creation, so it never drifts with late drains or restarts.
- ``cron``: a crontab expression (weekdays as crontab numbers them: 0 or 7 = Sunday,
  1 = Monday; names ``mon``-``sun`` work too), read in the schedule's time zone by
  APScheduler 3 (`_trigger` hands it the weekdays as names, since APScheduler 3 numbers
  them from Monday). DST follows APScheduler's rule. On a spring-forward day a
  wall time that does not exist (02:30 in Europe/Berlin on 2026-03-29) fires once, at the
  instant that wall time would be without the shift (01:30 UTC, 03:30 local); on a
  fall-back day a wall time that happens twice (02:30 on 2026-10-25) fires twice, once in
  each offset (00:30 and 01:30 UTC). An hourly ``0 * * * *`` stays hourly in UTC on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from runtime.errors import InvalidSchedule, short_repr

MIN_EVERY_SECONDS = 1.0
"""Shortest ``every`` accepted, in seconds."""

MAX_EVERY_SECONDS = 10 * 365 * 86_400.0
"""Longest ``every`` accepted: 10 years (as the longest delay)."""

MAX_CRON_CHARS = 200
"""Longest cron expression accepted, in characters."""

_ISO_MAX = datetime(9999, 1, 1, tzinfo=UTC).timestamp()


class ScheduleState(StrEnum):
    """A schedule is ``active`` (it fires) or ``paused`` (it creates nothing)."""

    ACTIVE = "active"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class Recurrence:
    """When a schedule fires: a cron expression in a zone, or every N seconds.

    Build one with `Recurrence.parse`, which checks the arguments.

    Attributes:
        cron: A five-field crontab expression (``"0 9 * * 1-5"``), or None.
        timezone: The IANA zone the cron expression is read in (``"Europe/Istanbul"``);
            ``"UTC"`` by default; None with ``every``.
        every_seconds: The period in seconds, or None.
    """

    cron: str | None = None
    timezone: str | None = None
    every_seconds: float | None = None

    @staticmethod
    def parse(
        cron: object = None, timezone: object = None, every: object = None
    ) -> Recurrence:
        """Check and normalize the recurrence arguments.

        Args:
            cron: A crontab expression (minute hour day month weekday), or None.
            timezone: An IANA zone name for ``cron`` (default ``"UTC"``); not with ``every``.
            every: Seconds (int/float) or a `timedelta`, at least `MIN_EVERY_SECONDS`.

        Raises:
            InvalidSchedule: both or neither of ``cron`` and ``every``; a ``timezone``
                with ``every``; a cron expression that is not a string, too long or not
                valid (APScheduler's message is kept); an unknown ``timezone``; an
                ``every`` that is not a number or `timedelta`, not finite, under 1 s or
                over 10 years. Each message names the argument.
        """
        if cron is not None and every is not None:
            raise InvalidSchedule("give either cron or every, not both")
        if cron is None and every is None:
            raise InvalidSchedule("a recurring schedule needs cron or every")
        if every is not None:
            if timezone is not None:
                raise InvalidSchedule(
                    "timezone applies to cron only; every counts seconds, not wall time"
                )
            return Recurrence(every_seconds=_every_seconds(every))
        if not isinstance(cron, str):
            raise InvalidSchedule(f"cron must be a string, got {short_repr(cron)}")
        if len(cron) > MAX_CRON_CHARS:
            raise InvalidSchedule(
                f"cron must be at most {MAX_CRON_CHARS} characters, got {len(cron)}"
            )
        zone = "UTC" if timezone is None else timezone
        tz = _zone(zone)
        assert isinstance(zone, str)
        expr = " ".join(cron.split())
        try:
            _trigger(expr, tz)
        except (ValueError, TypeError) as exc:
            raise InvalidSchedule(
                f"cron {short_repr(cron)} is not a valid crontab expression "
                f"(minute hour day month weekday): {exc}"
            ) from None
        return Recurrence(cron=expr, timezone=zone)

    def next_fire(self, after_ts: float, anchor_ts: float) -> float | None:
        """The first fire time strictly after ``after_ts`` (seconds since the epoch, UTC).

        Args:
            after_ts: Fire times at or before it are past.
            anchor_ts: Where an ``every`` grid starts (the schedule's creation time).

        Returns:
            Seconds since the epoch, or None when the expression never fires again.
        """
        if self.every_seconds is not None:
            every = self.every_seconds
            k = max(1, math.floor((after_ts - anchor_ts) / every) + 1)
            fire = anchor_ts + k * every
            while fire <= after_ts:  # float rounding
                k += 1
                fire = anchor_ts + k * every
            return fire
        assert self.cron is not None and self.timezone is not None
        trigger = _trigger(self.cron, ZoneInfo(self.timezone))
        if after_ts >= _ISO_MAX:
            return None
        start = datetime.fromtimestamp(after_ts, UTC) + timedelta(microseconds=1)
        fire = trigger.get_next_fire_time(None, start)
        return None if fire is None else fire.timestamp()

    def to_json(self) -> dict[str, Any]:
        """``{"cron", "timezone", "everySeconds"}`` (the unused ones null)."""
        return {"cron": self.cron, "timezone": self.timezone, "everySeconds": self.every_seconds}


_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@lru_cache(maxsize=256)
def _trigger(expr: str, tz: ZoneInfo) -> CronTrigger:
    """APScheduler's trigger for a crontab expression, weekdays numbered as crontab does.

    APScheduler 3 reads weekday numbers with 0 = Monday (its ``from_crontab`` warns of it);
    crontab (and so this runtime) has 0 or 7 = Sunday, 1 = Monday. The weekday field is
    therefore handed over as names. Cached: a fire computes the fire times it skipped one
    by one, and a trigger is immutable.

    Raises:
        ValueError: the expression is not valid (APScheduler's message, or ours).
    """
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields, got {len(fields)}")
    minute, hour, day, month, weekday = fields
    return CronTrigger(
        minute=minute, hour=hour, day=day, month=month,
        day_of_week=_weekday_names(weekday), timezone=tz,
    )


def _weekday_number(text: str) -> int:
    lowered = text.lower()
    if lowered in _WEEKDAYS:
        return _WEEKDAYS.index(lowered)
    if text.isdigit() and int(text) <= 7:
        return int(text) % 7
    raise ValueError(f"weekday {text!r} is not 0-7 (0 and 7: Sunday) nor sun-sat")


def _weekday_names(field: str) -> str:
    """A crontab weekday field (``1-5``, ``0,6``, ``*/2``, ``mon-fri``) as a list of names."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        span, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"weekday step {step_text!r} is not a positive integer")
            step = int(step_text)
        if span == "*":
            first, last = 0, 6
        elif "-" in span:
            a, _, b = span.partition("-")
            first = _weekday_number(a)
            last = 7 if b == "7" else _weekday_number(b)  # "5-7": Friday to Sunday
            if last < first:
                raise ValueError(f"weekday range {span!r} runs backwards")
        else:
            first = last = _weekday_number(span)
        days.update(d % 7 for d in range(first, last + 1, step))
    return ",".join(_WEEKDAYS[d] for d in sorted(days))


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > 100:
        raise InvalidSchedule(f"timezone must be an IANA zone name, got {short_repr(name)}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"Unknown timezone {short_repr(name)}: not an IANA zone name "
            f"(such as 'Europe/Istanbul' or 'UTC')"
        ) from None


def _every_seconds(every: object) -> float:
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        if isinstance(every, int) and abs(every) > MAX_EVERY_SECONDS:
            raise InvalidSchedule(
                f"every must be at most {MAX_EVERY_SECONDS:.0f} s (10 years), got a larger "
                f"number"
            )
        seconds = float(every)
    else:
        raise InvalidSchedule(
            f"every must be seconds (int or float) or a timedelta, got {short_repr(every)}"
        )
    if not math.isfinite(seconds):
        raise InvalidSchedule(f"every must be a finite number of seconds, got {every!r}")
    if seconds < MIN_EVERY_SECONDS:
        raise InvalidSchedule(
            f"every must be at least {MIN_EVERY_SECONDS:g} s (the minimum period), "
            f"got {seconds:g} s"
        )
    if seconds > MAX_EVERY_SECONDS:
        raise InvalidSchedule(
            f"every must be at most {MAX_EVERY_SECONDS:.0f} s (10 years), got {seconds:g} s"
        )
    return seconds


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule of a thread: an effect, its args, and when it fires.

    Times are seconds since the Unix epoch (UTC) in the ``*_ts`` fields.

    Attributes:
        id: The schedule id (32 hex characters).
        thread_id: The thread it belongs to.
        name: The effect (qualified name for a package's effect).
        args: The JSON args each occurrence run gets.
        recurrence: When it fires.
        state: ``active`` or ``paused``.
        next_fire_at_ts: Its next fire time (None while paused, or when a cron expression
            never fires again).
        created_at_ts: When it was made (the anchor of an ``every`` grid).
        key: Its key (at most one schedule per key in a thread), or None.
        occurrences: How many occurrence runs it created.
        skipped: How many fire times it skipped because its previous occurrence was
            still pending or running (it never stacks runs).
        last_run_id: The run of its latest occurrence, or None.
        last_fire_at_ts: The fire time of its latest occurrence or skip, or None.
    """

    id: str
    thread_id: str
    name: str
    args: Any
    recurrence: Recurrence
    state: ScheduleState
    next_fire_at_ts: float | None
    created_at_ts: float
    key: str | None = None
    occurrences: int = 0
    skipped: int = 0
    last_run_id: str | None = None
    last_fire_at_ts: float | None = None

    def to_json(self, *, include_args: bool = False) -> dict[str, Any]:
        """The wire form (camelCase keys, ISO 8601 UTC times); args only when asked for."""
        out: dict[str, Any] = {
            "id": self.id,
            "threadId": self.thread_id,
            "name": self.name,
            **self.recurrence.to_json(),
            "state": str(self.state),
            "nextFireAt": _iso(self.next_fire_at_ts),
            "createdAt": _iso(self.created_at_ts),
            "key": self.key,
            "occurrences": self.occurrences,
            "skipped": self.skipped,
            "lastRunId": self.last_run_id,
            "lastFireAt": _iso(self.last_fire_at_ts),
        }
        if include_args:
            out["args"] = self.args
        return out
