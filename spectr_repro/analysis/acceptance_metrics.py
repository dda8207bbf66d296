"""Acceptance in the ecosystem's names: SPEED-Bench's metrics (NVIDIA Model-Optimizer, ``examples/specdec_bench``,
``specdec_bench/metrics/acceptance_rate.py``), computed from our records so users can set our numbers beside theirs.

A *step* is one target call; its length is the tokens it emitted: the accepted draft tokens plus the correction or
bonus token (tau + 1; our records keep tau per iteration in ``accepted_lengths``). Following specdec_bench:

* ``Acceptance_Length_Histogram``: {length: steps}, over every step of every prompt, lengths ascending;
* ``Conditional_Acceptance_Rate[k]``: P(length >= k | length >= k'), k' the previous length present in the histogram
  (1.0 at the smallest); only lengths present are keys, as in specdec_bench;
* ``Joint_Acceptance_Rate[k]``: the product of the conditional rates up to k = P(length >= k);
* ``Average_AL``: the mean over prompts of each prompt's mean step length (a mean of means, not tokens over calls:
  it differs from our pooled block efficiency when prompts have different numbers of steps).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

METRICS = ("Acceptance_Length_Histogram", "Conditional_Acceptance_Rate", "Joint_Acceptance_Rate", "Average_AL")


def speed_bench_metrics(step_lengths: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """SPEED-Bench's four metrics from each prompt's step lengths (``step_lengths``: prompt id -> tau + 1 per step);
    prompts without a step are skipped. ValueError when no prompt has one."""
    prompts = {prompt: list(lengths) for prompt, lengths in step_lengths.items() if len(lengths)}
    if not prompts:
        raise ValueError("no step to measure: every prompt has an empty list of step lengths")
    histogram = dict(sorted(Counter(length for lengths in prompts.values() for length in lengths).items()))
    total = sum(histogram.values())
    at_least, previous, conditional, joint = total, 1.0, {}, {}
    for length, steps in histogram.items():
        share = at_least / total  # P(length >= this one)
        conditional[length] = share / previous
        joint[length] = share
        previous = share
        at_least -= steps
    average = sum(sum(lengths) / len(lengths) for lengths in prompts.values()) / len(prompts)
    return {"Acceptance_Length_Histogram": histogram, "Conditional_Acceptance_Rate": conditional,
            "Joint_Acceptance_Rate": joint, "Average_AL": average}


def step_lengths_of(records: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """prompt id -> tau + 1 per iteration, from PromptRecord rows (``accepted_lengths``)."""
    return {str(r["prompt_id"]): [int(tau) + 1 for tau in (r.get("accepted_lengths") or [])] for r in records}


def speed_bench_table(records: pd.DataFrame, keys: Sequence[str] = ("model_pair", "dataset", "method", "K", "L",
                                                                       "temperature")) -> pd.DataFrame:
    """One row per cell of speculative records: Average_AL, the histogram and the rates as JSON-ready dicts, and
    P(length >= k) for k = 2..max as columns ``joint_k`` (wide, for W&B and the report)."""
    if records.empty or "accepted_lengths" not in records:
        return pd.DataFrame()
    rows = []
    speculative = records[records["method"] != "ar"]
    for cell, group in speculative.groupby(list(keys), sort=True):
        lengths = step_lengths_of(group.to_dict("records"))
        if not any(lengths.values()):
            continue
        metrics = speed_bench_metrics(lengths)
        row = dict(zip(keys, cell))
        row.update({name: metrics[name] for name in METRICS})
        row.update({f"joint_{k}": v for k, v in metrics["Joint_Acceptance_Rate"].items() if k > 1})
        rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["METRICS", "speed_bench_metrics", "speed_bench_table", "step_lengths_of"]
