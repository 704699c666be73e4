"""Run the thread-effects server: the HTTP API, the effect_changed stream and the Effects pane.

    python server.py [--app-dir agents] [--data-dir data] [--host 127.0.0.1] [--port 8000]

The same as ``thread-effects serve``: both run `runtime.serve.main` (options, environment
variables and exit statuses are documented there and in README.md).
"""

from __future__ import annotations

import sys

from runtime.serve import demo_webhook_route, is_loopback, main, parse_args

__all__ = ["demo_webhook_route", "is_loopback", "main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
