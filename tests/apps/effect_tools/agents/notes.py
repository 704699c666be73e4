"""An agent whose one tool is the effect tool ``post_note``."""

from runtime import define_agent

agent = define_agent("notes", "Post the notes the user asks for.", tools=["post_note"],
                     hooks=["count_calls"])
