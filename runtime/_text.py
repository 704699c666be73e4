r"""Checks for text that reaches storage or the wire: valid Unicode, and within its limit.

Python strings may hold *lone surrogates* (``"\ud800"``, in Python as in JSON). They are
not Unicode text: SQLite cannot store them, and no JSON answer can carry them as UTF-8.
So they are refused where they enter (the HTTP body parser, the runtime's own API) before
anything is written.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.errors import InvalidArgument

NUL = "\x00"
"""The NUL character (U+0000): refused in identifiers, keys, names, tags and filters."""


def no_nul_message(what: str) -> str:
    """The error text for ``what`` holding NUL, e.g. ``"user_id holds a NUL ..."``."""
    return (f"{what} holds a NUL character (U+0000), which identifiers, keys, names, tags "
            f"and filters may not contain")

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> str | None:
    r"""The first lone surrogate in ``text``, spelled ``\udfff``; None for valid text."""
    match = _SURROGATE.search(text)
    return f"\\u{ord(match.group()):04x}" if match else None


def replace_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (for data stored before checks)."""
    return _SURROGATE.sub("\ufffd", text)


def _describe(path: str, key: bool) -> str:
    where = path or "the top level"
    return f"a key at {where}" if key else f"the string at {where}"


def find_invalid_text(value: Any) -> str | None:
    r"""Describe the first string (or object key) in a JSON value that is not valid Unicode.

    Args:
        value: A parsed JSON value (dicts, lists, strings, numbers, None).

    Returns:
        ``"the string at tags[0] holds the lone surrogate \udfff"``, or None when every
        string and key is valid.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    seen: set[int] = set()  # containers already walked: a cycle or a shared one is walked once
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, str):
            bad = lone_surrogate(item)
            if bad:
                return f"{_describe(path, False)} holds the lone surrogate {bad}"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and (bad := lone_surrogate(key)):
                    return f"{_describe(path, True)} holds the lone surrogate {bad}"
                name = str(key)
                stack.append((f"{path}.{name}" if path else name, child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def check_text(value: object, what: str, *, max_chars: int, nul: bool = False) -> str:
    """Return ``value`` if it is a string of valid Unicode of at most ``max_chars``.

    Args:
        value: The argument.
        what: Its name in the message, e.g. ``"user_id"`` or ``"tags[2]"``.
        max_chars: The longest accepted value, in characters.
        nul: Whether NUL (U+0000) is accepted: True for free text (message content);
            identifiers, keys, names and tags (the default) may not hold it.

    Raises:
        InvalidArgument: not a string, a lone surrogate, a NUL when ``nul`` is False, or
            too long (naming ``what``).
    """
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {type(value).__name__}")
    if not nul and NUL in value:
        raise InvalidArgument(no_nul_message(what))
    bad = lone_surrogate(value)
    if bad:
        raise InvalidArgument(
            f"{what} is not valid Unicode text: it holds the lone surrogate {bad}"
        )
    if len(value) > max_chars:
        raise InvalidArgument(
            f"{what} is {len(value)} characters; the limit is {max_chars}"
        )
    return value
