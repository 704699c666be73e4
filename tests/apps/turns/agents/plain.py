"""A second agent without hooks: hooks of other agents never run for its threads."""

from runtime import define_agent

agent = define_agent("plain", "You are plain.", tools=["echo"])
