"""The SQLite schema: DDL generated from the models in `runtime.storage.models`.

Generated; do not edit. After changing a model or a migration step there, regenerate with
``.venv/bin/python -m runtime.storage.models`` (tests/test_schema.py fails while this file
differs from what the models generate). The SQLite backend (`runtime.storage.sqlite`) runs
these statements with plain ``sqlite3``, so SQLModel and SQLAlchemy are not imported at run
time.
"""
# ruff: noqa: E501 - one statement per line, as generated

THREAD_META_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE thread_meta (\n"
        "\t\"key\" VARCHAR NOT NULL, \n"
        "\tvalue VARCHAR NOT NULL, \n"
        "\tPRIMARY KEY (\"key\")\n"
        ")"
    ),
)
"""Table ``thread_meta`` and its indexes (ThreadMetaRow)."""

EFFECT_RUNS_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE effect_runs (\n"
        "\tseq INTEGER NOT NULL, \n"
        "\tid VARCHAR NOT NULL, \n"
        "\tname VARCHAR NOT NULL, \n"
        "\tstatus VARCHAR NOT NULL, \n"
        "\targs VARCHAR, \n"
        "\trun_at FLOAT NOT NULL, \n"
        "\tcreated_at FLOAT NOT NULL, \n"
        "\tstarted_at FLOAT, \n"
        "\tfinished_at FLOAT, \n"
        "\tattempts INTEGER NOT NULL, \n"
        "\terror VARCHAR, \n"
        "\treplay_of VARCHAR, \n"
        "\t\"key\" VARCHAR, \n"
        "\tcanceled_by VARCHAR, \n"
        "\tschedule_id VARCHAR, \n"
        "\tPRIMARY KEY (seq), \n"
        "\tUNIQUE (id)\n"
        ")"
    ),
    "CREATE INDEX ix_effect_runs_due ON effect_runs (status, run_at, seq) WHERE status = 'pending' OR status = 'running'",
    "CREATE INDEX ix_effect_runs_finished ON effect_runs (status, finished_at) WHERE finished_at IS NOT NULL",
    "CREATE INDEX ix_effect_runs_name ON effect_runs (name, seq)",
    "CREATE UNIQUE INDEX ix_effect_runs_pending_key ON effect_runs (\"key\") WHERE status = 'pending' AND \"key\" IS NOT NULL",
)
"""Table ``effect_runs`` and its indexes (EffectRunRow)."""

MESSAGES_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE messages (\n"
        "\tseq INTEGER NOT NULL, \n"
        "\tid VARCHAR NOT NULL, \n"
        "\trole VARCHAR NOT NULL, \n"
        "\tcontent VARCHAR NOT NULL, \n"
        "\tcreated_at FLOAT NOT NULL, \n"
        "\trun_id VARCHAR, \n"
        "\tmeta VARCHAR NOT NULL, \n"
        "\tdata VARCHAR NOT NULL, \n"
        "\tPRIMARY KEY (seq), \n"
        "\tUNIQUE (id)\n"
        ")"
    ),
    "CREATE INDEX ix_messages_run ON messages (run_id, seq)",
)
"""Table ``messages`` and its indexes (MessageRow)."""

EFFECT_RECORDS_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE effect_records (\n"
        "\tthread_id VARCHAR NOT NULL, \n"
        "\t\"key\" VARCHAR NOT NULL, \n"
        "\ttool_name VARCHAR NOT NULL, \n"
        "\trun_id VARCHAR, \n"
        "\tstatus VARCHAR NOT NULL, \n"
        "\tresult VARCHAR, \n"
        "\towner VARCHAR, \n"
        "\tlease_expires_at FLOAT, \n"
        "\tcreated_at FLOAT NOT NULL, \n"
        "\tupdated_at FLOAT NOT NULL, \n"
        "\tPRIMARY KEY (thread_id, \"key\")\n"
        ")"
    ),
    "CREATE INDEX ix_effect_records_created ON effect_records (thread_id, created_at, \"key\")",
    "CREATE INDEX ix_effect_records_updated ON effect_records (updated_at)",
)
"""Table ``effect_records`` and its indexes (EffectRecordRow)."""

