"""Stops by signal for every long command (sweep, replay, bias): SIGTERM unwinds like Ctrl-C.

SLURM's end of job and `kill` send SIGTERM, whose default action ends the process at once: claims stay behind
and nothing says what was kept. Inside :func:`stop_on_signals` SIGTERM raises :class:`Terminated` (a
BaseException, like KeyboardInterrupt) so that ``finally`` blocks release claims and the command can print
what is kept and how to resume; :func:`stop_name` and :func:`stop_status` give its words and exit status.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(BaseException):
    """SIGTERM (e.g. SLURM's end of job, `kill`): unwinds like Ctrl-C so claims are released."""


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (main thread only: handlers can be set nowhere else)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_name(stop: BaseException) -> str:
    return "SIGTERM" if isinstance(stop, Terminated) else "SIGINT (Ctrl-C)"


def stop_status(stop: BaseException) -> int:
    """The shell's status for a process ended by the signal: 128 + its number."""
    return 143 if isinstance(stop, Terminated) else 130


__all__ = ["Terminated", "stop_name", "stop_on_signals", "stop_status"]
