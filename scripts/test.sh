#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs lint, types and tests.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"

# Browser tests drive Debian's chromium (Playwright's own browser download cannot work here).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
fi

.venv/bin/ruff check runtime tests bench server.py agents
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
