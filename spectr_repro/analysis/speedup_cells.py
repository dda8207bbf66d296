"""The speed-up model checked against timed cells, and where a call's time goes.

- :func:`cell_agreement`: every timed cell's measured speed-up (AR's wall time over the method's, on the same
  prompts, each decoded alone) beside two predictions for the same prompts: from the cost model and the
  replay's tokens per call (the prediction a user gets without timing), and from the cost model and the cell's
  own target calls (the cost model alone, free of the cell's few prompts' luck in block efficiency). Both
  charge each prompt's prefill (target and draft over its ``prompt_tokens``; AR: the target's) and take the
  costs at the prompt's mean context (its prompt plus half its new tokens).
- :func:`time_breakdown`: per generated token, what the draft, the target, the rule and everything else cost,
  measured from the cells' engine sections and predicted by the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spectr_repro.analysis.format import AVERAGE
from spectr_repro.analysis.load import base_method
from spectr_repro.analysis.replay_report import default_variant
from spectr_repro.analysis.speedup import LEVEL, RESAMPLES, SEED, SpeedupPrediction
from spectr_repro.cost.model import SECTIONS, CallCosts, calls_to_emit
from spectr_repro.verify import VERIFIERS

AGREEMENT_COLUMNS = ["cell_id", "method", "K", "L", "temperature", "dataset", "prompts", "new_tokens",
                     "measured", "measured_low", "measured_high", "predicted", "predicted_low", "predicted_high",
                     "predicted_own_calls", "error", "error_own_calls"]


def _ratio_interval(numerators: np.ndarray, denominators: np.ndarray, rng) -> tuple[float, float]:
    n = len(numerators)
    if n < 2:
        return float("nan"), float("nan")
    index = rng.integers(0, n, size=(RESAMPLES, n))
    ratios = numerators[index].sum(axis=1) / denominators[index].sum(axis=1)
    low, high = np.quantile(ratios, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


def _replayed_variants(cells: pd.DataFrame) -> set[str]:
    """The cell names that run each rule as the replay does: of the option variants a sweep named
    ("spectr_gbv[carry_over=False]", "spectr_gbv[arithmetic=release_bf16,carry_over=False]"), its config's."""
    if cells.empty:
        return set()
    rules = set(cells["method"].map(base_method))
    return {name for rule in rules for name in set(default_variant(cells, rule)["method"])}


def _timed_records(records: pd.DataFrame) -> pd.DataFrame:
    if records.empty or "wall_time_s" not in records:
        return records.iloc[:0]
    timed = records[records["wall_time_s"].notna() & records["ar_wall_time_s"].notna()]
    return timed[timed["method"].map(base_method) != "ar"]


def _prompt_seconds(costs: CallCosts, rule: str, K: int, L: int, prompt_tokens: np.ndarray, new_tokens: np.ndarray,
                    calls: np.ndarray) -> np.ndarray:
    context = prompt_tokens + new_tokens // 2
    per_call = np.array([costs.call_seconds(rule, K, L, int(c)) for c in context])
    prefill = np.array([costs.prefill_seconds(int(p)) for p in prompt_tokens])
    return prefill + calls * per_call