RUN_TRACES_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE run_traces (\n"
        "\trun_id VARCHAR NOT NULL, \n"
        "\tcontext VARCHAR NOT NULL, \n"
        "\tPRIMARY KEY (run_id)\n"
        ")"
    ),
)
"""Table ``run_traces`` and its indexes (RunTraceRow)."""

RUN_ATTEMPTS_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE run_attempts (\n"
        "\trun_id VARCHAR NOT NULL, \n"
        "\tattempt INTEGER NOT NULL, \n"
        "\tstarted_at FLOAT NOT NULL, \n"
        "\tended_at FLOAT, \n"
        "\toutcome VARCHAR NOT NULL, \n"
        "\terror VARCHAR, \n"
        "\tnode_id VARCHAR, \n"
        "\tPRIMARY KEY (run_id, attempt)\n"
        ")\n"
        " WITHOUT ROWID"
    ),
)
"""Table ``run_attempts`` and its indexes (RunAttemptRow)."""

SCHEDULES_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE schedules (\n"
        "\tseq INTEGER NOT NULL, \n"
        "\tid VARCHAR NOT NULL, \n"
        "\tname VARCHAR NOT NULL, \n"
        "\targs VARCHAR, \n"
        "\tcron VARCHAR, \n"
        "\ttimezone VARCHAR, \n"
        "\tevery_seconds FLOAT, \n"
        "\tstate VARCHAR NOT NULL, \n"
        "\tnext_fire_at FLOAT, \n"
        "\tcreated_at FLOAT NOT NULL, \n"
        "\t\"key\" VARCHAR, \n"
        "\toccurrences INTEGER NOT NULL, \n"
        "\tskipped INTEGER NOT NULL, \n"
        "\tlast_run_id VARCHAR, \n"
        "\tlast_fire_at FLOAT, \n"
        "\tPRIMARY KEY (seq), \n"
        "\tUNIQUE (id)\n"
        ")"
    ),
    "CREATE INDEX ix_schedules_due ON schedules (state, next_fire_at)",
    "CREATE UNIQUE INDEX ix_schedules_key ON schedules (\"key\")",
)
"""Table ``schedules`` and its indexes (ScheduleRow)."""

THREADS_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE threads (\n"
        "\tid VARCHAR NOT NULL, \n"
        "\tcreated_at FLOAT NOT NULL, \n"
        "\tagent_id VARCHAR, \n"
        "\tuser_id VARCHAR, \n"
        "\ttags VARCHAR NOT NULL, \n"
        "\tlast_activity_at FLOAT, \n"
        "\tPRIMARY KEY (id)\n"
        ")"
    ),
    "CREATE INDEX ix_threads_activity ON threads (last_activity_at, id)",
    "CREATE INDEX ix_threads_created ON threads (created_at, id)",
)
"""Table ``threads`` and its indexes (ThreadRow)."""

ALARMS_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE alarms (\n"
        "\tthread_id VARCHAR NOT NULL, \n"
        "\tdue_at FLOAT NOT NULL, \n"
        "\tPRIMARY KEY (thread_id)\n"
        ")"
    ),
)
"""Table ``alarms`` and its indexes (AlarmRow)."""

PAUSED_THREADS_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE paused_threads (\n"
        "\tthread_id VARCHAR NOT NULL, \n"
        "\tPRIMARY KEY (thread_id)\n"
        ")"
    ),
)
"""Table ``paused_threads`` and its indexes (PausedThreadRow)."""

RUN_INDEX_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE run_index (\n"
        "\trun_id VARCHAR NOT NULL, \n"
        "\tthread_id VARCHAR NOT NULL, \n"
        "\tuser_id VARCHAR, \n"
        "\tname VARCHAR NOT NULL, \n"
        "\tstatus VARCHAR NOT NULL, \n"
        "\trun_at FLOAT NOT NULL, \n"
        "\tcreated_at FLOAT NOT NULL, \n"
        "\tstarted_at FLOAT, \n"
        "\tfinished_at FLOAT, \n"
        "\tattempts INTEGER NOT NULL, \n"
        "\terror VARCHAR, \n"
        "\treplay_of VARCHAR, \n"
        "\t\"key\" VARCHAR, \n"
        "\tcanceled_by VARCHAR, \n"
        "\tschedule_id VARCHAR, \n"
        "\tPRIMARY KEY (run_id)\n"
        ")"
    ),
    "CREATE INDEX ix_run_index_created ON run_index (created_at, run_id)",
    "CREATE INDEX ix_run_index_due ON run_index (run_at)",
    "CREATE INDEX ix_run_index_finished ON run_index (status, finished_at)",
    "CREATE INDEX ix_run_index_name ON run_index (name, created_at, run_id)",
    "CREATE INDEX ix_run_index_status ON run_index (status, created_at, run_id)",
    "CREATE INDEX ix_run_index_thread ON run_index (thread_id, created_at, run_id)",
    "CREATE INDEX ix_run_index_user ON run_index (user_id, created_at, run_id)",
)
"""Table ``run_index`` and its indexes (RunIndexRow)."""

