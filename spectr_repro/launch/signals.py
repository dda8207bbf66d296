"""Stops by signal for every long command (sweep, replay, bias): SIGTERM unwinds like Ctrl-C; and stops by budget.

SLURM's end of job and `kill` send SIGTERM, whose default action ends the process at once: claims stay behind
and nothing says what was kept. Inside :func:`stop_on_signals` SIGTERM raises :class:`Terminated` (a
BaseException, like KeyboardInterrupt) so that ``finally`` blocks release claims and the command can print
what is kept and how to resume; :func:`stop_name` and :func:`stop_status` give its words and exit status, and
:class:`RunProgress` (what a run has done so far) the message.

A run with a budget (``replay.budget_minutes``, ``bias.budget_minutes``: :class:`Budget`) stops itself at a unit
boundary (a prompt, a batch of prompts, a context) once the next unit would not fit, keeps what it finished and
exits 0 with the command that continues it.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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


@dataclass
class Budget:
    """A run's time budget: before it starts the next unit (a prompt, a batch, a context), :meth:`spent` says whether
    the time since the run started plus that unit's estimate (the longest unit this run has done) would exceed it.
    Before the first unit nothing is known, so a run always does at least one. ``minutes`` None: no budget."""

    minutes: float | None = None
    started: float = field(default_factory=time.monotonic)
    longest_s: float | None = None  # the longest unit (batch) of this run so far
    stopped: bool = False  # the run stopped itself because of the budget

    def record(self, seconds: float) -> None:
        self.longest_s = seconds if self.longest_s is None else max(self.longest_s, seconds)

    @contextlib.contextmanager
    def unit(self) -> Iterator[None]:
        """Times one unit (recorded only when it finishes: a unit that raised is not a duration)."""
        start = time.monotonic()
        yield
        self.record(time.monotonic() - start)

    def spent(self) -> bool:
        """True (and :attr:`stopped` set) when the next unit would end past the budget."""
        if self.minutes is None or self.longest_s is None:
            return False
        self.stopped = time.monotonic() - self.started + self.longest_s > 60 * self.minutes
        return self.stopped

    def message(self, kept: int, before: int, left: int, noun: str, command: str, argv: Sequence[str]) -> str:
        """``budget of 5 min reached: kept 3 prompt(s) this run, 2 finished before, 11 left; continue with: python
        -m spectr_repro replay ...`` (the same command line)."""
        return (f"budget of {self.minutes:g} min reached: kept {kept} {noun}(s) this run, {before} finished before, "
                f"{left} left; continue with: python -m spectr_repro {command} {shlex.join(argv)}".rstrip())


__all__ = ["Budget", "RunProgress", "Terminated", "stop_name", "stop_on_signals", "stop_status"]