def _own_calls_seconds(costs: CallCosts, rule: str, K: int, L: int, prompts: pd.DataFrame) -> np.ndarray:
    """Each prompt's predicted seconds at its own calls: its prefill plus each call at the block it drafted (the
    records' ``block_lengths``: a call near the end of a generation drafts only what is left, and at L = 24 and
    48 new tokens that is a third of the calls); every call at L when a record lacks them."""
    seconds = []
    for p, n, calls, blocks in zip(prompts["prompt_tokens"], prompts["new_tokens"], prompts["target_calls"],
                                   prompts.get("block_lengths", pd.Series([None] * len(prompts)))):
        context = int(p + n // 2)
        blocks = list(blocks) if isinstance(blocks, (list, tuple, np.ndarray)) and len(blocks) else [L] * int(calls)
        per_block = {b: costs.call_seconds(rule, K, int(b), context) for b in set(blocks)}
        seconds.append(costs.prefill_seconds(int(p)) + sum(per_block[b] for b in blocks))
    return np.array(seconds, dtype=float)


def _ar_seconds(costs: CallCosts, prompt_tokens: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
    context = prompt_tokens + new_tokens // 2
    prefill = np.array([costs.prefill_seconds(int(p), with_draft=False) for p in prompt_tokens])
    return prefill + (new_tokens - 1) * np.array([costs.ar_token_seconds(int(c)) for c in context])


def cell_agreement(cells: pd.DataFrame, records: pd.DataFrame, costs: CallCosts,
                   prediction: SpeedupPrediction | None = None) -> pd.DataFrame:
    """One row per timed cell with a comparable speed-up: measured and predicted speed-ups with 95 % intervals
    (prompts resampled; the prediction's from the replay's replicates of its (rule, K, L, T, dataset) when it was
    replayed) and each prediction's error (predicted / measured - 1)."""
    rng = np.random.default_rng(SEED)
    timed = _timed_records(records)
    as_replayed = _replayed_variants(cells)
    comparable = set(cells["cell_id"] if "speedup_comparable" not in cells
                     else cells.loc[cells["speedup_comparable"].astype(bool), "cell_id"])
    rows = []
    for cell_id, part in timed.groupby("cell_id", sort=False):
        if cell_id not in comparable:
            continue
        cell = cells[cells["cell_id"] == cell_id].iloc[0]
        rule, K, L, T = base_method(str(cell["method"])), int(cell["K"]), int(cell["L"]), float(cell["temperature"])
        if cell["method"] not in as_replayed:
            continue  # an option variant (e.g. the release's bf16 arithmetic): not the rule the replay runs
        wall, ar = part["wall_time_s"].to_numpy(float), part["ar_wall_time_s"].to_numpy(float)
        prompt_tokens = part["prompt_tokens"].to_numpy(int)
        new_tokens = part["new_tokens"].to_numpy(int)
        measured = ar.sum() / wall.sum()
        low, high = _ratio_interval(ar, wall, rng)
        ar_predicted = _ar_seconds(costs, prompt_tokens, new_tokens)
        own = ar_predicted.sum() / _own_calls_seconds(costs, rule, K, L, part).sum()
        row = {"cell_id": cell_id, "method": rule, "K": K, "L": L, "temperature": T, "dataset": cell["dataset"],
               "prompts": len(part), "new_tokens": int(new_tokens.sum()), "measured": measured,
               "measured_low": low, "measured_high": high, "predicted": np.nan, "predicted_low": np.nan,
               "predicted_high": np.nan, "predicted_own_calls": own, "error": np.nan,
               "error_own_calls": own / measured - 1}
        replayed = _replayed_tokens_per_call(prediction, cell, rule, K, L, T)
        if replayed is not None:
            estimate, samples = replayed
            values = [_replay_speedup(costs, rule, K, L, prompt_tokens, new_tokens, ar_predicted.sum(), v)
                      for v in (estimate, *np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]))]
            row.update(predicted=values[0], predicted_low=min(values[1:]), predicted_high=max(values[1:]))
            row["error"] = row["predicted"] / measured - 1
        rows.append(row)
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def _replay_speedup(costs: CallCosts, rule: str, K: int, L: int, prompt_tokens: np.ndarray,
                    new_tokens: np.ndarray, ar_seconds: float, tokens_per_call: float) -> float:
    """AR's predicted seconds over the rule's for these prompts, at the calls ``tokens_per_call`` needs."""
    expected = np.array([calls_to_emit(int(n), tokens_per_call) for n in new_tokens])
    return float(ar_seconds / _prompt_seconds(costs, rule, K, L, prompt_tokens, new_tokens, expected).sum())


def _replayed_tokens_per_call(prediction, cell, rule, K, L, T) -> tuple[float, np.ndarray] | None:
    """The replay's tokens per call for the cell's (rule, K, L, T, dataset) and their replicates (from the
    speed-up replicates, which are tokens per call times a constant per dataset and noise: divided back)."""
    if prediction is None:
        return None
    table = prediction.table
    rows = table[(table["model_pair"] == cell.get("model_pair")) & (table["temperature"] == T)
                 & (table["dataset"] == cell["dataset"]) & (table["method"] == rule) & (table["K"] == K)
                 & (table["L"] == L)]
    if rows.empty:
        return None
    row = rows.iloc[0]
    samples = prediction.samples((rule, K, L), str(cell["dataset"]), (row["model_pair"], T))
    scale = row["ar_seconds_per_token"] / row["seconds_per_call"]
    return float(row["tokens_per_call"]), samples / scale


