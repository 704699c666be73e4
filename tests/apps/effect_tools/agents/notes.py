"""An agent with two effect tools: ``post_note`` (a custom key) and ``count_up`` (streams)."""

from runtime import define_agent

agent = define_agent("notes", "Post the notes the user asks for.",
                     tools=["post_note", "count_up"], hooks=["count_calls"])
