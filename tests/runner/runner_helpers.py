"""Helpers of the runner tests that start the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    """``python -m spectr_repro <args>`` as a user types it, from the repository root (not waited for)."""
    return subprocess.Popen([sys.executable, "-m", "spectr_repro", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def cells_computed(stdout: str) -> int:
    """The number in the closing line "<n> cell(s) run, ..." of a sweep."""
    for line in stdout.splitlines():
        if " cell(s) run, " in line:
            return int(line.split(" cell(s) run, ")[0].split()[-1])
    raise AssertionError(f"no closing line in:\n{stdout[-2000:]}")


def line_starting(text: str, start: str) -> str:
    """The first line of ``text`` that starts (after indentation) with ``start``: a plan table's row."""
    return next(line for line in text.splitlines() if line.lstrip().startswith(start))
