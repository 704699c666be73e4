"""A sync effect (a worker thread) that runs until the test sets ``GATES[key]``."""

import threading

from pydantic import BaseModel

from runtime import ThreadState, define_effect

GATES: dict[str, threading.Event] = {}
_LOCK = threading.Lock()


class HoldSync(BaseModel):
    key: str


def gate(key: str) -> threading.Event:
    with _LOCK:
        return GATES.setdefault(key, threading.Event())


def hold_sync(state: ThreadState, args: HoldSync) -> None:
    gate(args.key).wait(timeout=60)


effect = define_effect("Blocks a worker thread until released by the test.", HoldSync, hold_sync)
