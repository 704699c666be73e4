"""Runtime settings, with their units and defaults (docs/design.md, "Decisions" and "Retention")."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_ATTEMPTS = 3
"""A run interrupted by a restart is re-queued; the third interruption fails it (docs/design.md)."""

DAY_SECONDS = 86_400.0

NODE_ID_MAX_CHARS = 128
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*")
"""A node id: a letter or digit, then letters, digits and ``. _ : @ -``; at most
`NODE_ID_MAX_CHARS` characters."""


def validate_node_id(node_id: str) -> str:
    """Return ``node_id`` if it is a valid node id.

    Raises:
        ValueError: empty, longer than `NODE_ID_MAX_CHARS`, or not of `NODE_ID_RE`'s shape
            (the message names the id and the rule).
    """
    if not isinstance(node_id, str) or not node_id:
        raise ValueError("node id must be a non-empty string")
    if len(node_id) > NODE_ID_MAX_CHARS:
        raise ValueError(f"node id {node_id[:40]!r}... is {len(node_id)} characters long; "
                         f"at most {NODE_ID_MAX_CHARS}")
    if not NODE_ID_RE.fullmatch(node_id):
        raise ValueError(f"invalid node id {node_id!r}: it must start with a letter or digit "
                         f"and hold only letters, digits and . _ : @ -")
    return node_id


def default_node_id() -> str:
    """``<hostname>:<pid>`` of this process (characters a node id cannot hold become ``-``)."""
    host = re.sub(r"[^A-Za-z0-9._@-]", "-", socket.gethostname()).strip("-") or "host"
    if not host[0].isalnum():
        host = f"h{host}"
    pid = str(os.getpid())
    return f"{host[: NODE_ID_MAX_CHARS - len(pid) - 1]}:{pid}"


class RetentionPolicy(BaseModel):
    """How long finished runs and effect-tool records are kept (docs/design.md, "Retention").

    Attributes:
        completed_seconds: Completed and canceled runs are kept this long after they
            finished (default 30 days).
        failed_seconds: Failed runs are kept this long (default 24 hours).
        max_finished: At most this many of the most recent finished runs are kept per
            thread (default 1,000).
        effect_records_seconds: Effect-tool records (`runtime.storage.records`) are kept
            this long after they last changed (default 30 days).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    completed_seconds: float = Field(default=30 * DAY_SECONDS, gt=0)
    failed_seconds: float = Field(default=DAY_SECONDS, gt=0)
    max_finished: int = Field(default=1000, ge=1)
    effect_records_seconds: float = Field(default=30 * DAY_SECONDS, gt=0)


IMMEDIATE_RUN_SECONDS = 1.0
"""A run scheduled by an effect with a delay under this (seconds) counts against
``Settings.max_immediate_runs_per_second``: a chain of such runs could run about as often
as one with no delay at all. A chain that waits 1 s or more per link is not a runaway."""


