"""The benchmark's no-op effect: it only records how late it started.

``LAGS`` gets ``time.time() - args.due`` for every run, where ``due`` is the instant the
benchmark asked the run to be due at. The runtime sets the stored due time a little
*after* that instant (it reads its clock once it holds the thread's lock), so this lag
errs on the high side.
"""

import time

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class NoopArgs(BaseModel):
    due: float
    """Epoch seconds the run was scheduled to be due at."""


LAGS: list[float] = []
"""Seconds from due to start, one per run, in start order (read by bench_effects.py)."""

STARTS: list[float] = []
"""Epoch seconds each run started at, in start order (read by bench_postgres.py)."""


async def noop(state: ThreadState, args: NoopArgs) -> None:
    now = time.time()
    LAGS.append(now - args.due)
    STARTS.append(now)


effect = define_effect("Does nothing; records its lag from due to start.", NoopArgs, noop)
