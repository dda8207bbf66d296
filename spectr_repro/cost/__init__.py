"""The one cost model: seconds per forward, call, prompt and cell, and the tokens/s they predict.

- :mod:`~spectr_repro.cost.calibration`: seconds per forward measured here (the data type, its file);
- :mod:`~spectr_repro.cost.measure`: measuring them at the shapes a run calls (``check``, the bench);
- :mod:`~spectr_repro.cost.model`: seconds of a forward (calibrated or roofline), a call, a prompt, a cell;
  the block efficiency to expect and the rules' seconds per block, each with its source;
- :mod:`~spectr_repro.cost.predict`: tokens/s of every lossless (rule, K, L) of a replay, the fastest;
- :mod:`~spectr_repro.cost.roofline`: a roofline for a named accelerator (spec-sheet peaks, ``accelerators.yaml``):
  seconds of a forward, the speed-up a block efficiency allows, the paper's speed-ups against it (a model).

It sits below every command (plan, replay, check, bench): it reads configs, calibrations and tables, never a
results folder's layout.
"""

from spectr_repro.cost.calibration import (
    CALIBRATION_ENV_VAR,
    Calibration,
    ForwardCosts,
    calibration_for,
    calibration_path,
    find_calibration,
    read_calibrations,
    today,
    write_calibration,
)
from spectr_repro.cost.model import (
    CellSpec,
    calibrated_cell_seconds,
    calibrated_prompt_seconds,
    calls_to_emit,
    cell_seconds,
    expected_block_efficiency,
    forward_seconds,
    model_calls_source,
    prompt_seconds,
    rule_seconds_per_block,
    seconds_per_call,
    speculative_prompt_seconds,
)
from spectr_repro.cost.predict import best_configuration, describe_best, predict_tokens_per_s, read_replay_summary
from spectr_repro.cost.roofline import (
    Accelerator,
    ModelShape,
    accelerator,
    allowed_speedup,
    allowed_tokens_per_s,
    load_accelerators,
    model_shape,
    pair_shapes,
    paper_speedups_against_roofline,
    roofline_against_calibration,
    roofline_forward_costs,
    roofline_forward_seconds,
)

__all__ = ["CALIBRATION_ENV_VAR", "Calibration", "CellSpec", "ForwardCosts", "best_configuration",
           "calibrated_cell_seconds",
           "calibrated_prompt_seconds", "calibration_for", "calibration_path", "calls_to_emit",
           "cell_seconds", "describe_best", "expected_block_efficiency", "find_calibration", "forward_seconds",
           "model_calls_source", "predict_tokens_per_s", "prompt_seconds", "read_calibrations",
           "read_replay_summary", "rule_seconds_per_block", "seconds_per_call", "speculative_prompt_seconds",
           "today", "write_calibration",
           # the roofline
           "Accelerator", "ModelShape", "accelerator", "allowed_speedup", "allowed_tokens_per_s", "load_accelerators",
           "model_shape", "pair_shapes", "paper_speedups_against_roofline", "roofline_against_calibration",
           "roofline_forward_costs", "roofline_forward_seconds"]
