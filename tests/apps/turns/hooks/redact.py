"""before_create_message: replaces "hunter2" with "[redacted]" in plain text messages."""

import dataclasses

from runtime import Message, ThreadState, define_hook


def redact(state: ThreadState, message: Message) -> Message | None:
    if "hunter2" not in message.content:
        return None
    return dataclasses.replace(message, content=message.content.replace("hunter2", "[redacted]"))


hook = define_hook("before_create_message", "redact", redact)
