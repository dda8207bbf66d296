"""The ``plan`` command: the cost of a sweep's cells and of its experiments' replays (:mod:`~spectr_repro.plan.cli`)."""

from spectr_repro.plan.cli import main, plan_text

__all__ = ["main", "plan_text"]
