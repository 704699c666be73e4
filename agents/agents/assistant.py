"""The demo agent: a reminder assistant.

Its model is the runtime's ``model`` setting (``THREAD_EFFECTS_MODEL``, e.g.
``openai:gpt-4o-mini``); without one, the offline demo model of ``runtime.testing``, which
understands "remind me in 10 seconds to stretch".
"""

from runtime import define_agent

agent = define_agent(
    "assistant",
    (
        "You are a concise assistant in a chat thread. When the user asks to be reminded "
        "of something after some time, call set_reminder with what to remind them of and "
        "the delay in seconds, then confirm in one sentence. The reminder itself arrives "
        "later as a message in this thread."
    ),
    tools=["set_reminder"],
    hooks=["welcome"],
    description="Sets reminders that arrive later in the thread.",
)