RUNTIME_META_DDL: tuple[str, ...] = (
    (
        "CREATE TABLE runtime_meta (\n"
        "\t\"key\" VARCHAR NOT NULL, \n"
        "\tvalue VARCHAR NOT NULL, \n"
        "\tPRIMARY KEY (\"key\")\n"
        ")"
    ),
)
"""Table ``runtime_meta`` and its indexes (RuntimeMetaRow)."""

THREAD_DDL: tuple[str, ...] = (
    *THREAD_META_DDL,
    *EFFECT_RUNS_DDL,
    *MESSAGES_DDL,
    *EFFECT_RECORDS_DDL,
    *RUN_TRACES_DDL,
    *RUN_ATTEMPTS_DDL,
    *SCHEDULES_DDL,
)
"""A new thread file's whole schema at the current version (the tables of the thread models
and their indexes), created in one step instead of replaying the migrations."""

THREAD_MIGRATIONS: dict[int, tuple[str, ...]] = {
    0: (
        (
            "CREATE TABLE thread_meta (\n"
            "\t\"key\" VARCHAR NOT NULL, \n"
            "\tvalue VARCHAR NOT NULL, \n"
            "\tPRIMARY KEY (\"key\")\n"
            ")"
        ),
        (
            "CREATE TABLE effect_runs (\n"
            "\tseq INTEGER NOT NULL, \n"
            "\tid VARCHAR NOT NULL, \n"
            "\tname VARCHAR NOT NULL, \n"
            "\tstatus VARCHAR NOT NULL, \n"
            "\targs VARCHAR, \n"
            "\trun_at FLOAT NOT NULL, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\tstarted_at FLOAT, \n"
            "\tfinished_at FLOAT, \n"
            "\tattempts INTEGER NOT NULL, \n"
            "\terror VARCHAR, \n"
            "\treplay_of VARCHAR, \n"
            "\tPRIMARY KEY (seq), \n"
            "\tUNIQUE (id)\n"
            ")"
        ),
        "CREATE INDEX ix_effect_runs_due ON effect_runs (status, run_at, seq) WHERE status = 'pending' OR status = 'running'",
        "CREATE INDEX ix_effect_runs_finished ON effect_runs (status, finished_at) WHERE finished_at IS NOT NULL",
        "CREATE INDEX ix_effect_runs_name ON effect_runs (name, seq)",
    ),
    1: (
        (
            "CREATE TABLE messages (\n"
            "\tseq INTEGER NOT NULL, \n"
            "\tid VARCHAR NOT NULL, \n"
            "\trole VARCHAR NOT NULL, \n"
            "\tcontent VARCHAR NOT NULL, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\trun_id VARCHAR, \n"
            "\tmeta VARCHAR NOT NULL, \n"
            "\tdata VARCHAR NOT NULL, \n"
            "\tPRIMARY KEY (seq), \n"
            "\tUNIQUE (id)\n"
            ")"
        ),
        "CREATE INDEX ix_messages_run ON messages (run_id, seq)",
    ),
    2: (
        (
            "CREATE TABLE effect_records (\n"
            "\tthread_id VARCHAR NOT NULL, \n"
            "\t\"key\" VARCHAR NOT NULL, \n"
            "\ttool_name VARCHAR NOT NULL, \n"
            "\trun_id VARCHAR, \n"
            "\tstatus VARCHAR NOT NULL, \n"
            "\tresult VARCHAR, \n"
            "\towner VARCHAR, \n"
            "\tlease_expires_at FLOAT, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\tupdated_at FLOAT NOT NULL, \n"
            "\tPRIMARY KEY (thread_id, \"key\")\n"
            ")"
        ),
        "CREATE INDEX ix_effect_records_created ON effect_records (thread_id, created_at, \"key\")",
        "CREATE INDEX ix_effect_records_updated ON effect_records (updated_at)",
    ),
    3: (
        "ALTER TABLE effect_runs ADD COLUMN \"key\" VARCHAR",
        "ALTER TABLE effect_runs ADD COLUMN canceled_by VARCHAR",
        "CREATE UNIQUE INDEX ix_effect_runs_pending_key ON effect_runs (\"key\") WHERE status = 'pending' AND \"key\" IS NOT NULL",
    ),
    4: (
        (
            "CREATE TABLE run_traces (\n"
            "\trun_id VARCHAR NOT NULL, \n"
            "\tcontext VARCHAR NOT NULL, \n"
            "\tPRIMARY KEY (run_id)\n"
            ")"
        ),
    ),
    5: (
        (
            "CREATE TABLE run_attempts (\n"
            "\trun_id VARCHAR NOT NULL, \n"
            "\tattempt INTEGER NOT NULL, \n"
            "\tstarted_at FLOAT NOT NULL, \n"
            "\tended_at FLOAT, \n"
            "\toutcome VARCHAR NOT NULL, \n"
            "\terror VARCHAR, \n"
            "\tPRIMARY KEY (run_id, attempt)\n"
            ")"
        ),
    ),
    6: (
        (
            "CREATE TABLE schedules (\n"
            "\tseq INTEGER NOT NULL, \n"
            "\tid VARCHAR NOT NULL, \n"
            "\tname VARCHAR NOT NULL, \n"
            "\targs VARCHAR, \n"
            "\tcron VARCHAR, \n"
            "\ttimezone VARCHAR, \n"
            "\tevery_seconds FLOAT, \n"
            "\tstate VARCHAR NOT NULL, \n"
            "\tnext_fire_at FLOAT, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\t\"key\" VARCHAR, \n"
            "\toccurrences INTEGER NOT NULL, \n"
            "\tskipped INTEGER NOT NULL, \n"
            "\tlast_run_id VARCHAR, \n"
            "\tlast_fire_at FLOAT, \n"
            "\tPRIMARY KEY (seq), \n"
            "\tUNIQUE (id)\n"
            ")"
        ),
        "CREATE INDEX ix_schedules_due ON schedules (state, next_fire_at)",
        "CREATE UNIQUE INDEX ix_schedules_key ON schedules (\"key\")",
        "ALTER TABLE effect_runs ADD COLUMN schedule_id VARCHAR",
    ),
    7: (
        "ALTER TABLE run_attempts ADD COLUMN node_id VARCHAR",
    ),
    8: (
        (
            "CREATE TABLE run_attempts__new (\n"
            "\trun_id VARCHAR NOT NULL, \n"
            "\tattempt INTEGER NOT NULL, \n"
            "\tstarted_at FLOAT NOT NULL, \n"
            "\tended_at FLOAT, \n"
            "\toutcome VARCHAR NOT NULL, \n"
            "\terror VARCHAR, \n"
            "\tnode_id VARCHAR, \n"
            "\tPRIMARY KEY (run_id, attempt)\n"
            ")\n"
            " WITHOUT ROWID"
        ),
        "INSERT INTO run_attempts__new (run_id, attempt, started_at, ended_at, outcome, error, node_id) SELECT run_id, attempt, started_at, ended_at, outcome, error, node_id FROM run_attempts",
        "DROP TABLE run_attempts",
        "ALTER TABLE run_attempts__new RENAME TO run_attempts",
        "DROP INDEX IF EXISTS ix_effect_runs_pending_key",
        "CREATE UNIQUE INDEX ix_effect_runs_pending_key ON effect_runs (\"key\") WHERE status = 'pending' AND \"key\" IS NOT NULL",
    ),
    9: (
        "DROP INDEX IF EXISTS ix_effect_runs_due",
        "CREATE INDEX ix_effect_runs_due ON effect_runs (status, run_at, seq) WHERE status = 'pending' OR status = 'running'",
        "DROP INDEX IF EXISTS ix_effect_runs_finished",
        "CREATE INDEX ix_effect_runs_finished ON effect_runs (status, finished_at) WHERE finished_at IS NOT NULL",
    ),
}
"""Thread file: the statements that take schema version N to N + 1."""

