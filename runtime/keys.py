"""Effect keys: canonical JSON, the default key of a tool call, and effect markers.

One module for keys, shared by effect tools (`runtime.effect_tools`) and what journals
tool calls later.

**Canonical JSON** is RFC 8785 (JSON Canonicalization Scheme, through the maintained
``rfc8785`` package) of a value after this normalization:

- a pydantic model is dumped with ``model_dump(mode="json")`` (aliases off), then
  normalized like the rest;
- mappings keep their keys (which must be strings) and are emitted with sorted keys, so
  keys in any order give the same text at every depth;
- lists and tuples are JSON arrays, in their order;
- ``datetime``, ``date``, ``time``, ``timedelta``, ``UUID``, ``Decimal``, enums and
  ``bytes`` become their pydantic JSON form (``datetime(2024, 1, 1, tzinfo=UTC)`` →
  ``"2024-01-01T00:00:00Z"``, ``Decimal("1.10")`` → ``"1.10"``) — so a value and its JSON
  text give the same key, as they do once a model has validated them;
- ``str``, ``int`` (within ±(2**53 - 1), the I-JSON range), finite ``float``, ``bool`` and
  ``None`` are themselves;
- anything else — a function, an object, a ``set`` (its order is not stable across
  processes), a cycle, a non-string mapping key, NaN or an infinity, an integer beyond
  I-JSON — is a `TypeError` naming the tool (when given) and the path of the bad value,
  e.g. ``args.items[2].when``.

A pydantic model dumps a ``set`` field in iteration order, which for strings differs
between processes: declare such fields as lists (sorted) when they feed a key.

**Args hashes** (`args_hash`) key durable tool calls on their arguments
(``idempotency="args"``, `runtime.durable`). Unlike canonical JSON, the hash is
**type-tagged**: every value is hashed with its type, so values that print alike never share
a key — a ``datetime`` and its ISO string, a ``set`` and a ``list``, a ``tuple`` and a
``list``, ``True`` and ``1``, ``Decimal("1")`` and ``1``, ``bytes`` and ``str``. ``1`` and
``1.0`` are different keys too (an ``int`` and a ``float``); tools hash their *validated*
arguments, so a field declared ``float`` turns the model's ``1`` into ``1.0`` before hashing
and both spellings share a key. Mappings (any keys of supported types) and sets are
order-free. The empty arguments (``{}`` or ``None``) hash to the reserved token
`NO_ARGS_HASH`. Containers nest at most `MAX_JSON_DEPTH` (64) levels deep; deeper is a
`TypeError` naming ``args_hash`` and the limit.

**Effect markers** tag what an effect left in the world, so ``already_applied`` can find
it: ``effect_marker(key)`` is ``<!-- thread-effects:effect=<key> -->``. A key is escaped
in a marker, never refused: ``%``, ``<``, ``>``, whitespace and control characters, and a
``-`` that follows another ``-`` are percent-encoded (UTF-8, ``%XX``), so no key can end
the comment (``-->``) or contain ``--``; `find_effect_markers` decodes them, so
``find_effect_markers(effect_marker(k)) == [k]`` for every key.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import enum
import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping, Set
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import rfc8785
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runtime._limits import MAX_JSON_DEPTH, cut

MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer I-JSON (RFC 7493) carries exactly; larger ones are refused."""

MAX_EFFECT_KEY_LENGTH = 1024
"""The longest effect key, in characters."""

NO_ARGS_HASH = "no-args"
"""What `args_hash` returns for the empty arguments (``{}`` or ``None``): a tool without
arguments. Never a sha256 hex digest, so it matches no other arguments."""

_MARKER_PREFIX = "<!-- thread-effects:effect="
_MARKER_SUFFIX = " -->"
_MARKER_RE = re.compile(r"<!-- thread-effects:effect=(\S+) -->")
_JSON_FORM_TYPES = (_dt.datetime, _dt.date, _dt.time, _dt.timedelta, uuid.UUID, Decimal,
                    enum.Enum, bytes)


def canonical_json(value: Any, *, tool_name: str | None = None) -> str:
    """The canonical JSON text of a value (RFC 8785 after the module's normalization).

    Args:
        value: A pydantic model, or JSON-like data (mappings with string keys, lists,
            tuples, strings, numbers, booleans, None) that may hold datetimes, dates,
            UUIDs, Decimals, enums and bytes.
        tool_name: Named in the error message (the key of which tool failed).

    Returns:
        Compact JSON with sorted keys, as RFC 8785 writes it.

    Raises:
        TypeError: a value the normalization does not support, naming the tool and the
            path of the value (``args.items[2]``); a value that holds itself (a cycle); or
            one nesting containers deeper than `MAX_JSON_DEPTH` levels.
    """
    root = "args" if tool_name is not None else "value"
    normalized = _normalize(value, root, set(), tool_name)
    try:
        return rfc8785.dumps(normalized).decode("utf-8")
    except rfc8785.CanonicalizationError as exc:  # pragma: no cover - _normalize checks first
        raise TypeError(f"{_who(tool_name)}: cannot canonicalize {root}: {exc}") from None


