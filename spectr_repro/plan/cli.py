"""``python -m spectr_repro plan ...`` (or ``sweep ... --plan``): what a sweep and its replays would cost.

    python -m spectr_repro plan experiment=paper_main            # cells, downloads, time; loads nothing
    python -m spectr_repro plan experiment=cpu_quick,replay_qwen # several experiments, their replays too

The timed cells are the runner's (``spectr_repro.runner.plan``), the shared-block replays the replay's
(``spectr_repro.replay.plan``); this command composes the two, so that neither package imports the other
(the replay is built on the runner). Bad input: one message on stderr, exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from spectr_repro.errors import UsageError
from spectr_repro.replay.plan import plan_replays, replay_lines, replay_only
from spectr_repro.runner.cli import _take_cfg_flag, help_text
from spectr_repro.runner.config import Composer, expand, parse_arguments, validate
from spectr_repro.runner.execute import plan_cells
from spectr_repro.runner.plan import build_plan, format_plan


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


def plan_text(argv: list[str]) -> str:
    """The plan of the cells ``sweep`` would run with ``argv`` (several experiments allowed) and of the
    experiments' replays, with their total."""
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
            cfgs = expand(composer, args, use_grid=True)
        for cfg in cfgs:
            validate(cfg)
        plans.extend(plan_cells(cfgs))
        commands.append((arguments, cfgs[0].choices.experiment if cfgs else experiment))
    plan = build_plan(plans)
    replays = plan_replays(commands, plan.measured_block_efficiency)  # the experiments' replay: blocks
    if not plan.pairs and replays:  # replay experiments only (e.g. replay_qwen): no cells to price
        return "\n".join(["Plan: replay only (the experiment has no grid: `sweep` has no cells to run here)",
                          "(nothing is loaded to make this plan)", "", *replay_lines(replays, plan.seconds)])
    return "\n".join([format_plan(plan), *replay_lines(replays, plan.seconds)])


__all__ = ["main", "plan_text"]
