"""The runner's command line: ``run`` (one cell), ``sweep`` (a grid); ``plan`` is :mod:`spectr_repro.plan`.

    python -m spectr_repro run method=spectr_gbv K=3 L=8 dataset=gsm8k model_pair=tiny_random
    python -m spectr_repro sweep K=1,3,5,7 method=spectr,spectr_gbv
    python -m spectr_repro plan experiment=paper_main            # cells, downloads, time; loads nothing
    python -m spectr_repro sweep experiment=ablation_K          # the experiment's grid
    python -m spectr_repro sweep experiment=paper_main hydra/launcher=slurm   # one SLURM job per pair

Every cell of a command runs in one process, pair by pair (one pair in memory); each group's AR baseline
runs once and gives every method's speed-up. Cells are claimed before they are computed
(:mod:`spectr_repro.launch.claims`), so several runners over one folder compute each cell once.
Records: ``<output_dir>/<experiment>/cells/<cell_id>/`` (see :mod:`spectr_repro.runner.store`); a cell
is finished only when its summary agrees with its records, and is redone otherwise; ``force=true``
recomputes finished ones. Bad input: one message on stderr, exit status 2, nothing written; a missing
resource: exit 1; SIGINT 130 and SIGTERM 143, each saying what was kept.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence

import hydra
import pandas as pd
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import OmegaConf, open_dict

from spectr_repro import tracking
from spectr_repro.errors import exit_at_the_door
from spectr_repro.launch.claims import Runner
from spectr_repro.launch.config import (
    GROUPS,
    Composer,
    ParsedArgs,
    UsageError,
    check_before_loading,
    check_dataset_sizes,
    check_device,
    check_writable,
    conf_dir,
    expand,
    grid_axes,
    group_options,
    needs_single_draft,
    parse_arguments,
    run_config,
    run_folders,
    single_draft_message,
)
from spectr_repro.launch.signals import Terminated, stop_name, stop_on_signals, stop_status
from spectr_repro.runner.execute import CellOutcome, CellPlan, ResourceError, Session, plan_cells
from spectr_repro.runner.store import cell_id
from spectr_repro.settings import RunConfig

USAGE = """\
usage: python -m spectr_repro {command} [key=value ...]

Top-level keys: K, L, temperature, method, dataset, model_pair, num_prompts, max_new_tokens, seed,
output_dir, experiment, force; groups: hardware=cpu|cuda, logger=wandb_offline|wandb_online|disabled;
runner.* (claims, SLURM job layout) and hardware.allow_offload; unknown keys are refused, `+` or not.
`sweep ... --plan` (or `python -m spectr_repro plan ...`) prints cells, downloads and time, loading nothing.
{extra}"""


def main_run(argv: Sequence[str] | None = None) -> int:
    """One cell (plus its AR baseline when that is not finished yet)."""
    return _main("run", list(sys.argv[1:] if argv is None else argv))


def main_sweep(argv: Sequence[str] | None = None) -> int:
    """The grid of the comma lists on the command line and of the selected experiment."""
    return _main("sweep", list(sys.argv[1:] if argv is None else argv))


def _main(command: str, argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(command))
        return 0
    try:
        argv, show_config = _take_cfg_flag(argv)
        args = parse_arguments(argv)
        if command == "sweep" and args.launcher_overrides:
            return _hydra_multirun(args)
        runs, plans = _compose_and_check(command, args, show_config)
    except (UsageError, ResourceError) as error:  # bad input, or a dataset that cannot be read: before any model loads
        return exit_at_the_door(error)
    if show_config:  # Hydra's `--cfg job`: print the composed config of every cell, run nothing
        print_configs(runs)
        return 0
    return _run_plans(runs, plans)


def _compose_and_check(command: str, args, show_config: bool) -> tuple[list, list[CellPlan] | None]:
    """The cells' settings and (unless only shown) their plans; UsageError for anything that cannot run."""
    if args.launcher_overrides:
        raise UsageError("hydra/launcher overrides apply to `sweep` only")
    if command == "run" and args.sweeps:
        keys = ", ".join(key for key, _ in args.sweeps)
        raise UsageError(f"`run` takes one value per key; use `sweep` for lists ({keys})")
    with Composer() as composer:
        runs = [run_config(cfg) for cfg in expand(composer, args, use_grid=command == "sweep")]
    for run in runs:
        if command == "run" and needs_single_draft(run):
            raise UsageError(single_draft_message(run))
        if not show_config:
            check_device(run.hardware.device)
    if show_config:
        return runs, None
    plans = plan_cells(runs)
    check_something_to_run(plans)
    check_before_loading([plan.run for plan in plans if not plan.skip_note])  # the one path every command takes
    _check_folders(plans)
    return runs, plans