def default_effect_key(run_id: str, tool_name: str, args: Any) -> str:
    """The default effect key of a tool call: one application per turn, tool and args.

    Args:
        run_id: The turn's run id.
        tool_name: The tool's name.
        args: The validated arguments (a pydantic model, or None for a tool without
            arguments, whose args count as ``{}``).

    Returns:
        ``<run_id>:<tool_name>:<sha256 hex of canonical_json(args)>``.

    Raises:
        TypeError: the args hold an unsupported value (see `canonical_json`).
        ValueError: an empty run id or tool name.
    """
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"default_effect_key: tool {tool_name}: run_id must be a non-empty "
                         f"string, got {run_id!r}")
    if not isinstance(tool_name, str) or not tool_name:
        raise ValueError(f"default_effect_key: tool_name must be a non-empty string, "
                         f"got {tool_name!r}")
    text = canonical_json({} if args is None else args, tool_name=tool_name)
    return f"{run_id}:{tool_name}:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


def check_effect_key(key: object, tool_name: str, *, what: str = "effect_key") -> str:
    """Check an effect key a tool computed.

    Args:
        key: What the tool's key function returned.
        tool_name: The tool, named in errors.
        what: The key function's option, named in errors (``effect_key`` or
            ``idempotency_key``).

    Returns:
        The key.

    Raises:
        TypeError: the key is not a string.
        ValueError: the key is empty or longer than `MAX_EFFECT_KEY_LENGTH` characters.
    """
    if not isinstance(key, str):
        raise TypeError(f"tool {tool_name}: {what} must return a string, "
                        f"got {type(key).__name__}")
    if not key:
        raise ValueError(f"tool {tool_name}: {what} returned an empty key")
    if len(key) > MAX_EFFECT_KEY_LENGTH:
        raise ValueError(f"tool {tool_name}: the key {what} returned is {len(key)} "
                         f"characters, over the limit of {MAX_EFFECT_KEY_LENGTH}")
    return key


