"""A small synthetic results folder (every file a command writes that the dashboard reads) and its offline W&B runs,
each logged by the same call, with the same arguments, as the command's driver makes: fast, no model."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from spectr_repro import tracking  # noqa: E402

EXPERIMENT = "synthetic"
DATASET, T = "humaneval", 0.4


def replay_summary() -> pd.DataFrame:
    rows = []
    for method, Ks in (("sd", (1,)), ("sbv", (1, 3)), ("spectr_gbv", (1, 3))):
        for K in Ks:
            for L in (2, 4):
                rows.append({"model_pair": "tiny_random", "temperature": T, "dataset": DATASET, "method": method,
                             "K": K, "L": L, "blocks": 20, "prompts": 4,
                             "tokens_per_call": 1.0 + 0.1 * K + 0.2 * L + (0.05 if method == "sbv" else 0.0),
                             "ci_low": 1.0, "ci_high": 3.0, "estimator": "exact", "first_iteration": False})
    return pd.DataFrame(rows)


def write_files(root: Path) -> Path:
    folder = root / EXPERIMENT
    (folder / "replay").mkdir(parents=True)
    (folder / "cells").mkdir()  # the timed cells' folder (their runs: log_cell below)
    replay_summary().to_csv(folder / "replay" / "replay_summary.csv", index=False)
    pd.DataFrame([{"model_pair": "tiny_random", "temperature": T, "dataset": DATASET, "method": "sbv", "K": 3, "L": 4,
                   "comparator": "spectr_gbv", "comparator_K": 3, "difference": 0.05, "ci_low": 0.01,
                   "ci_high": 0.09, "prompts": 4, "verdict": "higher"}]).to_csv(
        folder / "replay" / "replay_differences.csv", index=False)
    (folder / "tables").mkdir()
    pd.DataFrame([{"claim": "SpecTr-GBV beats SD", "paper": "yes", "measured": "+0.1", "verdict": "holds", "note": ""},
                  {"claim": "GBV beats BV", "paper": "yes", "measured": "0.0", "verdict": "undecided",
                   "note": "≈40 prompts would decide it"}]).to_csv(folder / "tables" / "verdicts.csv", index=False)
    predictions = replay_summary().assign(speedup=lambda f: f["tokens_per_call"] / (1 + 0.1 * f["K"]))
    predictions.to_csv(folder / "tables" / "speedup_predictions.csv", index=False)
    pd.DataFrame([{"cell_id": "c1", "method": "sbv", "K": 3, "L": 4, "temperature": T, "dataset": DATASET,
                   "prompts": 1, "measured": 1.3, "predicted": 1.4}]).to_csv(
        folder / "tables" / "speedup_agreement.csv", index=False)
    (folder / "figures").mkdir()
    figure, axes = plt.subplots(figsize=(2, 2))
    axes.plot([1, 2], [1, 2])
    figure.savefig(folder / "figures" / "replay_ablation_K.png", dpi=30)
    plt.close(figure)
    (folder / "bias").mkdir()
    pd.DataFrame([{"model_pair": "tiny_random", "dataset": DATASET, "method": m, "K": 2, "L": 3, "temperature": T,
                   "draft_temperature": T, "context": "P/1+0", "samples": 8, "tv_estimate": tv, "interval": "[0, 1]",
                   "p_value": p, "detectable_tv": 0.2, "verdict": verdict, "estimator": "counted", "acceptance": 0.5,
                   "exact_tv": None} for m, tv, p, verdict in
                  (("sbv", 0.02, 0.7, "no bias detected (TV < 0.200 at 90 % power)"),
                   ("control_draft", 0.9, 0.001, "bias detected (p <= 0.05)"))]).to_csv(
        folder / "bias" / "bias.csv", index=False)
    (root / "audit").mkdir()
    (root / "audit" / "audit.json").write_text(json.dumps({
        "quick": True, "seconds": 1.0, "exact_tv_threshold": 1e-9, "p_value_threshold": 0.01,
        "rows": [{"rule": "sbv", "K": 2, "options": {}, "exact_tv": 1e-16, "p_value": 0.5, "verdict": "lossless",
                  "flags": []},
                 {"rule": "spectr_gbv", "K": 2, "options": {"carry_over": False}, "exact_tv": 0.012,
                  "p_value": 1e-12, "verdict": "NOT lossless", "flags": ["biased"]}], "peers": []}))
    (root / "theory").mkdir()
    pd.DataFrame([{"claim": "GBV >= BV", "verdict": "holds", "evidence": "exact"}]).to_csv(
        root / "theory" / "claims.csv", index=False)
    (root / "check").mkdir()
    (root / "check" / "check.json").write_text(json.dumps(CHECK))
    (root / "bench").mkdir()
    (root / "bench" / "bench.json").write_text(json.dumps(BENCH))
    return folder


CHECK = {"model_pair": "tiny_random", "hardware": "cpu", "random_weights": False, "quick": True, "shapes": {"Ks": [1]},
         "environment": {"device_name": "cpu"}, "passed": True, "wall_time_s": 5.0,
         "items": [{"section": "correctness", "name": "greedy AR = model.generate", "status": "pass", "detail": "",
                    "seconds": 0.1, "required": True}],
         "calibration": {"path": "c.json", "model_pair": "tiny_random", "seconds": {"decode": 0.001}}}
BENCH = {"settings": {"preset": "synthetic", "temperature": T}, "environment": {"device": "cpu"},
         "methods": {"tiny_random": [{"method": "sbv", "K": 2, "L": 3, "tokens_per_s": 12.0}]},
         "ar_vs_hf_generate": {"tiny_random": {"ours_tokens_per_s": 9.0, "hf_tokens_per_s": 8.0}}, "wall_time_s": 1.0}
CELL_CONFIG = {"method": {"name": "sbv"}, "dataset": {"name": DATASET}, "K": 3, "L": 4, "temperature": T,
               "choices": {"model_pair": "tiny_random", "dataset": DATASET}}
CELL_SUMMARY = {"method": "sbv", "dataset": DATASET, "model_pair": "tiny_random", "K": 3, "L": 4, "temperature": T,
                "block_efficiency": 2.5, "speedup": 1.3, "acceptance_by_position": [0.9, 0.8]}


def log_everything(root: Path, logger=None) -> Path:
    """The results files and one offline run per command (the drivers' calls); returns the results folder."""
    logger = logger if logger is not None else tracking.logger_config()
    folder = write_files(root)
    tracking.log_cell(logger, folder, EXPERIMENT, "sbv-cell", CELL_CONFIG, CELL_SUMMARY, [])
    replay = folder / "replay"
    tracking.log_command("replay", logger, folder, tables={"summary": replay / "replay_summary.csv",
                                                           "differences": replay / "replay_differences.csv"},
                         config=tracking.top_level_config([{"dataset": DATASET, "K": [1, 3], "L": [2, 4]}]))
    tracking.log_command("bias", logger, folder, tables={"rows": folder / "bias" / "bias.csv"}, config={"K": 2})
    tracking.log_command("check", logger, root / "check", results=CHECK, config={"model_pair": "tiny_random"})
    tracking.log_command("theory", logger, root / "theory", tables={"claims": root / "theory" / "claims.csv"})
    tracking.log_command("audit", logger, root / "audit",
                         results=json.loads((root / "audit" / "audit.json").read_text()), config={"quick": True})
    tracking.log_command("bench", logger, root / "bench", results=BENCH, config=BENCH["settings"])
    tables = {path.stem: path for path in sorted((folder / "tables").glob("*.csv"))}
    tracking.log_command("report", logger, folder, tables=tables,
                         images=sorted((folder / "figures").glob("*.png")), config={"results_dirs": [str(folder)]})
    return folder
