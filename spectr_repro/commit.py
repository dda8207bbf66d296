"""The commit of the code that runs: what every record names as its source (``environment.environment``).

Read once per process and kept (``functools.cache``), at the start of a command (``spectr_repro.__main__``): a
long run whose checkout moves on (a worktree checked out to a newer commit between budgeted rounds) must not name
the newer commit on the records it finishes later. No torch here: the entry point imports it before any command.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache
def git_commit(short: bool = False) -> str:
    """The commit of the checkout the package runs from, "+dirty" when tracked files changed;
    "unknown" outside a git checkout (an installed wheel)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", *(["--short"] if short else []), "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + ("+dirty" if dirty else "")) if commit else "unknown"


__all__ = ["git_commit"]
