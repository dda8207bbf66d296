"""The replay's sections: the verdicts on the paper's claims (they open the report) and the replayed Table 1
with its differences, K and L figures and agreement with the trajectory cells (before the trajectory's)."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.format import relative
from spectr_repro.analysis.replay import LABEL
from spectr_repro.analysis.replay_grid import k_monotonicity_table
from spectr_repro.analysis.replay_report import (
    ablation_figure,
    agreement_markdown,
    replayed_differences_markdown,
    table1_markdown,
    verdict_rows,
)
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.analysis.speedup_report import speedup_verdict_rows


def verdicts_section(context: ReportContext) -> str | None:
    replay = context.replay
    if replay is None:
        return None
    cells = context.results.cells if context.results is not None else None
    rows = verdict_rows(replay.blocks, replay.table, context.audit.rows if context.audit else None, cells,
                        main=(replay.K, replay.L)) + speedup_verdict_rows(context.speedup)
    frame = pd.DataFrame(rows)[["claim", "paper", "measured", "verdict", "note"]]
    (context.out_dir / "tables").mkdir(parents=True, exist_ok=True)
    frame.to_csv(context.out_dir / "tables" / "verdicts.csv", index=False)  # the dashboard's verdicts (W&B)
    return "\n".join([
        "## Verdicts: the paper's claims against this run", "",
        f"Block-efficiency claims are judged on the shared-block replay ({LABEL}, 95 % intervals over prompts, "
        "paired on the same blocks; average over the replayed datasets). *holds* = every difference excludes 0 in "
        "the claimed direction; *does not hold* = one excludes 0 against it; *undecided* otherwise, with the number "
        "of prompts that would decide it where the effect size allows. Speed-up claims are judged on speed-ups "
        "predicted from the same blocks and this machine's measured costs (section *Speed-up*), with the timed "
        "cells beside them" + ("" if context.speedup is not None else
                              " — not here: no calibration of this pair (run `python -m spectr_repro check`)")
        + ".", "",
        frame.to_markdown(index=False), ""])


def replay_section(context: ReportContext) -> str | None:
    replay = context.replay
    if replay is None:
        return None
    K, L, out_dir = replay.K, replay.L, context.out_dir
    lines = [f"## Table 1 — {LABEL}", "",
             f"Every rule on the same draft blocks (K={K}, L={L}; single-draft rules K=1): each block is one target "
             "call of a lossless reference trajectory, drafted whole, and each value is the rule's expected tokens on "
             "it (exact where the rule has a closed form, else the mean of its sampler's draws). 95 % intervals "
             "resample prompts. GBV carries state: its value is a first iteration's. Files: "
             + ", ".join(f"`{relative(folder / 'replay_summary.csv', out_dir)}`"
                         for folder in replay.summary_folders or replay.roots), ""]
    if replay.left_out:  # damaged prompts: the tables are built from the rest, and say so
        lines += ["Left out of the replay (files that could not be read; rerun `replay` on the folder to recompute "
                  "them):", "", *(f"- {problem}" for problem in replay.left_out), ""]
    for (pair, temperature), part in replay.table.groupby(["model_pair", "temperature"], sort=False):
        lines += [f"### {pair}, T={temperature:g}", "", table1_markdown(part, K, L), ""]
    lines += ["### Which replayed differences are real", "",
              "Each method against the release (SpecTr-GBV at the same K, L) and SD (K=1, same L), paired on the "
              "same blocks.", "", replayed_differences_markdown(replay.differences, K, L), ""]
    for axis, fixed in (("K", {"L": L}), ("L", {"K": K})):
        path = ablation_figure(replay.table, axis, fixed, out_dir / "figures" / f"replay_ablation_{axis}.png")
        if path is not None:
            lines += [f"### Tokens per call vs {axis} (replay)", "", f"![replay vs {axis}]({relative(path, out_dir)})",
                      ""]
    monotone = k_monotonicity_table(replay.table)
    if not monotone.empty:
        lines += ["### Non-decreasing in K, and how close the largest K comes to L + 1", "",
                  "The paper's theory: block efficiency never falls as K grows, for every lossless rule, and tends to "
                  "the largest possible block, L + 1 tokens per call. Each lossless multi-draft rule per (T, L) on the "
                  "average over datasets (95 % intervals over prompts): *no* names a step down whose intervals are "
                  "separated, *within noise* a step down inside them.", "", monotone.to_markdown(index=False), ""]
    records = context.results.records if context.results is not None else None
    lines += ["### Replay against the trajectory cells", "",
              "Trajectory: the cells' block efficiency over their full blocks (the cell's L drafted; the engine drafts "
              "shorter blocks only where max_new_tokens would cut them, and a block's accepted length is recorded "
              "before max_new_tokens or EOS cut the text, so every full block counts, the last included). Replay: "
              "the same method's value on the replayed blocks of the same datasets. They agree when the intervals "
              "overlap. Their blocks start at different places (each trajectory's own block starts; the replay's are "
              "the reference's), so they estimate close but not identical quantities.", "",
              agreement_markdown(replay.blocks, replay.table, records, K, L), ""]
    return "\n".join(lines)
