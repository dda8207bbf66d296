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
from collections.abc import Hashable, Iterator, Sequence
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
    the time since the run started plus that unit's estimate would exceed it. ``minutes`` None: no budget.

    Units come in kinds (the replay's: one per group folder, since a T = 0.7 batch takes several times a T = 0.1
    one; one kind, None, where they cost alike). A unit's estimate is the longest unit of its kind this run;
    for a kind not timed yet, what :meth:`expect` said a unit of it took before (e.g. the folder's recorded
    batches on this machine), scaled by how much slower this run's units are than their own expectations;
    with neither, the longest unit of any kind. Before the first unit nothing is known, so a run always does
    at least one."""

    minutes: float | None = None
    started: float = field(default_factory=time.monotonic)
    longest_s: dict[Hashable, float] = field(default_factory=dict)  # kind -> the longest unit this run
    expected_s: dict[Hashable, float] = field(default_factory=dict)  # kind -> a unit's seconds recorded before
    stopped: bool = False  # the run stopped itself because of the budget

    def expect(self, seconds: float | None, kind: Hashable = None) -> None:
        """What a unit of ``kind`` took before this run (None or <= 0: nothing known)."""
        if seconds is not None and seconds > 0:
            self.expected_s[kind] = seconds

    def record(self, seconds: float, kind: Hashable = None) -> None:
        self.longest_s[kind] = max(self.longest_s.get(kind, seconds), seconds)

    @contextlib.contextmanager
    def unit(self, kind: Hashable = None) -> Iterator[None]:
        """Times one unit (recorded only when it finishes: a unit that raised is not a duration)."""
        start = time.monotonic()
        yield
        self.record(time.monotonic() - start, kind)

    def estimate(self, kind: Hashable = None) -> float | None:
        """Seconds the next unit of ``kind`` is expected to take (None: nothing timed this run yet)."""
        if not self.longest_s:
            return None
        if kind in self.longest_s:
            return self.longest_s[kind]
        if kind in self.expected_s:
            slower = [seconds / self.expected_s[seen] for seen, seconds in self.longest_s.items()
                      if seen in self.expected_s]
            return self.expected_s[kind] * max(slower, default=1.0)
        return max(self.longest_s.values())

    def spent(self, kind: Hashable = None) -> bool:
        """True (and :attr:`stopped` set) when the next unit of ``kind`` would end past the budget."""
        estimate = self.estimate(kind)
        if self.minutes is None or estimate is None:
            return False
        self.stopped = time.monotonic() - self.started + estimate > 60 * self.minutes
        return self.stopped

    def message(self, kept: int, before: int, left: int, noun: str, command: str, argv: Sequence[str]) -> str:
        """``budget of 5 min reached: kept 3 prompt(s) this run, 2 finished before, 11 left; continue with: python
        -m spectr_repro replay ...`` (the same command line)."""
        return (f"budget of {self.minutes:g} min reached: kept {kept} {noun}(s) this run, {before} finished before, "
                f"{left} left; continue with: python -m spectr_repro {command} {shlex.join(argv)}".rstrip())


__all__ = ["Budget", "RunProgress", "Terminated", "stop_name", "stop_on_signals", "stop_status"]
