"""A tool that always raises."""

from runtime import ThreadState, define_tool


async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


tool = define_tool("Always fails.", explode)
