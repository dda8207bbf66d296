"""The ``plan`` command: the cost of a sweep's cells, of its experiments' replays and of the calibration their
predicted speed-ups need (:mod:`~spectr_repro.plan.cli`, :mod:`~spectr_repro.plan.calibration`)."""

from spectr_repro.plan.cli import PlanParts, main, plan_parts, plan_text

__all__ = ["PlanParts", "main", "plan_parts", "plan_text"]
