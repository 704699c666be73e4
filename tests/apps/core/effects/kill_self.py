"""Kills its own process on every attempt (SIGKILL: no cleanup, like a crash)."""

import os
import signal

from runtime import ThreadState, define_effect


def kill_self(state: ThreadState) -> None:
    with open(state.runtime.settings.data_dir / "kill_self.attempts", "a") as f:
        f.write("x\n")
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


effect = define_effect("Kills its own process.", kill_self)
