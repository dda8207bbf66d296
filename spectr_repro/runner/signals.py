"""Stops by signal for every long command (sweep, replay, bias): SIGTERM unwinds like Ctrl-C.

SLURM's end of job and `kill` send SIGTERM, whose default action ends the process at once: claims stay behind
and nothing says what was kept. Inside :func:`stop_on_signals` SIGTERM raises :class:`Terminated` (a
BaseException, like KeyboardInterrupt) so that ``finally`` blocks release claims and the command can print
what is kept and how to resume; :func:`stop_name` and :func:`stop_status` give its words and exit status, and
:class:`RunProgress` (what a run has done so far) the message.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


@dataclass
class RunProgress:
    """What a long command (replay, bias) has done so far, and the message a stop by signal prints from it; each
    command's ``Progress`` adds its own fields and words."""

    computed: int = 0  # finished and written by this run
    earlier: int = 0  # finished before this run (or by another runner)
    current: Any = None  # what was being computed (None: nothing)

    def stop_report(self, stop: BaseException, folders: Sequence[Path], noun: str, doing: str, resume: str) -> str:
        """``stopped by SIGTERM: kept 2 prompt(s) replayed in this run and 1 finished before, in <folders>; <what
        was dropped>; <resume>`` (``noun``: prompt, context; ``doing``: replayed, measured)."""
        return (f"stopped by {stop_name(stop)}: kept {self.computed} {noun}(s) {doing} in this run and "
                f"{self.earlier} finished before, in {', '.join(map(str, folders))}; {self.dropped(noun, doing)}; "
                f"{resume}")

    def dropped(self, noun: str, doing: str) -> str:
        """What the stop dropped (a command that computes several at once says so in its own words)."""
        if self.current is None:
            return f"no {noun} was being {doing}"
        return f"the {noun} being {doing} ({self.current}) was dropped and starts over"


__all__ = ["RunProgress", "Terminated", "stop_name", "stop_on_signals", "stop_status"]
