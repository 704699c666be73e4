"""What a background loop logs while the database cannot be reached (`runtime.outage`)."""

from __future__ import annotations

import logging

import pytest

from runtime.errors import DatabaseUnavailable, ThreadStorageError
from runtime.outage import OutageLog, log_failure

LOG = logging.getLogger("runtime.test-outage")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def unreachable() -> ThreadStorageError:
    try:
        try:
            raise DatabaseUnavailable("PostgreSQL database x cannot be reached")
        except DatabaseUnavailable as exc:
            raise ThreadStorageError("t", f"PostgreSQL failed: {exc}", unavailable=True) from exc
    except ThreadStorageError as exc:
        return exc


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, bool]]:
    return [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records
            if r.name == LOG.name]


def test_an_outage_is_one_warning_line_then_one_a_minute_then_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    failures = OutageLog(LOG, "writing the run index", clock=clock)
    for _ in range(10):  # a round every 2 s for 18 s: one line
        failures.failed(unreachable())
        clock.now += 2
    assert lines(caplog) == [(
        "WARNING", "writing the run index failed: the database cannot be reached ("
        "PostgreSQL failed: PostgreSQL database x cannot be reached); retrying", False)]
    caplog.clear()
    clock.now += 60
    failures.failed(unreachable())
    assert lines(caplog) == [(
        "WARNING", "writing the run index failed: the database still cannot be reached "
        "(10 failure(s) since the last line: PostgreSQL failed: PostgreSQL "
        "database x cannot be reached); retrying", False)]
    caplog.clear()
    failures.ok()
    failures.ok()
    assert lines(caplog) == [(
        "INFO", "writing the run index works again: the database answers (11 failure(s) "
        "while it could not be reached)", False)]
    caplog.clear()
    failures.failed(unreachable())  # the next outage is announced again
    assert [level for level, _, _ in lines(caplog)] == ["WARNING"]


def test_any_other_failure_keeps_its_error_line_and_traceback_every_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    failures = OutageLog(LOG, "looking for runs of dead nodes", clock=Clock())
    for _ in range(2):
        try:
            raise ValueError("a bug")
        except ValueError as exc:
            failures.failed(exc)
    failures.ok()  # no outage was going on: nothing to say
    assert lines(caplog) == [
        ("ERROR", "looking for runs of dead nodes failed (retrying)", True)] * 2


def test_a_one_off_failure_is_a_warning_line_when_the_database_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    log_failure(LOG, "updating the alarm rows at shutdown", unreachable())
    log_failure(LOG, "updating the alarm rows at shutdown", RuntimeError("disk"))
    assert [(level, tb) for level, _, tb in lines(caplog)] == [("WARNING", False),
                                                               ("ERROR", True)]


def test_the_pools_connection_warnings_pass_once_a_minute_with_the_count_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from runtime.logs import PoolOutageFilter, log_config

    clock = Clock()
    pool_filter = PoolOutageFilter(clock=clock)
    pool = logging.getLogger("psycopg.pool")
    pool.addFilter(pool_filter)
    caplog.set_level(logging.INFO)
    try:
        for _ in range(20):  # an outage: two warnings a second for 10 s
            pool.warning("error connecting in %r: %s", "thread-effects:public",
                         "connection refused")
            pool.warning("reconnection attempt in pool %r failed after %s sec",
                         "thread-effects:public", 2.0)
            clock.now += 0.5
        pool.warning("rolling back returned connection: %s", "<conn>")  # not about connecting
        clock.now += 60
        pool.warning("error connecting in %r: %s", "thread-effects:public", "connection refused")
    finally:
        pool.removeFilter(pool_filter)
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"] == [
        "error connecting in 'thread-effects:public': connection refused",
        "rolling back returned connection: <conn>",
        "error connecting in 'thread-effects:public': connection refused (39 more "
        "connection warning(s) of the pools not logged since the last one; --log-level "
        "debug shows them all)",
    ]
    # The server's logging installs it, except at the debug and trace levels.
    assert log_config("text", "info")["loggers"]["psycopg.pool"] == {"filters": ["pool_outage"]}
    assert "psycopg.pool" not in log_config("json", "debug")["loggers"]