class Settings(BaseModel):
    """Everything `runtime.Runtime` can be tuned with; pass them as keyword arguments.

    Attributes:
        data_dir: Where ``runtime.sqlite`` and ``threads/<thread_id>.sqlite`` live.
        app_dir: The application folder (its ``effects/`` holds the effects); None = none.
        synchronous: SQLite ``synchronous`` for every database. ``FULL`` (default): an
            acknowledged schedule survives power loss. ``NORMAL``: faster, survives a
            process crash only.
        max_open_threads: Size of the LRU of open thread databases (each holds 3 file
            descriptors and about 134 KiB).
        max_concurrent_runs: Threads whose runs execute at the same moment, process-wide.
            0: this process runs no runs at all (it claims none; it still serves the API,
            schedules, cancels and runs turns): a node of a shared PostgreSQL database
            whose runs the other nodes run. The server reads ``--max-concurrent-runs`` /
            ``THREAD_EFFECTS_MAX_CONCURRENT_RUNS``.
        max_args_bytes: Largest args accepted, as UTF-8 JSON bytes (default 1 MiB).
        retention: See `RetentionPolicy`.
        shutdown_grace_seconds: On shutdown, runs still going after this are interrupted
            and re-queued.
        subscriber_queue_size: Events buffered per change subscriber before it is dropped.
        load_packages: Whether effects of installed packages (entry point group
            ``thread_effects.packages``) are loaded.
        model: The pydantic-ai model agents use unless they name their own, e.g.
            ``"openai:gpt-4o-mini"`` (the server reads ``THREAD_EFFECTS_MODEL``). None =
            the offline demo model of `runtime.demo_model`.
        max_immediate_runs_per_second: The guard against runaway chains: a thread's
            effects may schedule at most this many immediate runs (a delay under
            `IMMEDIATE_RUN_SECONDS`, 1 s: zero, 1e-9 or 0.5 alike) per second (counted in
            one-second windows of the clock); the next such schedule raises
            `runtime.errors.TooManyImmediateRuns`, which fails the run that made it.
            Schedules from outside effects (HTTP, tools, the app) are not counted.
            None = no guard.
        loop_stall_warning_seconds: An event loop blocked this long (seconds) is logged
            as a warning naming the effect, thread and run that held it (see
            `runtime.watchdog`); None = no watchdog.
        freeze_gc: Call ``gc.freeze()`` once started, moving every object alive then out
            of the collector's full passes (which otherwise stall the event loop for tens
            of ms in a large process). It changes the whole interpreter, so it is off in a
            library; the server turns it on.
        effect_tool_lease_seconds: How long an effect tool's in-progress record holds its
            effect key inside turns (docs/effect-tools.md); a holder that died (a killed
            process) is taken over after this, through ``already_applied`` first. It must
            exceed the longest ``execute``.
        effect_tool_wait_seconds: How long an effect tool call waits for another call
            holding the same key before it fails with `runtime.errors.EffectKeyBusy`.
        effect_tool_max_result_bytes: Largest recorded effect-tool result, as UTF-8 JSON
            bytes (default 1 MiB).
        database_url: None (default): every thread in its own SQLite file under
            ``data_dir``. A ``postgresql://user@host:5432/dbname`` URL: the registry, runs,
            alarms, messages and records live in that PostgreSQL database instead
            (`runtime.storage.postgres`, the ``postgres`` extra; docs/scale-out.md); a
            ``schema=<name>`` query parameter picks the PostgreSQL schema (default
            ``public``). The server reads ``THREAD_EFFECTS_DATABASE_URL``.
        node_id: This process's name among the processes sharing a database (a "node"):
            recorded on every run attempt it runs (on every backend), shown in the run
            detail, the pane and ``GET /api/health``. Default ``<hostname>:<pid>``. A
            letter or digit, then letters, digits and ``. _ : @ -``, at most 128
            characters. On PostgreSQL two live processes with the same node id are
            refused. The server reads ``--node-id`` / ``THREAD_EFFECTS_NODE_ID``.
        lease_seconds: PostgreSQL: the node lease period (seconds, default 30). A node
            renews its lease every third of it; a node that has not renewed it for this
            long is dead to the others, which re-queue its running runs and resume its
            turns. Ignored on SQLite (one process per data directory).
        cluster_poll_seconds: With a backend shared by several processes (PostgreSQL),
            how often a node reads the alarms due within its horizon: the safety net of
            the wake-ups sent as runs are scheduled (a lost one delays a run by at most
            about this, never loses it). Seconds; default 5.
        alarm_horizon_seconds: With a shared backend, a node keeps timers only for the
            alarms due within this many seconds (read again every ``cluster_poll_seconds``)
            and for those it set itself. Default 60. SQLite keeps a timer for every alarm.
        cluster_wake_grace_seconds: With a shared backend, how long after a run's due
            time a node other than the one that scheduled it wakes the thread (the first
            one of a rendezvous ranking of the live nodes; the second after twice this):
            the node that scheduled it claims it first, others only if it did not. None
            if that node claims no run (``max_concurrent_runs`` 0): the first one wakes
            the thread at its due time.
        frame_keep_seconds: With a shared backend, how long frames are kept in the
            database for nodes whose clients missed one (docs/scale-out.md).
    """

    # hide_input_in_errors: a refused database_url may hold a password.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    data_dir: Path
    app_dir: Path | None = None
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    max_open_threads: int = Field(default=1000, ge=1)
    max_concurrent_runs: int = Field(default=64, ge=0)
    max_args_bytes: int = Field(default=1 << 20, ge=2)
    retention: RetentionPolicy = RetentionPolicy()
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    subscriber_queue_size: int = Field(default=1000, ge=1)
    load_packages: bool = True
    model: str | None = None
    max_immediate_runs_per_second: int | None = Field(default=100, ge=1)
    loop_stall_warning_seconds: float | None = Field(default=1.0, gt=0)
    freeze_gc: bool = False
    effect_tool_lease_seconds: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    effect_tool_wait_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    effect_tool_max_result_bytes: int = Field(default=1 << 20, ge=1)
    database_url: str | None = Field(default=None, repr=False)  # it may hold a password
    node_id: str = Field(default_factory=default_node_id)
    lease_seconds: float = Field(default=30.0, ge=0.5, le=86_400.0, allow_inf_nan=False)

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, node_id: str) -> str:
        return validate_node_id(node_id)
    cluster_poll_seconds: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    alarm_horizon_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    cluster_wake_grace_seconds: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    frame_keep_seconds: float = Field(default=300.0, gt=0, allow_inf_nan=False)

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("postgresql://", "postgres://")):
            scheme = url.split("://", 1)[0] if "://" in url else url[:20]
            raise ValueError(  # never the whole URL: it may hold a password
                f"database_url must begin with postgresql:// "
                f"(postgresql://user@host:5432/dbname), not {scheme[:20]!r}"
            )
        return url
