"""Argument types shared by the benchmarks: a bad size is a usage error, not a table of nonsense.

Each raises `argparse.ArgumentTypeError`, so argparse prints ``usage: ...`` and the option's
name with the message, and exits with status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    """An integer ≥ 1 (a count of runs, threads, clients, repeats)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer ≥ 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a rate, a scale)."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number ≥ 0 (seconds)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def source_tree(text: str) -> Path:
    """A checkout of thread-effects: a folder holding ``runtime/__init__.py``."""
    path = Path(text).expanduser()
    if not (path / "runtime" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{text} is not a thread-effects checkout (no runtime/__init__.py in it)"
        )
    return path


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value
