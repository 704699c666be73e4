"""Limits on what users send, shared by the Python API and the HTTP API.

Every check here refuses bad input with an error that names the thing and the limit, and
never lets a huge or hostile value reach storage or raise an unexpected exception
(``OverflowError``, ``RecursionError``) deeper down:

- numbers: a delay is a finite number of seconds from 0 to 10 years (`delay_seconds`),
  whatever its size (``10**400`` is an `InvalidDelay`, not an ``OverflowError``); a JSON
  number too large for a float is refused where the body is parsed (`parse_json`);
  cursors are checked integers (`parse_run_cursor`, `parse_thread_cursor`).
- nesting: a request body nests at most `MAX_JSON_DEPTH` levels, an effect's args at most
  `MAX_ARGS_DEPTH` (`check_args_depth`).
- echo: a user value quoted in an error message is cut to `MAX_QUOTED_CHARS` characters
  (`quoted`).
- unknown fields: args may only hold the fields of the effect's schema, unless the schema
  allows extra fields (``model_config = ConfigDict(extra="allow")``) (`validate_args`).
"""

from __future__ import annotations

import json
import math
import re
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from runtime._text import NUL, no_nul_message
from runtime.errors import InvalidArgument, InvalidDelay, InvalidEffectArgs, short_repr

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects in a request body (the top level is depth 1)."""

MAX_ARGS_DEPTH = 32
"""Deepest nesting of arrays and objects in an effect's args (a top-level object is 1)."""

MAX_QUOTED_CHARS = 80
"""A user value quoted in an error message is cut to this many characters (ending in …)."""

MAX_DELAY_SECONDS = 10 * 365 * 86_400.0
"""Longest delay accepted: 10 years (an alarm must stay a representable datetime)."""

FIRST_INSTANT = "0001-01-01T00:00:00Z"
LAST_INSTANT = "9999-12-31T23:59:59Z"
"""The instants (UTC) the product stores and shows: every `datetime` in UTC lies between
them. An instant given with an offset (``0001-01-01T00:00:00+14:00``) can fall outside."""

MIN_INSTANT_TS = datetime(1, 1, 1, tzinfo=UTC).timestamp()
MAX_INSTANT_TS = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
"""`FIRST_INSTANT` and `LAST_INSTANT` as seconds since the epoch."""

MAX_CURSOR = 2**63 - 1
"""Largest run cursor (a SQLite integer)."""

_THREAD_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_DIGITS = re.compile(r"^[0-9]{1,19}\Z")
_TIMESTAMP = re.compile(r"^-?[0-9]{1,20}(\.[0-9]{1,20})?(e[-+]?[0-9]{1,3})?\Z")


MAX_INT_DIGITS = 4300
"""Longest integer accepted in JSON, in digits (Python's own limit on int/str conversion)."""


def quoted(value: object) -> str:
    """``value`` for an error message, cut to `MAX_QUOTED_CHARS` characters.

    Spelled as JSON (``true``, ``{"k": 1}``, ``"text"``), as HTTP clients wrote it; a
    value with no JSON form (a ``timedelta``) is spelled by its ``repr``. An integer too
    long to print is named by its size.
    """
    if isinstance(value, int) and not isinstance(value, bool) and _too_many_digits(value):
        return f"an integer of over {MAX_INT_DIGITS} digits"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return short_repr(value, MAX_QUOTED_CHARS)
    return cut(text)


def _too_many_digits(value: int) -> bool:
    # bit_length * log10(2) estimates the digits without converting (which would raise).
    return value.bit_length() * 0.30103 > MAX_INT_DIGITS - 1


