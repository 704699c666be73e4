"""The server's logging setup: text for people, or one JSON object per line for machines.

`log_config` is handed to uvicorn (which applies it with `logging.config.dictConfig`). Both
formats go to standard error and carry the runtime's lines (``runtime``, ``runtime.runs``:
one per run transition, see `runtime.telemetry`) and uvicorn's. In JSON, every line is an
object with ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus the
record's own fields: a run transition adds ``thread_id``, ``run_id``, ``effect``,
``status``, ``change``, ``attempt``, ``lag_seconds`` and ``duration_seconds``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS

LOG_FORMATS = ("text", "json")
"""The values of ``--log-format``."""

LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""The values of ``--log-level`` (uvicorn's; ``trace`` is uvicorn's level below debug)."""


POOL_REPEAT_SECONDS = 60.0
"""`PoolOutageFilter` passes one of the pool's connection warnings per this many seconds."""

_POOL_CONNECT_WARNINGS = (
    "error connecting in", "reconnection attempt in pool", "discarding closed connection",
    "discarding broken connection",
)
"""The starts of psycopg_pool's warnings about connections it cannot make or keep."""


class PoolOutageFilter(logging.Filter):
    """Passes one of psycopg_pool's connection warnings a minute (the ``psycopg.pool`` logger).

    While the database cannot be reached, each of a node's pools warns at every attempt
    to connect (``error connecting in …``, ``reconnection attempt in pool … failed``):
    several lines a second, for what the runtime says once itself (the lease renewal's
    error, the bus's warning, one warning line per background loop). The first such
    warning passes, with libpq's own reason (connection refused, authentication failed,
    ...); the next ones within `POOL_REPEAT_SECONDS` are dropped, and the next one to
    pass says how many were. The pool's other records pass unchanged. `log_config`
    installs it unless the level is ``debug`` or ``trace`` (which show every warning).

    Args:
        repeat_seconds: The least time between two connection warnings passed.
        clock: Seconds, monotonic (`time.monotonic`; a fake one in tests).
    """

    def __init__(self, repeat_seconds: float = POOL_REPEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._repeat = repeat_seconds
        self._clock = clock
        self._passed_at: float | None = None
        self.dropped = 0
        """Connection warnings dropped since the last one passed."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a connection warning within `POOL_REPEAT_SECONDS` of the last passed."""
        if record.levelno != logging.WARNING or not (
                isinstance(record.msg, str) and record.msg.startswith(_POOL_CONNECT_WARNINGS)):
            return True
        now = self._clock()
        if self._passed_at is not None and now - self._passed_at < self._repeat:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = (f"{record.msg} ({self.dropped} more connection warning(s) of the "
                          f"pools not logged since the last one; --log-level debug shows "
                          f"them all)")  # no % in it: the record's args still fit
        self._passed_at, self.dropped = now, 0
        return True


class UtcFormatter(logging.Formatter):
    """`logging.Formatter` with ISO 8601 times in UTC (``2026-11-30T12:00:00.123Z``)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The record's time in UTC, to the millisecond."""
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + (
            f".{int(record.msecs):03d}Z"
        )


def log_config(log_format: str = "text", level: str = "info") -> dict[str, Any]:
    """A `logging.config.dictConfig` dictionary for the server process.

    Args:
        log_format: ``"text"`` or ``"json"``.
        level: The least severe level written (a name of `LEVELS`, any case).

    Returns:
        The configuration: one standard-error handler on the root logger; uvicorn's and
        the runtime's loggers propagate to it.

    Raises:
        ValueError: an unknown format or level (names it and the choices).
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, "
                         f"got {log_format!r}")
    name = level.lower()
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    # uvicorn registers "trace" (5) when it configures itself; it is just below debug.
    numeric = 5 if name == "trace" else logging.getLevelName(name.upper())
    formatter: dict[str, Any]
    if log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",  # ISO 8601, UTC
            # uvicorn adds its message again with terminal colors: not for machines.
            "reserved_attrs": [*RESERVED_ATTRS, "color_message"],
        }
    else:
        formatter = {
            "()": "runtime.logs.UtcFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        }
    config: dict[str, Any] = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
            },
        },
        "root": {"handlers": ["stderr"], "level": numeric},
        "loggers": {
            # uvicorn's own config would give them handlers of their own: here they share ours.
            "uvicorn": {"handlers": [], "level": numeric, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": numeric, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": numeric, "propagate": True},
            # The in-process timer logs each job it adds at INFO: one line per alarm.
            "apscheduler": {"level": max(numeric, logging.WARNING)},
        },
    }
    if numeric > logging.DEBUG:
        # A database outage: one of the pools' connection warnings a minute.
        config["filters"] = {"pool_outage": {"()": "runtime.logs.PoolOutageFilter"}}
        config["loggers"]["psycopg.pool"] = {"filters": ["pool_outage"]}
    return config
