"""How background work logs its failures while the database cannot be reached.

A loop that retries a database write or read (the run index's flusher, the alarm rows'
flusher, the sweeps for runs and turns of dead nodes) fails at every round of an outage.
A traceback per round says nothing the first line did not, and buries the lines that
matter: `OutageLog` logs such a failure as one WARNING line without a traceback, at the
first failure and then at most once a minute while the outage lasts, and one INFO line
when the loop's call works again. A failure that is not an unreachable database (a bug, a
constraint, a full disk) keeps its ERROR line and traceback, every time
(docs/scale-out.md, "When the database is unreachable").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from runtime.errors import database_unreachable

OUTAGE_REPEAT_SECONDS = 60.0
"""While an outage lasts, a background loop repeats its warning at most this often."""


class OutageLog:
    """The log lines of one background loop's failures (one instance per loop).

    Args:
        logger: Where the lines go.
        what: What the loop does, as the start of a line ("writing the run index").
        repeat_seconds: The least time between two warnings of the same outage.
        clock: Seconds, monotonic (`time.monotonic`; a fake one in tests).
    """

    def __init__(self, logger: logging.Logger, what: str, *,
                 repeat_seconds: float = OUTAGE_REPEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.what = what
        self._repeat = repeat_seconds
        self._clock = clock
        self._warned_at: float | None = None  # None: no outage going on
        self._since = 0  # failures since the last warning line
        self.failures = 0
        """Failures with an unreachable database in the current outage (0: none)."""

    @property
    def in_outage(self) -> bool:
        """Whether the last failure logged was an unreachable database, with no `ok` since."""
        return self._warned_at is not None

    def failed(self, error: BaseException, retry: str = "retrying") -> None:
        """Log ``error``, raised by the loop's call (call it from the ``except`` block).

        Args:
            error: What the call raised.
            retry: What happens next, the end of the line (``"retrying"``).
        """
        if not database_unreachable(error):
            self._log.error("%s failed (%s)", self.what, retry, exc_info=error)
            return
        now = self._clock()
        self.failures += 1
        self._since += 1
        if self._warned_at is None:
            self._warned_at, self._since = now, 0
            self._log.warning("%s failed: the database cannot be reached (%s); %s",
                              self.what, error, retry)
        elif now - self._warned_at >= self._repeat:
            self._log.warning("%s failed: the database still cannot be reached (%d failure(s) "
                              "since the last line: %s); %s", self.what, self._since, error,
                              retry)
            self._warned_at, self._since = now, 0

    def ok(self) -> None:
        """The loop's call worked: one INFO line if an outage was going on."""
        if self._warned_at is not None:
            self._log.info("%s works again: the database answers (%d failure(s) while it "
                           "could not be reached)", self.what, self.failures)
        self._warned_at, self._since, self.failures = None, 0, 0


def log_failure(logger: logging.Logger, what: str, error: BaseException) -> None:
    """Log a one-off failure of ``what`` ("writing the run index at shutdown").

    One WARNING line if the database cannot be reached, else an ERROR line with its
    traceback.
    """
    if database_unreachable(error):
        logger.warning("%s failed: the database cannot be reached (%s)", what, error)
    else:
        logger.error("%s failed", what, exc_info=error)
