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

# The PostgreSQL backend's tests use the local server on 127.0.0.1:5432 (each test session
# creates a database of its own and drops it); start it when it is not answering.
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    # The first cluster on port 5432 (pg_lsclusters: version, name, port, ...).
    read -r pg_version pg_cluster < <(pg_lsclusters -h | awk '$3 == 5432 {print $1, $2; exit}')
    as_root pg_ctlcluster "$pg_version" "$pg_cluster" start
    for _ in $(seq 50); do
        pg_isready -q -h 127.0.0.1 -p 5432 && break
        sleep 0.2
    done
    pg_isready -h 127.0.0.1 -p 5432
fi

.venv/bin/ruff check runtime tests bench server.py agents
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
