"""``python -m spectr_repro plan ...`` (or ``sweep ... --plan``): what a sweep, its replays and their
calibration would cost.

    python -m spectr_repro plan experiment=paper_main            # cells, downloads, time; loads nothing
    python -m spectr_repro plan experiment=cpu_quick,replay_qwen # several experiments, their replays too

Three parts, printed apart, then their total: the shared-block replays (``spectr_repro.replay.plan``: every
block efficiency, the tokens per call of every predicted speed-up), the calibration each replay's predictions
need (``spectr_repro.plan.calibration``: ``check`` with the real weights, the seconds per call), and the timed
cells (``spectr_repro.runner.plan``: the checks of the prediction). This command composes them, so that
neither the runner nor the replay imports the other (the replay is built on the runner). Bad input: one
message on stderr, exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from spectr_repro.errors import UsageError
from spectr_repro.launch.config import Composer, expand, parse_arguments
from spectr_repro.launch.fit import check_batch_fits
from spectr_repro.logs import format_duration
from spectr_repro.plan.calibration import CalibrationPlan, check_command, format_calibration, plan_calibration
from spectr_repro.replay.plan import ReplayPlan, plan_replays, replay_lines, replay_only
from spectr_repro.runner.cli import _take_cfg_flag, help_text
from spectr_repro.runner.execute import plan_cells
from spectr_repro.runner.plan import Plan, build_plan, format_plan
from spectr_repro.settings import run_config


def main(argv: Sequence[str] | None = None) -> int:
    """What ``sweep`` would do with the same arguments (``experiment=a,b`` plans several): no model loads."""
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--plan"]
    if any(a in ("-h", "--help") for a in argv):
        print(help_text("sweep"))
        return 0
    try:
        argv, _ = _take_cfg_flag(argv)  # `--cfg job` shows configs when running; a plan runs nothing
        print(plan_text(argv))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


@dataclass
class PlanParts:
    """The three parts of a plan: the timed cells, the shared-block replays, and the calibrations (``check``
    with the real weights) that turn the replays' tokens per call into predicted speed-ups."""

    cells: Plan
    replays: list[ReplayPlan]
    calibrations: list[CalibrationPlan]

    @property
    def cells_seconds(self) -> float:
        return self.cells.seconds

    @property
    def replay_seconds(self) -> float:
        return sum(replay.seconds for replay in self.replays if not replay.error)

    @property
    def calibration_seconds(self) -> float:
        return sum(calibration.seconds for calibration in self.calibrations)

    @property
    def seconds(self) -> float:
        return self.cells_seconds + self.replay_seconds + self.calibration_seconds


def plan_parts(argv: list[str]) -> PlanParts:
    """The plan of the cells ``sweep`` would run with ``argv`` (several experiments allowed), of the
    experiments' replays and of the calibration each replay's predictions need; loads no model."""
    experiments = [None]
    rest = []
    for argument in argv:
        key, _, value = argument.lstrip("+").partition("=")
        if key == "experiment" and value.strip():  # one or several (experiment=a,b)
            experiments = [v.strip() for v in value.split(",") if v.strip()]
        else:
            rest.append(argument)
    plans, commands = [], []
    for experiment in experiments:
        arguments = [f"experiment={experiment}", *rest] if experiment else rest
        if replay_only(experiment):  # its replay alone (plan_replays below), no sweep cells
            commands.append((arguments, experiment))
            continue
        args = parse_arguments(arguments)
        with Composer() as composer:
            runs = [run_config(cfg) for cfg in expand(composer, args, use_grid=True)]
        for run in runs:
            check_batch_fits(run, run.hardware.batch_prompts, run.K, min(run.L, run.max_new_tokens),
                             "hardware.batch_prompts")
        plans.extend(plan_cells(runs))
        commands.append((arguments, runs[0].choices.get("experiment") if runs else experiment))
    plan = build_plan(plans)
    replays = plan_replays(commands, plan.measured_block_efficiency)  # the experiments' replay: blocks
    cells = [cell.run for cell in plans if not cell.skip_note]
    calibrations = [plan_calibration(check_command(replay.arguments), replay.configs, replay.K_values,
                                     replay.L_values, cells) for replay in replays if not replay.error]
    return PlanParts(plan, replays, calibrations)


def plan_text(argv: list[str]) -> str:
    """The plan of ``argv`` as ``plan`` prints it: the timed cells, each replay, each calibration, the total."""
    return format_parts(plan_parts(argv))


def format_parts(parts: PlanParts) -> str:
    lines = []
    if not parts.cells.pairs and parts.replays:  # replay experiments only (e.g. replay_qwen): no cells to price
        lines += ["Plan: replay only (the experiment has no grid: `sweep` has no cells to run here)",
                  "(nothing is loaded to make this plan)", ""]
    else:
        lines.append(format_plan(parts.cells))
    lines += replay_lines(parts.replays)
    lines += [line for calibration in parts.calibrations for line in format_calibration(calibration)]
    if parts.calibrations:  # a replay the command refuses is left out of the total
        lines.append(f"Total: {_hours(parts.seconds)} = replay {_hours(parts.replay_seconds)} + calibration "
                     f"{_hours(parts.calibration_seconds)} + timed cells {_hours(parts.cells_seconds)} "
                     f"({format_duration(parts.seconds)} in all; the replay gives every block efficiency and "
                     f"tokens per call, the calibration the seconds per call of the predicted speed-ups, the "
                     f"timed cells check them)")
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


__all__ = ["PlanParts", "format_parts", "main", "plan_parts", "plan_text"]
