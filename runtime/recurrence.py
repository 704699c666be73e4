"""Recurring schedules: when a schedule fires next, and the `Schedule` record itself.

A schedule (`runtime.thread.ThreadState.schedule_recurring`) makes one run of an effect at
each of its fire times, either on a cron expression in a time zone (APScheduler 3's
`CronTrigger`, zones from `zoneinfo`) or every N seconds. This module only computes fire
times and checks the arguments; `runtime.schedules` stores schedules and fires them.

Fire times:

- ``every``: ``created_at + k * every`` for k = 1, 2, ...; the grid is anchored at the
  schedule's creation, so it never drifts with late drains or restarts.
- ``cron``: a crontab expression (weekdays as crontab numbers them: 0 or 7 = Sunday,
  1 = Monday; names ``mon``-``sun`` work too; when both the day-of-month and the weekday
  are restricted, a day matching either fires, as in Vixie cron). APScheduler 3's
  `CronTrigger` gives the matching wall times (`_wall_triggers`); this module maps each
  to instants in the schedule's zone (`_instants`), the same way in every zone. On a
  spring-forward day a wall time that does not exist (02:30 in Europe/Berlin on
  2026-03-29; 00:00 in America/Havana on 2026-03-08) fires once, shifted by the gap
  (01:30 UTC, 03:30 local; 05:00 UTC, 01:00 local); on a fall-back day a wall time that
  happens twice (02:30 on 2026-10-25) fires twice, once in each offset (00:30 and 01:30
  UTC). An hourly ``0 * * * *`` stays hourly in UTC on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from apscheduler.triggers.cron import CronTrigger

from runtime._limits import utc_instant
from runtime.errors import InvalidSchedule, short_repr

MIN_EVERY_SECONDS = 1.0
"""Shortest ``every`` accepted, in seconds."""

MAX_EVERY_SECONDS = 10 * 365 * 86_400.0
"""Longest ``every`` accepted: 10 years (as the longest delay)."""

MAX_CRON_CHARS = 200
"""Longest cron expression accepted, in characters."""

_ISO_MAX = datetime(9999, 1, 1, tzinfo=UTC).timestamp()
_NEVER_CHECK_FROM = datetime(2000, 1, 1, tzinfo=UTC).timestamp()
"""`Recurrence.parse` refuses a cron expression with no fire time after this instant: a
day-and-month combination that never exists (``0 9 31 2 *``)."""


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
        cron: object = None,
        timezone: object = None,
        every: object = None,
        *,
        every_name: str = "every",
    ) -> Recurrence:
        """Check and normalize the recurrence arguments.

        Args:
            cron: A crontab expression (minute hour day month weekday), or None.
            timezone: An IANA zone name for ``cron`` (default ``"UTC"``), or a `ZoneInfo`
                made from one (``ZoneInfo("Europe/Berlin")``: its key is kept); not with
                ``every``.
            every: Seconds (int/float) or a `timedelta`, at least `MIN_EVERY_SECONDS`.
            every_name: How messages name ``every`` (``"every_seconds"`` over HTTP).

        Raises:
            InvalidSchedule: both or neither of ``cron`` and ``every``; a ``timezone``
                with ``every``; a cron expression that is not a string, too long or not
                valid (APScheduler's message is kept); an unknown ``timezone``; an
                ``every`` that is not a number or `timedelta`, not finite, under 1 s or
                over 10 years. Each message names the argument.
        """
        if cron is not None and every is not None:
            raise InvalidSchedule(f"give either cron or {every_name}, not both")
        if cron is None and every is None:
            raise InvalidSchedule(f"a recurring schedule needs cron or {every_name}")
        if every is not None:
            if timezone is not None:
                raise InvalidSchedule(
                    f"timezone applies to cron only; {every_name} counts seconds, not wall "
                    f"time"
                )
            return Recurrence(every_seconds=_every_seconds(every, every_name))
        if not isinstance(cron, str):
            raise InvalidSchedule(f"cron must be a string, got {short_repr(cron)}")
        if len(cron) > MAX_CRON_CHARS:
            raise InvalidSchedule(
                f"cron must be at most {MAX_CRON_CHARS} characters, got {len(cron)}"
            )
        if isinstance(timezone, ZoneInfo):
            # Its key is the IANA name it was made from (None when read from a file).
            timezone = timezone.key if timezone.key is not None else timezone
        zone = "UTC" if timezone is None else timezone
        tz = _zone(zone)
        assert isinstance(zone, str)
        expr = " ".join(cron.split())
        try:
            _wall_triggers(expr)
        except (ValueError, TypeError) as exc:
            raise InvalidSchedule(
                f"cron {short_repr(cron)} is not a valid crontab expression "
                f"(minute hour day month weekday): {exc}"
            ) from None
        if _next_cron_fire(expr, tz, _NEVER_CHECK_FROM) is None:
            raise InvalidSchedule(
                f"cron {short_repr(cron)} never fires: no date matches its day and month "
                f"fields (such as 31 in February)"
            )
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
        return _next_cron_fire(self.cron, ZoneInfo(self.timezone), after_ts)

    def to_json(self) -> dict[str, Any]:
        """``{"cron", "timezone", "everySeconds"}`` (the unused ones null)."""
        return {"cron": self.cron, "timezone": self.timezone, "everySeconds": self.every_seconds}


_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


_LOOKAROUND = timedelta(days=2)
"""How far around a time `_next_cron_fire` looks for a clock change (gap or repeat)."""

_MAX_WALLS = 100_000
"""Most candidate wall times one `_next_cron_fire` call looks at (a bound, never reached
by a valid expression: a minutely one needs the minutes of one gap or repeat)."""


@lru_cache(maxsize=256)
def _wall_triggers(expr: str) -> tuple[CronTrigger, ...]:
    """APScheduler triggers giving the wall times (naive, read as UTC) an expression matches.

    Wall times, not instants: `_next_cron_fire` maps each to the instants it names in the
    schedule's zone, so DST is handled here, the same way in every zone (APScheduler 3's
    own zone handling skips a day whose matching wall time is in a gap when the gap starts
    at midnight, as in America/Havana).

    Crontab's day rule: when both the day-of-month and the weekday field are restricted
    (neither starts with ``*``), a day matching *either* fires (Vixie cron); that is two
    triggers, one per field, and the earliest wall time of both is taken. Otherwise one.

    APScheduler 3 reads weekday numbers with 0 = Monday (its ``from_crontab`` warns of it);
    crontab (and so this runtime) has 0 or 7 = Sunday, 1 = Monday. The weekday field is
    therefore handed over as names. Cached: a trigger is immutable.

    Raises:
        ValueError: the expression is not valid (APScheduler's message, or ours).
    """
    if not expr.isascii():
        raise ValueError("only ASCII characters are allowed (digits 0-9, names, * , - /)")
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields, got {len(fields)}")
    for label, field in zip(("minute", "hour", "day", "month", "weekday"), fields, strict=True):
        for part in field.split(","):
            _, slash, step = part.partition("/")
            # APScheduler lets "jan-dec/0" (a step on month names) through: check every form.
            if slash and not (step.isascii() and step.isdigit() and int(step) > 0):
                raise ValueError(f"{label} step {step!r} in {part!r} is not a positive integer")
    minute, hour, day, month, weekday = fields
    days = _weekday_names(weekday)

    def trigger(day: str, day_of_week: str) -> CronTrigger:
        return CronTrigger(
            minute=minute, hour=hour, day=day, month=month, day_of_week=day_of_week,
            timezone=UTC,
        )

    if day.startswith("*") or weekday.startswith("*"):
        return (trigger(day, days),)
    return (trigger(day, "*"), trigger("*", days))


def _next_wall(triggers: tuple[CronTrigger, ...], start: datetime) -> datetime | None:
    """The first wall time at or after ``start`` (naive) matching any trigger, or None."""
    found = [
        fire
        for t in triggers
        if (fire := t.get_next_fire_time(None, start.replace(tzinfo=UTC))) is not None
    ]
    return min(found).replace(tzinfo=None) if found else None


def _instants(wall: datetime, tz: ZoneInfo) -> tuple[float, ...]:
    """The instants (seconds, UTC) a naive wall time names in ``tz``, earliest first.

    One for an ordinary wall time; two (one per offset) for a wall time that happens twice
    on a fall-back day; for one that does not exist (in a spring-forward gap), the instant
    it would be at the offset before the change: shifted by the gap (PEP 495, fold=0).
    """
    first = wall.replace(tzinfo=tz, fold=0).timestamp()
    second = wall.replace(tzinfo=tz, fold=1).timestamp()
    if first == second:
        return (first,)
    if datetime.fromtimestamp(first, tz).replace(tzinfo=None) == wall:
        return (min(first, second), max(first, second))  # a repeated wall time
    return (first,)  # in a gap


def _offset(at: datetime) -> timedelta:
    """The UTC offset of an aware time (``timedelta(0)`` in UTC or GMT: never falsy-skipped)."""
    offset = at.utcoffset()
    assert offset is not None, "an aware datetime has an offset"
    return offset


def _next_cron_fire(expr: str, tz: ZoneInfo, after_ts: float) -> float | None:
    """The first instant strictly after ``after_ts`` at which ``expr`` fires in ``tz``.

    The expression's matching wall times are walked in order from a little before the
    wall time of ``after_ts`` (by the size of any clock change within two days, so a wall
    time in a gap just passed, or repeated just ahead, is seen), each mapped to its
    instants (`_instants`); the earliest instant after ``after_ts`` wins. Along the walk a
    wall time's earliest instant never falls by more than a gap (a wall time shifted by a
    gap can come after the next wall times after the gap), so the walk stops at the first
    one more than the largest change met past the best found; with no change met or
    nearby, wall times and instants go in step and the first one after ``after_ts`` wins.
    """
    if after_ts >= _ISO_MAX:
        return None
    triggers = _wall_triggers(expr)
    at = datetime.fromtimestamp(after_ts, tz)
    offset = _offset(at)
    # An offset of zero (Europe/London in winter) is a real offset, not a missing one.
    shift = max(
        abs(_offset(datetime.fromtimestamp(after_ts + d, tz)) - offset)
        for d in (-_LOOKAROUND.total_seconds(), _LOOKAROUND.total_seconds())
    )
    wall: datetime | None = at.replace(tzinfo=None) - shift
    best: float | None = None
    for _ in range(_MAX_WALLS):
        wall = _next_wall(triggers, wall) if wall is not None else None
        if wall is None:
            break
        instants = _instants(wall, tz)
        # A wall time in a gap or repeat met farther on widens the margin by its size.
        change = abs(
            wall.replace(tzinfo=tz, fold=1).timestamp()
            - wall.replace(tzinfo=tz, fold=0).timestamp()
        )
        shift = max(shift, timedelta(seconds=change))
        if best is not None and instants[0] > best + shift.total_seconds():
            break
        for instant in instants:
            if instant > after_ts and (best is None or instant < best):
                best = instant
        if best is not None and not shift:
            break  # no clock change met or nearby: wall times and instants go in step
        wall += timedelta(microseconds=1)
    return best


def _weekday_number(text: str) -> int:
    lowered = text.lower()
    if lowered in _WEEKDAYS:
        return _WEEKDAYS.index(lowered)
    if text.isascii() and text.isdigit() and int(text) <= 7:
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
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
                raise ValueError(f"weekday step {step_text!r} is not a positive integer")
            step = int(step_text)
        if span == "*":
            first, last = 0, 6
        elif "-" in span:
            a, _, b = span.partition("-")
            first = 7 if a == "7" else _weekday_number(a)  # "7-7": Sunday only
            # "5-7" and "fri-sun": Friday to Sunday (7 and sun end a range as Sunday)
            last = 7 if b == "7" or b.lower() == "sun" else _weekday_number(b)
            if last < first:
                raise ValueError(f"weekday range {span!r} runs backwards")
        else:
            first = last = _weekday_number(span)
        days.update(d % 7 for d in range(first, last + 1, step))
    return ",".join(_WEEKDAYS[d] for d in sorted(days))


@lru_cache(maxsize=1)
def _iana_names() -> frozenset[str]:
    """The IANA zone names this host knows, without the host-dependent ones.

    Left out: ``localtime`` and the ``posix/`` and ``right/`` copies.
    """
    return frozenset(
        name for name in available_timezones()
        if name != "localtime" and not name.startswith(("posix/", "right/"))
    )


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > 100:
        raise InvalidSchedule(f"timezone must be an IANA zone name, got {short_repr(name)}")
    if name not in _iana_names():
        raise InvalidSchedule(
            f"Unknown timezone {short_repr(name)}: not an IANA zone name "
            f"(such as 'Europe/Istanbul' or 'UTC')"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"Unknown timezone {short_repr(name)}: not an IANA zone name "
            f"(such as 'Europe/Istanbul' or 'UTC')"
        ) from None


def _every_seconds(every: object, name: str) -> float:
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        if isinstance(every, int) and abs(every) > MAX_EVERY_SECONDS:
            raise InvalidSchedule(
                f"{name} must be at most {MAX_EVERY_SECONDS:.0f} s (10 years), got a larger "
                f"number"
            )
        seconds = float(every)
    else:
        raise InvalidSchedule(
            f"{name} must be seconds (int or float) or a timedelta, got {short_repr(every)}"
        )
    if not math.isfinite(seconds):
        raise InvalidSchedule(f"{name} must be a finite number of seconds, got {every!r}")
    if seconds < MIN_EVERY_SECONDS:
        raise InvalidSchedule(
            f"{name} must be at least {MIN_EVERY_SECONDS:g} s (the minimum period), "
            f"got {seconds:g} s"
        )
    if seconds > MAX_EVERY_SECONDS:
        raise InvalidSchedule(
            f"{name} must be at most {MAX_EVERY_SECONDS:.0f} s (10 years), got {seconds:g} s"
        )
    return seconds


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return utc_instant(ts).isoformat().replace("+00:00", "Z")


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
        paused_reason: Why the runtime paused it (``"effect not found: ping"``), or None
            (active, or paused by a caller). Kept in memory by the process that paused
            it: after a restart the schedule is still paused, without the reason.
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
    paused_reason: str | None = None

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
            "pausedReason": self.paused_reason,
        }
        if include_args:
            out["args"] = self.args
        return out