def effect_marker(key: str) -> str:
    """The marker to embed in what an effect leaves behind (a comment, a note).

    Args:
        key: The effect key (any string; escaped as the module docstring says).

    Returns:
        ``<!-- thread-effects:effect=<escaped key> -->``.

    Raises:
        ValueError: an empty key.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"effect_marker: the key must be a non-empty string, got {key!r}")
    return f"{_MARKER_PREFIX}{_escape(key)}{_MARKER_SUFFIX}"


def find_effect_markers(text: str) -> list[str]:
    """The keys of the effect markers in a text, in order of appearance (repeats kept).

    Text written by others never makes it raise: a malformed escape decodes to U+FFFD,
    which matches no key `effect_marker` wrote.
    """
    return [unquote(m.group(1), errors="replace") for m in _MARKER_RE.finditer(text)]


def _escape(key: str) -> str:
    out: list[str] = []
    previous = ""
    for char in key:
        if (char in "%<>" or not char.isprintable() or char.isspace()
                or (char == "-" and previous == "-")):
            out.append("".join(f"%{b:02X}" for b in char.encode("utf-8")))
        else:
            out.append(char)
        previous = char
    return "".join(out)


def _who(tool_name: str | None) -> str:
    return f"canonical_json (tool {tool_name})" if tool_name is not None else "canonical_json"


def _unsupported(tool_name: str | None, path: str, what: str) -> TypeError:
    return TypeError(f"{_who(tool_name)}: {path} is {what}, which canonical JSON does not "
                     f"support (use JSON data, a pydantic model, or datetime/date/UUID/Decimal)")


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (not encodable as UTF-8), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _normalize(value: Any, path: str, active: set[int], tool_name: str | None) -> Any:
    if isinstance(value, str):
        at = _lone_surrogate(value)
        if at is not None:
            raise _unsupported(tool_name, path, f"a string with a lone surrogate "
                               f"(U+{ord(value[at]):04X} at index {at}, not valid Unicode)")
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        if abs(value) > MAX_SAFE_INTEGER:
            raise _unsupported(tool_name, path, f"the integer {value} (beyond ±(2**53 - 1))")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _unsupported(tool_name, path, f"the float {value}")
        return value
    if isinstance(value, BaseModel):
        if id(value) in active:
            raise _unsupported(tool_name, path, "a cycle")
        try:
            dumped = value.model_dump(mode="json")
        except (PydanticSerializationError, ValueError) as exc:
            raise TypeError(f"{_who(tool_name)}: {path} ({type(value).__name__}) cannot be "
                            f"dumped as JSON: {exc}") from None
        return _normalize(dumped, path, active | {id(value)}, tool_name)
    if isinstance(value, _JSON_FORM_TYPES):
        try:
            json_form = to_jsonable_python(value)
        except (PydanticSerializationError, ValueError) as exc:  # e.g. bytes not UTF-8
            raise _unsupported(tool_name, path, f"a {type(value).__name__} without a JSON "
                               f"form ({exc})") from None
        return _normalize(json_form, path, active, tool_name)
    if isinstance(value, Mapping | list | tuple):
        if id(value) in active:
            raise _unsupported(tool_name, path, "a cycle")
        if len(active) >= MAX_JSON_DEPTH:  # active holds one id per enclosing container
            raise TypeError(f"{_who(tool_name)}: {cut(path)} nests arrays/objects deeper than the "
                            f"limit of {MAX_JSON_DEPTH} levels")
        inner = active | {id(value)}
        if isinstance(value, Mapping):
            result: dict[str, Any] = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _unsupported(tool_name, f"{path}[{k!r}]",
                                       f"a mapping key of type {type(k).__name__}")
                if _lone_surrogate(k) is not None:
                    raise _unsupported(tool_name, f"{path}[{k!r}]",
                                       "a mapping key with a lone surrogate (not valid Unicode)")
                result[k] = _normalize(v, f"{path}.{k}", inner, tool_name)
            return result
        return [_normalize(v, f"{path}[{i}]", inner, tool_name) for i, v in enumerate(value)]
    kind = "a function" if callable(value) else f"a value of type {type(value).__name__}"
    raise _unsupported(tool_name, path, kind)


def args_hash(value: Any) -> str:
    """The type-tagged hash of a tool call's arguments (see the module docstring).

    Args:
        value: The validated arguments: a mapping (usually ``{parameter: value}``) or any
            value built from None, bool, int, float, str, bytes, Decimal, datetime, date,
            time, timedelta, UUID, enums, lists, tuples, sets, frozensets, mappings,
            pydantic models and dataclass instances.

    Returns:
        The sha256 hex digest of the tagged value; `NO_ARGS_HASH` for ``{}`` or ``None``.

    Raises:
        TypeError: an unsupported value (a function, an arbitrary object), a cycle, or
            containers nested deeper than `MAX_JSON_DEPTH` levels; the message names
            ``args_hash``, the type or the limit, and the path (``args.items[2]``).
    """
    if value is None or (isinstance(value, Mapping) and not value):
        return NO_ARGS_HASH
    tagged = _tag(value, "args", set())
    text = json.dumps(tagged, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _order(tagged: Any) -> str:
    # The sort key of a tagged item (mapping entries, set members); the item itself stays
    # structured, so a nested mapping is not escaped once per level around it.
    return json.dumps(tagged, ensure_ascii=False, separators=(",", ":"))


def _tag(value: Any, path: str, active: set[int]) -> Any:
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, enum.Enum):
        return ["enum", _qualname(value), value.name]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytes | bytearray):
        return ["bytes", base64.b64encode(bytes(value)).decode("ascii")]
    if isinstance(value, Decimal):
        return ["decimal", str(value)]
    if isinstance(value, _dt.datetime):
        return ["datetime", value.isoformat()]
    if isinstance(value, _dt.date):
        return ["date", value.isoformat()]
    if isinstance(value, _dt.time):
        return ["time", value.isoformat()]
    if isinstance(value, _dt.timedelta):
        return ["timedelta", value.days, value.seconds, value.microseconds]
    if isinstance(value, uuid.UUID):
        return ["uuid", str(value)]
    if id(value) in active:
        raise TypeError(f"args_hash: {path} is a cycle ({type(value).__name__} contains "
                        f"itself)")
    if len(active) >= MAX_JSON_DEPTH:  # active holds one id per enclosing container
        raise TypeError(f"args_hash: {path} nests containers deeper than the limit of "
                        f"{MAX_JSON_DEPTH} levels")
    inner = active | {id(value)}
    if isinstance(value, BaseModel):
        fields = {name: getattr(value, name) for name in type(value).model_fields}
        return ["model", _qualname(value),
                _tag_mapping(fields, path, inner)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return ["dataclass", _qualname(value),
                _tag_mapping(fields, path, inner)]
    if isinstance(value, Mapping):
        return ["map", _tag_mapping(value, path, inner)]
    if isinstance(value, list):
        return ["list", [_tag(v, f"{path}[{i}]", inner) for i, v in enumerate(value)]]
    if isinstance(value, tuple):
        return ["tuple", [_tag(v, f"{path}[{i}]", inner) for i, v in enumerate(value)]]
    if isinstance(value, Set):
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        return [tag, sorted((_tag(v, f"{path}{{}}", inner) for v in value), key=_order)]
    what = "a function" if callable(value) else "a value"
    raise TypeError(f"args_hash: {path} is {what} of type {type(value).__name__}, which "
                    f"cannot be hashed as arguments (use data: str, int, float, bool, None, "
                    f"bytes, Decimal, datetime, date, UUID, enums, lists, tuples, sets, "
                    f"mappings, pydantic models, dataclasses)")


def _qualname(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _tag_mapping(value: Mapping[Any, Any], path: str, active: set[int]) -> list[list[Any]]:
    items = []
    for k, v in value.items():
        label = k if isinstance(k, str) else repr(k)
        items.append([_tag(k, f"{path}[{label!r}]", active), _tag(v, f"{path}.{label}", active)])
    items.sort(key=_order)
    return items
