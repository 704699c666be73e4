"""The test agent: every test tool, and the hooks the turn and hook tests watch."""

from runtime import define_agent

agent = define_agent(
    "helper",
    "You help with tests.",
    tools=["schedule_note", "explode", "echo"],
    hooks=[
        "raise_before",
        "redact",
        "raise_after",
        "watch_messages",
        "watch_history",
        "watch_failures",
        "decorate_echo",
    ],
    default=True,
)
