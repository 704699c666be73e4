"""Identifiers: new run, thread and turn ids, and the rule a thread id must follow."""

from __future__ import annotations

import os
import random
import re
import time

from runtime._limits import quoted
from runtime.errors import InvalidThreadId

THREAD_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
"""Thread ids may become file names, so they are checked before they touch a path."""

_ids = random.Random()  # seeded from os.urandom once: uuid4() costs a syscall per id
os.register_at_fork(after_in_child=_ids.seed)  # a forked child must not repeat the parent


def new_id() -> str:
    """A new run/thread/turn id: 32 hex characters, time-ordered to the millisecond.

    48 bits of milliseconds since the epoch, then 80 random bits (as in UUIDv7), so ids
    sort by creation time and collide with negligible probability.
    """
    return f"{int(time.time() * 1000) & 0xFFFFFFFFFFFF:012x}{_ids.getrandbits(80):020x}"


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` if it matches ``^[A-Za-z0-9_-]{1,64}$``.

    Raises:
        InvalidThreadId: otherwise (e.g. ``"../x"``), naming the value and the rule.
    """
    if not isinstance(thread_id, str) or not THREAD_ID_RE.match(thread_id):
        raise InvalidThreadId(
            f"Invalid thread id {quoted(thread_id)}: must match ^[A-Za-z0-9_-]{{1,64}}$ "
            f"(letters, digits, '_' and '-', 1 to 64 characters)"
        )
    return thread_id
