"""``python -m spectr_repro check``: does the harness work on this machine, and what will a run cost here?

The command is :mod:`~spectr_repro.check.cli`; one run :mod:`~spectr_repro.check.run`; its items
:mod:`~spectr_repro.check.environment`, :mod:`~spectr_repro.check.correctness` and :mod:`~spectr_repro.check.costs`
(the calibration of ``plan``, kept by :mod:`spectr_repro.cost`); architectures without weights
:mod:`~spectr_repro.check.architectures`.
"""

from spectr_repro.check.checker import Checker, Item
from spectr_repro.check.cli import main
from spectr_repro.check.costs import TIMING_TOLERANCE
from spectr_repro.check.run import run_check, run_shapes

__all__ = ["Checker", "Item", "TIMING_TOLERANCE", "main", "run_check", "run_shapes"]