def cut(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` cut to ``limit`` characters (the last one then ``…``), for error messages."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


class CyclicValue(ValueError):
    """A value holds itself (a list or dict inside itself): it has no JSON form."""


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists/tuples and dicts: 0 for a scalar, 1 for ``[]``.

    Iterative, so it never raises ``RecursionError`` however deep the value; only
    containers are visited, each once (a 2 MiB list of numbers takes milliseconds, and a
    container shared by many parents is measured once).

    Raises:
        CyclicValue: a container holds itself (``l = []; l.append(l)``), which would
            otherwise be walked forever.
    """
    containers = (dict, list, tuple)
    if not isinstance(value, containers):
        return 0
    heights: dict[int, int] = {}  # id of a finished container -> its depth
    on_path: set[int] = set()
    # Post-order walk: a container is entered (False), then left (True) once its children
    # are measured; one met again while still on the path is a cycle.
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, leaving = stack.pop()
        key = id(item)
        children = item.values() if isinstance(item, dict) else item
        if leaving:
            on_path.discard(key)
            heights[key] = 1 + max(
                (heights[id(c)] for c in children if isinstance(c, containers)), default=0
            )
        elif key in on_path:
            raise CyclicValue("it holds itself (a list or object inside itself)")
        elif key not in heights:
            on_path.add(key)
            stack.append((item, True))
            stack.extend((c, False) for c in children if isinstance(c, containers))
    return heights[id(value)]


_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def may_hold_surrogates(data: bytes) -> bool:
    r"""Whether JSON text could hold a lone surrogate (a ``\ud800`` escape, or one encoded).

    A fast scan, so the walk over the parsed value (`runtime._text.find_invalid_text`)
    only runs for the bodies that need it.
    """
    return _MAYBE_SURROGATE.search(data) is not None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {cut(text)} is out of range")
    return value


def _checked_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(
            f"an integer of {digits} digits is over the limit of {MAX_INT_DIGITS} digits"
        )
    return int(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON text, refusing what cannot be handled safely.

    Args:
        data: The JSON text (UTF-8 bytes or a string).
        max_depth: Deepest nesting of arrays and objects accepted.

    Returns:
        The parsed value.

    Raises:
        ValueError: not JSON (the message says where), ``NaN``/``Infinity``, a number
            beyond the float range (``1e400``) or an integer of over 4,300 digits, or
            nesting deeper than ``max_depth`` (naming the limit).
    """
    too_deep = f"it nests arrays/objects deeper than the limit of {max_depth} levels"
    try:
        value = json.loads(
            data,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_checked_int,
        )
    except RecursionError:
        raise ValueError(too_deep) from None
    if json_depth(value) > max_depth:
        raise ValueError(too_deep)
    return value


def _int_text(value: int, unit: str = "") -> str:
    return quoted(value) if _too_many_digits(value) else cut(str(value), 40) + unit


_DELAY_LIMIT = f"at most {MAX_DELAY_SECONDS:.0f} s (10 years)"
"""How an error names the delay limit (made once: `delay_seconds` runs per schedule)."""


def delay_seconds(delay: object, *, name: str = "delay") -> float:
    """Normalize a delay to seconds.

    Args:
        delay: Seconds (int or float, any size) or a `datetime.timedelta`.
        name: How the message names the delay (``"delay_seconds"`` over HTTP, where a
            ``timedelta`` cannot be sent and is not mentioned).

    Returns:
        A finite number of seconds from 0 to `MAX_DELAY_SECONDS` (10 years).

    Raises:
        InvalidDelay: for a negative, NaN, infinite or over-10-year delay, or one of
            another type.
    """
    if isinstance(delay, timedelta) and name == "delay":
        seconds = delay.total_seconds()
    elif isinstance(delay, int) and not isinstance(delay, bool):
        # Checked before float(), which overflows for 10**400.
        if delay < 0:
            raise InvalidDelay(
                f"{name} must be a finite number of seconds >= 0, got {_int_text(delay)}"
            )
        if delay > MAX_DELAY_SECONDS:
            raise InvalidDelay(
                f"{name} must be {_DELAY_LIMIT}, got {_int_text(delay, ' s')}"
            )
        seconds = float(delay)
    elif isinstance(delay, float):
        seconds = delay
    else:
        kinds = "seconds (int or float) or a timedelta" if name == "delay" else "a number"
        raise InvalidDelay(f"{name} must be {kinds}, got {quoted(delay)}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidDelay(
            f"{name} must be a finite number of seconds >= 0, got {quoted(delay)}"
        )
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidDelay(f"{name} must be {_DELAY_LIMIT}, got {seconds:g} s")
    return seconds


def parse_run_cursor(cursor: str) -> int:
    """A run-list cursor (``next_cursor`` of a page): a decimal integer of a run's position.

    Raises:
        ValueError: anything else, naming the value (cut).
    """
    if not _DIGITS.match(cursor) or int(cursor) > MAX_CURSOR:
        raise ValueError(f"Invalid cursor {quoted(cursor)}: pass nextCursor of the last page")
    return int(cursor)


MAX_CURSOR_SECONDS = 253_402_300_799.0
"""The last second of year 9999 (UTC), seconds since the epoch: the latest time a cursor names."""


def empty_filter(**filters: object) -> None:
    """Refuse a filter given as an empty string (None means "not filtered by it") or holding NUL.

    No identifier, name or tag may hold NUL (U+0000), so such a filter could match nothing;
    it is refused, as on every backend (PostgreSQL text cannot hold NUL at all).

    Raises:
        InvalidArgument: naming the first empty filter or the first holding NUL.
    """
    for key, value in filters.items():
        if value == "":
            raise InvalidArgument(
                f"{key} must not be empty; pass None to not filter by it"
            )
        if isinstance(value, str) and NUL in value:
            raise InvalidArgument(no_nul_message(key))



def parse_thread_cursor(cursor: str) -> tuple[float, str]:
    """A cursor of a thread or cross-thread run list: ``"<seconds>~<thread or run id>"``.

    The seconds are from 0 to the end of year 9999 (`MAX_CURSOR_SECONDS`).

    Raises:
        ValueError: anything else, naming the value (cut).
    """
    ts, sep, tid = cursor.partition("~")
    # ASCII only: float() also takes "1_0", " 1", "+1" and other scripts' digits.
    created = float(ts) if _TIMESTAMP.match(ts) else math.inf
    # A time the API can show: from the epoch to the end of year 9999 (UTC).
    if not sep or not 0 <= created <= MAX_CURSOR_SECONDS or not _THREAD_ID_RE.match(tid):
        raise ValueError(f"Invalid cursor {quoted(cursor)}: pass nextCursor of the last page")
    return created, tid


def check_args_depth(name: str, args: Any) -> None:
    """Refuse args nested deeper than `MAX_ARGS_DEPTH` (before they are encoded).

    Raises:
        InvalidEffectArgs: naming the effect and the limit, or saying the args hold
            themselves (a cycle).
    """
    try:
        depth = json_depth(args)
    except CyclicValue as exc:
        raise InvalidEffectArgs(f"Args for effect {name} are not JSON: {exc}") from None
    if depth > MAX_ARGS_DEPTH:
        raise InvalidEffectArgs(
            f"Args for effect {name} nest arrays/objects deeper than the limit of "
            f"{MAX_ARGS_DEPTH} levels"
        )


def _validation_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(args)"
        parts.append(f"{cut(loc)}: {err['msg']}")
    return "; ".join(parts)


def _unknown_fields(given: Any, kept: Any, named: Any, path: str) -> list[str]:
    """Keys of ``given`` that validation dropped (absent from both dumps of the model)."""
    if isinstance(given, dict) and isinstance(kept, dict) and isinstance(named, dict):
        unknown: list[str] = []
        for key, child in given.items():
            where = f"{path}.{key}" if path else str(key)
            if key in kept:
                unknown += _unknown_fields(child, kept[key], named.get(key), where)
            elif key in named:
                unknown += _unknown_fields(child, named[key], kept.get(key), where)
            else:
                unknown.append(where)
        return unknown
    if (
        isinstance(given, list) and isinstance(kept, list) and isinstance(named, list)
        and len(given) == len(kept) == len(named)
    ):
        return [
            field
            for i, (g, k, n) in enumerate(zip(given, kept, named, strict=True))
            for field in _unknown_fields(g, k, n, f"{path}[{i}]")
        ]
    return []


def validate_args(schema: type[BaseModel], value: Any, name: str) -> None:
    """Validate JSON args against an effect's schema, refusing unknown fields.

    A field the schema does not declare is refused (at any depth), unless its model allows
    extra fields (``model_config = ConfigDict(extra="allow")``), as unknown fields of a
    request body are: a typo (``{"txt": ...}``) must not be stored and dropped silently.

    Raises:
        InvalidEffectArgs: naming the effect, each failing field and each unknown field.
    """
    try:
        model = schema.model_validate(value)
    except ValidationError as exc:
        raise InvalidEffectArgs(
            f"Args for effect {name} fail its schema: {_validation_summary(exc)}"
        ) from None
    problem = unknown_fields(model, value)
    if problem:
        raise InvalidEffectArgs(f"Args for effect {name} fail its schema: {problem}")


_PLAIN_FIELDS: weakref.WeakKeyDictionary[type[BaseModel], frozenset[str] | None] = (
    weakref.WeakKeyDictionary()
)


def _plain_fields(model: type[BaseModel]) -> frozenset[str] | None:
    """The model's field names if none has an alias (a key is then known iff it is one)."""
    try:
        return _PLAIN_FIELDS[model]
    except KeyError:
        pass
    fields = model.model_fields
    plain = None if any(
        f.alias is not None or f.validation_alias is not None for f in fields.values()
    ) else frozenset(fields)
    _PLAIN_FIELDS[model] = plain
    return plain


def _only_declared_scalars(model: type[BaseModel], given: Any) -> bool:
    """``given`` is an object of declared fields whose values hold no object or array."""
    if type(given) is not dict:
        return False
    names = _plain_fields(model)
    if names is None:
        return False
    for key, value in given.items():
        if key not in names or isinstance(value, dict | list):
            return False
    return True


def unknown_fields(model: BaseModel, given: Any) -> str | None:
    """Describe the fields of ``given`` that validating it into ``model`` dropped.

    The one rule for effects, tools and request bodies: a field the schema does not
    declare, at any depth, is refused, unless its model allows extra fields
    (``model_config = ConfigDict(extra="allow")``, which keeps them).

    Args:
        model: The validated model.
        given: The JSON value it was validated from.

    Returns:
        ``"unknown field(s) extra, inner.typo; the schema Note does not allow extra
        fields"``, or None when every field is known.
    """
    if _only_declared_scalars(type(model), given):
        return None  # the common case, without dumping the model twice to compare
    unknown = _unknown_fields(
        given,
        model.model_dump(mode="json", by_alias=True),
        model.model_dump(mode="json", by_alias=False),
        "",
    )
    if not unknown:
        return None
    fields = ", ".join(cut(f, 40) for f in unknown[:5])
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    return (
        f"unknown field(s) {fields}{more}; "
        f"the schema {type(model).__name__} does not allow extra fields"
    )


def run_at_seconds(at: object, now: float, *, name: str = "at") -> float:
    """An absolute due time as seconds since the epoch (UTC).

    Args:
        at: An aware `datetime` (any time zone); a time in the past is due at once.
        now: The current time, seconds since the epoch.
        name: How the message names the argument (``"run_at"`` over HTTP).

    Returns:
        ``at`` as a timestamp.

    Raises:
        InvalidDelay: not a datetime, a naive one (no ``tzinfo``: which zone is meant is
            unknown), before `FIRST_INSTANT` in UTC (``0001-01-01T00:00:00+14:00``), or
            more than `MAX_DELAY_SECONDS` (10 years) from now.
    """
    if not isinstance(at, datetime):
        raise InvalidDelay(f"{name} must be an aware datetime, got {quoted(at)}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise InvalidDelay(
            f"{name} must be an aware datetime (with a time zone), got the naive "
            f"{at.isoformat()}"
        )
    ts = instant_seconds(at, name=name)
    if ts - now > MAX_DELAY_SECONDS:
        raise InvalidDelay(
            f"{name} must be at most {MAX_DELAY_SECONDS:.0f} s (10 years) from now, "
            f"got {at.isoformat()}"
        )
    return ts


def instant_seconds(at: datetime, *, name: str = "at") -> float:
    """An aware datetime as seconds since the epoch, if it lies within the storable range.

    Args:
        at: An aware `datetime` (any time zone).
        name: How the message names the field (``"run_at"``, ``"until"``).

    Returns:
        ``at`` as a timestamp, from `MIN_INSTANT_TS` to `MAX_INSTANT_TS`.

    Raises:
        InvalidDelay: ``at`` in UTC is before `FIRST_INSTANT` or after `LAST_INSTANT`
            (it could be stored but never shown again), naming ``name`` and the limit.
    """
    ts = at.timestamp()
    if ts < MIN_INSTANT_TS:
        raise InvalidDelay(
            f"{name} must be at or after {FIRST_INSTANT} (in UTC), got {at.isoformat()}"
        )
    if ts > MAX_INSTANT_TS:
        raise InvalidDelay(
            f"{name} must be at or before {LAST_INSTANT} (in UTC), got {at.isoformat()}"
        )
    return ts


def utc_instant(ts: float) -> datetime:
    """Seconds since the epoch as an aware UTC datetime, held within the storable range.

    Input is checked (`instant_seconds`), but a row stored before that check may hold an
    instant no `datetime` can show (``0000-12-31T10:00:00Z``): it is shown as the nearest
    one, `FIRST_INSTANT` or `LAST_INSTANT`, so that one such row never makes a listing
    fail. A run due before year 1 was due at once either way.

    Args:
        ts: Seconds since the epoch (UTC); finite.

    Returns:
        The aware UTC datetime, from `FIRST_INSTANT` to the last microsecond of year 9999.
    """
    try:
        return datetime.fromtimestamp(ts, UTC)
    except (ValueError, OverflowError, OSError):  # out of range: rare, checked only then
        return datetime.fromtimestamp(min(max(ts, MIN_INSTANT_TS), MAX_INSTANT_TS), UTC)
