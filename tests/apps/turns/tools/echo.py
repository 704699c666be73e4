"""A sync tool: returns its text."""

from pydantic import BaseModel

from runtime import ThreadState, define_tool


class Args(BaseModel):
    text: str


def echo(state: ThreadState, args: Args) -> str:
    return args.text


tool = define_tool("Echoes the text.", Args, echo)
