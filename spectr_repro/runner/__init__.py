"""The experiment runner: ``python -m spectr_repro run ...`` (one cell) and ``sweep ...`` (a grid).

    python -m spectr_repro run method=spectr_gbv K=3 L=8 dataset=gsm8k model_pair=tiny_random
    python -m spectr_repro sweep K=1,3,5,7 method=spectr,spectr_gbv
    python -m spectr_repro sweep experiment=ablation_K          # the experiment's grid
    python -m spectr_repro sweep experiment=paper_main hydra/launcher=slurm   # one SLURM job per cell

Every cell of a command runs in one process (models loaded once per pair); each group's AR baseline
runs once and gives every method's speed-up. Records: ``<output_dir>/<experiment>/cells/<cell_id>/``
(see :mod:`spectr_repro.runner.store`). Finished cells are skipped on rerun; ``force=true``
recomputes them. Bad input: one message on stderr, exit status 2, nothing written.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from spectr_repro.runner.config import (
    Composer,
    ParsedArgs,
    UsageError,
    check_writable,
    conf_dir,
    expand,
    grid_axes,
    group_options,
    needs_single_draft,
    parse_arguments,
    single_draft_message,
    validate,
)
from spectr_repro.runner.execute import CellOutcome, ResourceError, Session, plan_cells

USAGE = """\
usage: python -m spectr_repro {command} [key=value ...]

Top-level keys: K, L, temperature, method, dataset, model_pair, num_prompts, max_new_tokens, seed,
output_dir, experiment, force; groups: hardware=cpu|cuda, logger=wandb_offline|wandb_online|disabled.
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
        if args.launcher_overrides:
            raise UsageError("hydra/launcher overrides apply to `sweep` only")
        if command == "run" and args.sweeps:
            keys = ", ".join(key for key, _ in args.sweeps)
            raise UsageError(f"`run` takes one value per key; use `sweep` for lists ({keys})")
        with Composer() as composer:
            cfgs = expand(composer, args, use_grid=command == "sweep")
        for cfg in cfgs:
            validate(cfg)
            check_writable(cfg.output_dir)
            if command == "run" and needs_single_draft(cfg):
                raise UsageError(single_draft_message(cfg))
            if not show_config:
                _check_device(cfg.hardware.get("device"))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if show_config:  # Hydra's `--cfg job`: print the composed config of every cell, run nothing
        print_configs(cfgs)
        return 0

    plans = plan_cells(cfgs)
    force = any(bool(cfg.force) for cfg in cfgs)
    _prepare_logging(cfgs)
    session = Session(force=force)
    try:
        outcomes = session.run(plans)
    except ResourceError as error:
        print(f"error: {error}\n(finished cells are kept; fix the above and rerun the same command)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: finished cells are kept; rerun the same command to finish the rest "
              "(the interrupted cell starts over)", file=sys.stderr)
        return 130
    print(summary_table(outcomes))
    notes = [o for o in outcomes if o.status == "skipped"]
    for outcome in notes:
        print(f"note: skipped {outcome.plan.cell_id}: {outcome.note}")
    earlier = sum(o.status == "finished earlier" for o in outcomes)
    ran = sum(o.status == "ran" for o in outcomes)
    print(f"{ran} cell(s) run, {earlier} finished earlier (skipped), {len(notes)} skipped as invalid; "
          f"results in {plans[0].directory.parent.parent if plans else cfgs[0].output_dir}")
    return 0


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


def print_configs(cfgs) -> None:
    """The resolved config of each cell, as YAML (what config.yaml beside each summary will hold)."""
    from omegaconf import OmegaConf

    from spectr_repro.runner.store import cell_id

    for number, cfg in enumerate(cfgs, 1):
        if len(cfgs) > 1:
            print(f"# cell {number}/{len(cfgs)}: {cell_id(cfg)}")
        print(OmegaConf.to_yaml(cfg, resolve=True))


def _check_device(device) -> None:
    """hardware=cuda on a machine without a visible GPU: say so before loading anything."""
    if device and str(device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"hardware device {device!r} but no CUDA device is visible to torch "
                             f"({torch.__version__}); use hardware=cpu")


def _prepare_logging(cfgs) -> None:
    from spectr_repro import tracking

    for cfg in cfgs:
        tracking.prepare(cfg.logger)


def summary_table(outcomes: Sequence[CellOutcome]) -> str:
    """Markdown table of the cells: method, K, L, T, block efficiency, speed-up, tokens/s."""
    import pandas as pd

    rows = []
    for outcome in outcomes:
        cfg, summary = outcome.plan.cfg, outcome.summary or {}
        rows.append({
            "model_pair": cfg.choices.model_pair,
            "dataset": cfg.choices.dataset,
            "method": cfg.method.name,
            "K": cfg.K,
            "L": cfg.L,
            "T": float(cfg.temperature),
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
                  "experiment's `grid`. hydra/launcher=slurm sends one SLURM job per cell (submitit).\n")
    return USAGE.format(command=command or "{run,sweep}", extra=extra)


# --------------------------------------------------------------------------------------------------
# SLURM (or any Hydra launcher): Hydra's own multirun, one job per cell


def _hydra_multirun(args: ParsedArgs) -> int:
    """Run Hydra's real multirun with the chosen launcher (e.g. hydra/launcher=slurm).

    Each sub-grid of the experiment becomes one Hydra multirun (Hydra sweeps are cartesian).
    Each job runs one cell; see conf/hydra/launcher/slurm.yaml.
    """
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    with Composer() as composer:
        base = composer.compose(args.fixed)
        for cfg in expand(composer, args, use_grid=True):
            validate(cfg)
            check_writable(cfg.output_dir)
    subgrids = grid_axes(base.get("grid"), args.user_keys)
    saved_argv = sys.argv
    try:
        for axes in subgrids:
            sweeps = [f"{key}={','.join(values)}" for key, values in list(args.sweeps) + axes]
            sys.argv = ["spectr_repro", "--multirun", *args.fixed, *sweeps, *args.launcher_overrides]
            GlobalHydra.instance().clear()
            hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(hydra_task)()
    finally:
        sys.argv = saved_argv
        GlobalHydra.instance().clear()
    return 0


def hydra_task(cfg) -> float | None:
    """One Hydra job = one cell (and its AR baseline if not finished). Returns the speed-up."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from spectr_repro.runner.config import GROUPS

    choices = HydraConfig.get().runtime.choices
    with open_dict(cfg):
        cfg["choices"] = {group: choices.get(group) for group in GROUPS}
    validate(cfg)
    outcomes = Session(force=bool(cfg.force), progress=False).run(plan_cells([cfg]))
    print(summary_table(outcomes))
    summary = outcomes[-1].summary or {}
    return summary.get("speedup")


__all__ = ["UsageError", "help_text", "hydra_task", "main_run", "main_sweep", "print_configs", "summary_table"]
