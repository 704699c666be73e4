"""The SQLite schema: DDL generated from the models in `runtime.storage.models`.

Generated; do not edit. After changing a model or a migration step there, regenerate with
``.venv/bin/python -m runtime.storage.models`` (tests/test_schema.py fails while this file
differs from what the models generate). The SQLite backend (`runtime.storage.sqlite`) runs
these statements with plain ``sqlite3``, so SQLModel and SQLAlchemy are not imported at run
time.
"""

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
        "\tPRIMARY KEY (seq), \n"
        "\tUNIQUE (id)\n"
        ")"
    ),
    "CREATE INDEX ix_effect_runs_due ON effect_runs (status, run_at, seq)",
    "CREATE INDEX ix_effect_runs_finished ON effect_runs (status, finished_at)",
    "CREATE INDEX ix_effect_runs_name ON effect_runs (name, seq)",
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
        "\tPRIMARY KEY (run_id, attempt)\n"
        ")"
    ),
)
"""Table ``run_attempts`` and its indexes (RunAttemptRow)."""

THREADS_DDL: tuple[str, ...] = (
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

THREAD_MIGRATIONS: dict[int, tuple[str, ...]] = {
    0: (*THREAD_META_DDL, *EFFECT_RUNS_DDL),
    1: (*MESSAGES_DDL,),
    2: (*RUN_TRACES_DDL,),
    3: (*RUN_ATTEMPTS_DDL,),
}
"""Thread file: the statements that take schema version N to N + 1."""

RUNTIME_MIGRATIONS: dict[int, tuple[str, ...]] = {
    0: (*THREADS_DDL, *ALARMS_DDL),
    1: (*RUN_INDEX_DDL, *RUNTIME_META_DDL),
}
"""``runtime.sqlite``: the statements that take schema version N to N + 1."""
