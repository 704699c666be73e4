"""One JSON line per event of an execution in ``$MULTINODE_LOG``, the file all nodes share.

Each line is written with one ``write`` on a file opened for appending, so the lines of
concurrent processes do not mix; ``node`` is ``$MULTINODE_NODE`` (the name the test gave
the process). Shared by the effects of the multinode test apps (``multinode``,
``multinode_concurrent``), which import it as ``tests.apps._multinode_log``: their server
processes run ``server.py`` from the repository's root, so ``tests`` is importable there.
"""

import json
import os
import time
from typing import Any

from runtime import ThreadState


def note(state: ThreadState, event: str, **fields: Any) -> None:
    """Append ``fields`` with the thread, the event, the node and the time (epoch seconds)."""
    line = json.dumps({**fields, "thread": state.thread_id, "event": event,
                       "node": os.environ["MULTINODE_NODE"], "at": time.time()})
    fd = os.open(os.environ["MULTINODE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
