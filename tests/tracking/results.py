"""A results folder as `make reproduce` leaves it, on the tiny random pair, with every command's offline W&B run:
a timed cell and its AR baseline, the replay, the bias test, check, theory, audit, the report; bench (whose real
run loads SmolLM2) logs a small bench.json through the same call as its CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from spectr_repro import tracking

EXPERIMENT = "default"
TINY = ["model_pair=tiny_random", "hardware=cpu", "dataset=humaneval", "temperature=0.7"]
REPLAY = [*TINY, "method=sd,sbv,spectr", "K=1,2", "L=2,3", "replay.reference_K=2", "replay.reference_L=2",
          "replay.draws=1", "num_prompts=2", "max_new_tokens=6"]
CELL = [*TINY, "method=sbv", "K=2", "L=2", "num_prompts=1", "max_new_tokens=6"]
BIAS = [*TINY, "K=2", "L=3", "num_prompts=1", "bias.samples=8", "bias.batch=4", "bias.continuation_tokens=6",
        "method=sbv,spectr"]
CHECK = ["model_pair=tiny_random", "check.quick=true", "method=sd", "K=1", "L=3"]
BENCH = {"settings": {"preset": "synthetic", "temperature": 0.7}, "environment": {"device": "cpu"},
         "methods": {"tiny_random": [{"method": "sd", "K": 1, "L": 3, "tokens_per_s": 10.0},
                                     {"method": "sbv", "K": 2, "L": 3, "tokens_per_s": 12.0}]},
         "ar_vs_hf_generate": {"tiny_random": {"ours_tokens_per_s": 9.0, "hf_tokens_per_s": 8.0}},
         "wall_time_s": 1.0}


def make_results(root: Path) -> Path:
    """Run every command into ``root`` (the caller isolates the environment); returns root/<experiment>."""
    from spectr_repro.analysis.report.build import main as report
    from spectr_repro.bias.driver import main as bias
    from spectr_repro.check.cli import main as check
    from spectr_repro.replay.driver import main as replay
    from spectr_repro.runner.cli import main_run
    from spectr_repro.theory.cli import main_audit, main_theory

    out = f"output_dir={root}"
    assert main_run([*CELL, out]) == 0
    assert replay([*REPLAY, out]) == 0
    assert bias([*BIAS, out]) == 0
    assert check([*CHECK, f"check.output={root / 'check'}"]) == 0
    assert main_theory(["--quick", "--out", str(root / "theory")]) == 0
    assert main_audit(["--quick", "--rules", "sd,sbv", "--samples", "200", "--no-peers",
                       "--out", str(root / "audit")]) == 0
    bench = root / "bench" / "bench.json"
    bench.parent.mkdir(parents=True)
    bench.write_text(json.dumps(BENCH))
    tracking.log_command("bench", tracking.logger_config(), bench.parent, results=BENCH,
                         config={**BENCH["settings"], "environment": BENCH["environment"]})
    folder = root / EXPERIMENT
    assert report([str(folder)]) == 0
    assert not Path(os.getcwd(), "wandb").exists()
    return folder
