"""The demo agent: a reminder assistant that also posts notes (an effect tool).

Its model is the runtime's ``model`` setting (``THREAD_EFFECTS_MODEL``, e.g.
``openai:gpt-4o-mini``); without one, the offline demo model of ``runtime.testing``, which
understands "remind me in 10 seconds to stretch" and "post a note about release: shipped".
"""

from runtime import define_agent

agent = define_agent(
    "assistant",
    (
        "You are a concise assistant in a chat thread. When the user asks to be reminded "
        "of something after some time, call set_reminder with what to remind them of and "
        "the delay in seconds, then confirm in one sentence. The reminder itself arrives "
        "later as a message in this thread. When the user asks to post a note about a "
        "topic, call post_note with the topic and the note's text, then confirm."
    ),
    tools=["set_reminder", "post_note"],
    hooks=["welcome"],
    description="Sets reminders that arrive later in the thread and posts notes.",
)
