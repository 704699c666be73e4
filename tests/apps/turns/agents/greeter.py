"""An agent whose threads get a note scheduled when they are created."""

from runtime import define_agent

agent = define_agent("greeter", "You greet.", hooks=["greet_effect"])