def _session(runs: Sequence[RunConfig], progress: bool = True) -> Session:
    """One session over the runs' cells, with the ``runner:`` settings of the first (claims, polling)."""
    settings = runs[0].group("runner")
    return Session(force=any(run.force for run in runs), progress=progress,
                   poll_s=float(settings.get("poll_s", 5)),
                   runner=Runner(heartbeat_s=float(settings.get("heartbeat_s", 30)),
                                 stale_after_s=float(settings.get("stale_after_s", 600))))


def _run_plans(runs: list[RunConfig], plans: list[CellPlan]) -> int:
    """Run the planned cells in one session (SIGTERM unwinds like Ctrl-C) and print what happened."""
    _prepare_logging(runs)
    session = _session(runs)
    finished: list[CellOutcome] = []
    folder = plans[0].directory.parent.parent if plans else runs[0].output_dir
    try:
        with stop_on_signals():
            outcomes = session.run(plans, on_cell=finished.append)
    except ResourceError as error:
        print(f"error: {error}\n(finished cells are kept; fix the above and rerun the same command)",
              file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        print("\n" + stopped_message(stop_name(stop), plans, finished, session.interrupted, folder,
                                      session.written_cells(plans)), file=sys.stderr)
        return stop_status(stop)
    print(summary_table(outcomes))
    notes = [o for o in outcomes if o.status == "skipped"]
    for outcome in notes:
        print(f"note: skipped {outcome.plan.cell_id}: {outcome.note}")
    counts = {status: sum(o.status == status for o in outcomes)
              for status in ("ran", "finished earlier", "finished elsewhere", "claimed elsewhere")}
    print(f"{counts['ran']} cell(s) run, {counts['finished earlier']} finished earlier (skipped), "
          f"{counts['finished elsewhere'] + counts['claimed elsewhere']} computed by another runner, "
          f"{len(notes)} skipped as invalid; results in {folder}")
    return 0


def stopped_message(signal_name: str, plans, finished: Sequence[CellOutcome], interrupted, folder,
                    written: set[str] = frozenset()) -> str:
    """What was kept and what was dropped when a run is stopped by a signal. ``written``: cells this run left
    finished on disk (:meth:`Session.written_cells`): a signal can land after a cell's summary is written and
    before its outcome is recorded, and the files, not the outcomes, say what is kept."""
    others = {o.plan.cell_id for o in finished if o.status != "ran"}
    ran_ids = {o.plan.cell_id for o in finished if o.status == "ran"} | (set(written) - others)
    ran = len(ran_ids)
    earlier = sum(o.status in ("finished earlier", "finished elsewhere") for o in finished)
    left = len([p for p in plans if not p.skip_note]) - ran - earlier - sum(
        o.status == "claimed elsewhere" for o in finished)
    if interrupted is not None and interrupted.cell_id in ran_ids:
        interrupted = None  # its summary was written before the signal: kept, not dropped
    dropped = (f"the cell being computed ({interrupted.cell_id}) was dropped and starts over"
               if interrupted is not None else "no cell was being computed")
    return (f"stopped by {signal_name}: kept {ran} cell(s) computed in this run and {earlier} finished before, "
            f"in {folder}; {dropped}; rerun the same command to compute the {max(left, 0)} cell(s) left.")


def check_something_to_run(plans) -> None:
    """UsageError when every cell of the command is invalid (e.g. `sweep method=sd K=3`): exit 2 with the
    reason rather than "0 cell(s) run" and status 0."""
    if plans and all(plan.skip_note for plan in plans):
        reasons = list(dict.fromkeys(plan.skip_note for plan in plans))
        raise UsageError(f"nothing valid to run: all {len(plans)} cell(s) are invalid. " + " ".join(reasons))


def check_prompt_counts(plans) -> None:
    """UsageError when a cell asks for more prompts than its dataset has, before any model pair loads."""
    check_dataset_sizes((plan.run, plan.run.num_prompts) for plan in plans if not plan.skip_note)


def _check_folders(plans) -> None:
    """Every folder the run writes (experiment, cells, existing cell folders, W&B) must be writable."""
    by_output: dict[tuple, list] = {}
    for plan in plans:
        key = (plan.run.output_dir, plan.run.experiment)
        by_output.setdefault(key, [plan.run, []])[1].append(plan.directory)
    for run, directories in by_output.values():
        existing = [d for d in directories if d.exists()]
        check_writable(run.output_dir, run_folders(run, existing))


def _take_cfg_flag(argv: list[str]) -> tuple[list[str], bool]:
    """Strip Hydra's ``--cfg job`` (also ``--cfg=job``, ``-c job``) from argv; only ``job`` is supported."""
    rest, show, index = [], False, 0
    while index < len(argv):
        argument = argv[index]
        if argument in ("--cfg", "-c") or argument.startswith("--cfg="):
            value = argument.split("=", 1)[1] if "=" in argument else (argv[index + 1] if index + 1 < len(argv)
                                                                      else None)
            index += 1 if "=" in argument else 2
            if value != "job":
                raise UsageError(f"--cfg takes 'job' (print the composed config of each cell), got {value!r}")
            show = True
            continue
        rest.append(argument)
        index += 1
    return rest, show


def print_configs(runs: Sequence[RunConfig]) -> None:
    """The resolved config of each cell, as YAML (what config.yaml beside each summary will hold)."""
    for number, run in enumerate(runs, 1):
        if len(runs) > 1:
            print(f"# cell {number}/{len(runs)}: {cell_id(run)}")
        print(OmegaConf.to_yaml(OmegaConf.create(run.values)))


def _prepare_logging(runs: Sequence[RunConfig]) -> None:
    for run in runs:
        if run.logger is not None:
            tracking.prepare(run.logger)


def summary_table(outcomes: Sequence[CellOutcome]) -> str:
    """Markdown table of the cells: method, K, L, T, block efficiency, speed-up, tokens/s."""
    rows = []
    for outcome in outcomes:
        run, summary = outcome.plan.run, outcome.summary or {}
        rows.append({
            "model_pair": run.model_pair,
            "dataset": run.dataset,
            "method": run.method,
            "K": run.K,
            "L": run.L,
            "T": run.temperature,
            "BE": _number(summary.get("block_efficiency")),
            "speedup": _number(summary.get("speedup")),
            "tokens/s": _number(summary.get("tokens_per_s"), digits=1),
            "status": outcome.status if outcome.status != "skipped" else "skipped (needs K=1)",
        })
    if not rows:
        return "(no cells)"
    frame = pd.DataFrame(rows)
    for column in ("model_pair", "dataset"):
        if frame[column].nunique() == 1:
            frame = frame.drop(columns=column)
    numeric = ("K", "L", "T", "BE", "speedup", "tokens/s")
    align = ["right" if column in numeric else "left" for column in frame]
    return frame.to_markdown(index=False, floatfmt=".2f", colalign=align)


def _number(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def help_text(command: str | None = None) -> str:
    groups = "\n".join(f"  {group:<11} {', '.join(group_options(group)) or '(none yet)'}"
                       for group in ("method", "model_pair", "dataset", "experiment", "hardware", "logger"))
    extra = f"Config groups (conf/ in {conf_dir()}):\n{groups}\n"
    if command == "sweep":
        extra += ("\nComma lists expand to the grid (K=1,3,5 method=sd,spectr); axes not given take the\n"
                  "experiment's `grid`. hydra/launcher=slurm sends SLURM jobs (submitit): one per model pair by\n"
                  "default (runner.jobs=per_pair; workers_<N>, per_cell). Cells are claimed, so several runners\n"
                  "over one folder compute each cell once.\n")
    return USAGE.format(command=command or "{run,sweep}", extra=extra)


# --------------------------------------------------------------------------------------------------
# SLURM (or any Hydra launcher): Hydra's own multirun


def _hydra_multirun(args: ParsedArgs) -> int:
    """Run Hydra's real multirun with the chosen launcher (e.g. hydra/launcher=slurm).

    ``runner.jobs`` says how the grid becomes jobs (see conf/config.yaml):

    * ``per_pair`` (default): one job per model pair; each runs that pair's cells in one process, so a
      job never loads two pairs and loads its pair once;
    * ``per_cell``: one job per cell (each sub-grid of the experiment is one Hydra multirun);
    * ``workers_<N>``: N identical jobs over the whole grid (an array of N): they share the cells
      through claims, each cell computed once.

    Whatever the layout, cells are claimed before they are computed, so jobs over overlapping grids (or a
    rerun while jobs are still running) never compute a cell twice.
    """
    with Composer() as composer:
        base = composer.compose(args.fixed)
        runs = [run_config(cfg) for cfg in expand(composer, args, use_grid=True)]
    plans = plan_cells(runs)
    _check_folders(plans)
    jobs = str((base.get("runner") or {}).get("jobs", "per_pair"))
    argv = _argv_without_launcher(args)
    if jobs == "per_cell":
        runs = [([f"{key}={','.join(values)}" for key, values in list(args.sweeps) + axes], hydra_task)
                for axes in grid_axes(base.get("grid"), args.user_keys)]
    elif jobs == "per_pair":
        pairs = list(dict.fromkeys(run.model_pair for run in runs))
        runs = [([f"model_pair={','.join(pairs)}"], functools.partial(sweep_task, tuple(argv), "model_pair"))]
    elif jobs.startswith("workers_") and jobs.removeprefix("workers_").isdigit():
        count = int(jobs.removeprefix("workers_"))
        runs = [([f"runner.worker=range({count})"], functools.partial(sweep_task, tuple(argv), None))]
    else:
        raise UsageError(f"runner.jobs must be per_pair, per_cell or workers_<N>, got {jobs!r}")
    fixed = [a for a in args.fixed if not a.startswith("model_pair=")] if jobs == "per_pair" else list(args.fixed)
    saved_argv = sys.argv
    try:
        for sweeps, task in runs:
            sys.argv = ["spectr_repro", "--multirun", *fixed, *sweeps, *args.launcher_overrides]
            GlobalHydra.instance().clear()
            hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)()
    finally:
        sys.argv = saved_argv
        GlobalHydra.instance().clear()
    return 0


def _argv_without_launcher(args: ParsedArgs) -> list[str]:
    """The command's overrides as a `sweep` takes them (the launcher's own overrides left out)."""
    return [*args.fixed, *(f"{key}={','.join(values)}" for key, values in args.sweeps)]


def sweep_task(argv: tuple[str, ...], pinned: str | None, cfg) -> int:
    """One Hydra job running ``sweep argv`` in-process (the pair of the job pinned when ``pinned``)."""
    extra = []
    if pinned == "model_pair":
        extra = [f"model_pair={HydraConfig.get().runtime.choices.get('model_pair')}"]
    backup = get_gh_backup()  # the job runs inside Hydra's own app; the sweep composes with its own
    GlobalHydra.instance().clear()
    try:
        code = _main("sweep", [*argv, *extra])
    finally:
        restore_gh_from_backup(backup)
    if code != 0:
        raise RuntimeError(f"sweep {' '.join([*argv, *extra])} exited with status {code}")
    return code


def hydra_task(cfg) -> float | None:
    """One Hydra job = one cell (and its AR baseline if not finished). Returns the speed-up."""
    choices = HydraConfig.get().runtime.choices
    with open_dict(cfg):
        cfg["choices"] = {group: choices.get(group) for group in GROUPS}
    run = run_config(cfg)
    outcomes = _session([run], progress=False).run(plan_cells([run]))
    print(summary_table(outcomes))
    summary = outcomes[-1].summary or {}
    return summary.get("speedup")


__all__ = ["UsageError", "check_prompt_counts", "check_something_to_run", "help_text",
           "hydra_task", "main_run", "main_sweep", "print_configs",
           "stopped_message", "summary_table", "sweep_task"]