RUNTIME_MIGRATIONS: dict[int, tuple[str, ...]] = {
    0: (
        (
            "CREATE TABLE threads (\n"
            "\tid VARCHAR NOT NULL, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\tagent_id VARCHAR, \n"
            "\tuser_id VARCHAR, \n"
            "\ttags VARCHAR NOT NULL, \n"
            "\tPRIMARY KEY (id)\n"
            ")"
        ),
        "CREATE INDEX ix_threads_created ON threads (created_at, id)",
        (
            "CREATE TABLE alarms (\n"
            "\tthread_id VARCHAR NOT NULL, \n"
            "\tdue_at FLOAT NOT NULL, \n"
            "\tPRIMARY KEY (thread_id)\n"
            ")"
        ),
    ),
    1: (
        (
            "CREATE TABLE paused_threads (\n"
            "\tthread_id VARCHAR NOT NULL, \n"
            "\tPRIMARY KEY (thread_id)\n"
            ")"
        ),
    ),
    2: (
        (
            "CREATE TABLE effect_records (\n"
            "\tthread_id VARCHAR NOT NULL, \n"
            "\t\"key\" VARCHAR NOT NULL, \n"
            "\ttool_name VARCHAR NOT NULL, \n"
            "\trun_id VARCHAR, \n"
            "\tstatus VARCHAR NOT NULL, \n"
            "\tresult VARCHAR, \n"
            "\towner VARCHAR, \n"
            "\tlease_expires_at FLOAT, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\tupdated_at FLOAT NOT NULL, \n"
            "\tPRIMARY KEY (thread_id, \"key\")\n"
            ")"
        ),
        "CREATE INDEX ix_effect_records_created ON effect_records (thread_id, created_at, \"key\")",
        "CREATE INDEX ix_effect_records_updated ON effect_records (updated_at)",
    ),
    3: (
        (
            "CREATE TABLE run_index (\n"
            "\trun_id VARCHAR NOT NULL, \n"
            "\tthread_id VARCHAR NOT NULL, \n"
            "\tuser_id VARCHAR, \n"
            "\tname VARCHAR NOT NULL, \n"
            "\tstatus VARCHAR NOT NULL, \n"
            "\trun_at FLOAT NOT NULL, \n"
            "\tcreated_at FLOAT NOT NULL, \n"
            "\tstarted_at FLOAT, \n"
            "\tfinished_at FLOAT, \n"
            "\tattempts INTEGER NOT NULL, \n"
            "\terror VARCHAR, \n"
            "\treplay_of VARCHAR, \n"
            "\t\"key\" VARCHAR, \n"
            "\tcanceled_by VARCHAR, \n"
            "\tPRIMARY KEY (run_id)\n"
            ")"
        ),
        "CREATE INDEX ix_run_index_created ON run_index (created_at, run_id)",
        "CREATE INDEX ix_run_index_due ON run_index (run_at)",
        "CREATE INDEX ix_run_index_finished ON run_index (status, finished_at)",
        "CREATE INDEX ix_run_index_name ON run_index (name, created_at, run_id)",
        "CREATE INDEX ix_run_index_status ON run_index (status, created_at, run_id)",
        "CREATE INDEX ix_run_index_thread ON run_index (thread_id, created_at, run_id)",
        "CREATE INDEX ix_run_index_user ON run_index (user_id, created_at, run_id)",
        (
            "CREATE TABLE runtime_meta (\n"
            "\t\"key\" VARCHAR NOT NULL, \n"
            "\tvalue VARCHAR NOT NULL, \n"
            "\tPRIMARY KEY (\"key\")\n"
            ")"
        ),
    ),
    4: (
        "ALTER TABLE threads ADD COLUMN last_activity_at FLOAT",
        "CREATE INDEX ix_threads_activity ON threads (last_activity_at, id)",
    ),
    5: (
        "ALTER TABLE run_index ADD COLUMN schedule_id VARCHAR",
    ),
}
"""``runtime.sqlite``: the statements that take schema version N to N + 1."""