def agreement_summary(agreement: pd.DataFrame, column: str = "error") -> dict[str, float] | None:
    """Median and worst |error| of a column of :func:`cell_agreement` (None when no cell has it)."""
    if column not in agreement:
        return None
    errors = agreement[column].dropna().abs()
    if errors.empty:
        return None
    return {"cells": int(len(errors)), "median": float(errors.median()), "worst": float(errors.max())}


def time_breakdown(cells: pd.DataFrame, records: pd.DataFrame, costs: CallCosts, K: int, L: int) -> pd.DataFrame:
    """Per method at the main setting (K drafts, single-draft rules at K = 1; L) and AR: milliseconds per generated
    token in prefill, draft, target, verify and other, measured (the timed cells' engine sections, summed over
    their datasets) and predicted (the cost model at the cells' own calls and prompts)."""
    timed = _timed_records(records)
    replayed = _replayed_variants(cells)
    rows = []
    for method, group in cells.groupby("method", sort=False):
        rule = base_method(str(method))
        if method not in replayed or rule == "ar":
            continue
        single = rule in VERIFIERS and VERIFIERS[rule].single_draft
        part = group[(group["K"] == (1 if single else K)) & (group["L"] == L)]
        prompts = timed[timed["cell_id"].isin(part["cell_id"])]
        if part.empty or prompts.empty:
            continue
        tokens = float(prompts["new_tokens"].sum())
        split = {s: float(np.nansum(part.get(f"time_{s}_s", pd.Series(dtype=float)))) for s in
                 ("prefill", *SECTIONS[:3], "total")}
        measured = {"prefill": split["prefill"], **{s: split[s] for s in SECTIONS[:3]}}
        measured["other"] = split["total"] - sum(measured.values())
        rows.append({"method": rule, "K": 1 if single else K, "L": L, "source": "measured",
                     **{s: 1e3 * v / tokens for s, v in measured.items()}})
        rows.append({"method": rule, "K": 1 if single else K, "L": L, "source": "predicted",
                     **_predicted_split(costs, rule, 1 if single else K, L, prompts)})
        ar = {"prefill": 0.0, "draft": 0.0, "verify": 0.0}
        prompt_tokens, new_tokens = prompts["prompt_tokens"].to_numpy(int), prompts["new_tokens"].to_numpy(int)
        ar_sections = [costs.ar_token_sections(int(p + n // 2)) for p, n in zip(prompt_tokens, new_tokens)]
        ar["prefill"] = sum(costs.prefill_seconds(int(p), with_draft=False) for p in prompt_tokens)
        ar["target"] = sum((n - 1) * s["target"] for n, s in zip(new_tokens, ar_sections))
        ar["other"] = sum((n - 1) * s["other"] for n, s in zip(new_tokens, ar_sections))
        rows.append({"method": "ar", "K": 0, "L": 0, "source": f"predicted (prompts of {rule})",
                     **{s: 1e3 * v / tokens for s, v in ar.items()}})
    frame = pd.DataFrame(rows, columns=["method", "K", "L", "source", "prefill", *SECTIONS])
    ar_rows = frame[frame["method"] == "ar"]
    frame = frame[frame["method"] != "ar"]
    if not ar_rows.empty:
        average = ar_rows[["prefill", *SECTIONS]].mean()
        frame = pd.concat([pd.DataFrame([{"method": "ar", "K": 0, "L": 0, "source": "predicted", **average}]),
                           frame], ignore_index=True)
    return frame


def _predicted_split(costs: CallCosts, rule: str, K: int, L: int, prompts: pd.DataFrame) -> dict[str, float]:
    totals = dict.fromkeys(("prefill", *SECTIONS), 0.0)
    tokens = float(prompts["new_tokens"].sum())
    for p, n, calls, blocks in zip(prompts["prompt_tokens"], prompts["new_tokens"], prompts["target_calls"],
                                   prompts.get("block_lengths", pd.Series([None] * len(prompts)))):
        blocks = list(blocks) if isinstance(blocks, (list, tuple, np.ndarray)) and len(blocks) else [L] * int(calls)
        totals["prefill"] += costs.prefill_seconds(int(p))
        for block in blocks:
            sections = costs.call_sections(rule, K, int(block), int(p + n // 2))
            for section in SECTIONS:
                totals[section] += sections[section]
    return {key: 1e3 * value / tokens for key, value in totals.items()}


__all__ = ["AGREEMENT_COLUMNS", "AVERAGE", "agreement_summary", "cell_agreement", "time_breakdown"]
