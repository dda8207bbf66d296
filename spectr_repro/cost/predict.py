"""The fastest lossless configuration on this machine, predicted from a replay and the calibrated costs.

A replay (``python -m spectr_repro replay``, ``replay_summary.csv``) measures, for every (rule, K, L), the
tokens each target call yields (block efficiency, with a confidence interval). The one cost model says what a
call costs here (``spectr_repro.cost.model.CallCosts``: the forwards, the rule's call, each engine section's
overhead). Their ratio is the decoding speed:

    tokens per second = tokens per call / seconds per call

and, when a prompt length and a completion length are given, the prompt's prefill through both models is
charged to the completion's tokens, as a measured tokens/s (the bench's) charges it, and so is the last call,
cut at the length (``calls_to_emit``: half a block more than length / tokens per call). The interval of the
prediction is the replay's interval of tokens per call carried through (the costs are taken as exact).
Only lossless rules (``VERIFIERS[name].lossless``) are candidates: a faster rule that changes the target's
distribution is not a configuration anyone should pick.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from spectr_repro.cost.model import CallCosts, calls_to_emit
from spectr_repro.verify import VERIFIERS

REPLAY_COLUMNS = ("method", "K", "L", "blocks", "prompts", "tokens_per_call", "ci_low", "ci_high")


def read_replay_summary(path: str | Path, filters: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """A replay summary CSV, one row per (method, K, L) after ``filters`` (column -> value, e.g.
    temperature=0.7); ValueError naming what is missing or what is left ambiguous."""
    path = Path(path)
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the replay summary {path}: {error}") from None
    missing = [column for column in REPLAY_COLUMNS if column not in table.columns]
    if missing:
        raise ValueError(f"replay summary {path} lacks the column(s) {', '.join(missing)} "
                         f"(expected at least {', '.join(REPLAY_COLUMNS)})")
    for column, value in (filters or {}).items():
        if column not in table.columns:
            raise ValueError(f"replay summary {path} has no column {column!r} to select {column}={value!r}")
        table = table[table[column].astype(str) == str(value)]
    duplicated = table[table.duplicated(["method", "K", "L"], keep=False)]
    if not duplicated.empty:
        others = [c for c in table.columns if c not in REPLAY_COLUMNS and table[c].nunique() > 1]
        raise ValueError(f"replay summary {path}: several rows per (method, K, L), e.g. "
                         f"{duplicated.iloc[0][['method', 'K', 'L']].tolist()}; select one with "
                         f"{' / '.join(others) or 'a filter'}")
    if table.empty:
        raise ValueError(f"replay summary {path}: no rows left" + (f" after {dict(filters)}" if filters else ""))
    return table.reset_index(drop=True)


def predict_tokens_per_s(summary: pd.DataFrame, costs: CallCosts, prompt_tokens: int | None = None,
                         new_tokens: int | None = None) -> pd.DataFrame:
    """Predicted tokens/s (and its interval) of every lossless (method, K, L) of ``summary``, fastest first.

    ``prompt_tokens`` and ``new_tokens`` (both or neither): charge each completion of ``new_tokens`` tokens
    with the prefill of a ``prompt_tokens``-token prompt through target and draft.
    """
    if (prompt_tokens is None) != (new_tokens is None):
        raise ValueError("give prompt_tokens and new_tokens together (or neither)")
    lossless = summary[[bool(VERIFIERS[m].lossless) if m in VERIFIERS else False for m in summary["method"]]]
    prefill = 0.0 if prompt_tokens is None else costs.prefill_seconds(prompt_tokens)
    context = None if prompt_tokens is None else prompt_tokens + new_tokens // 2  # a call's mean context
    rows = []
    for row in lossless.itertuples(index=False):
        K, L = int(row.K), int(row.L)
        call = costs.call_seconds(str(row.method), K, L, context)

        def rate(tokens_per_call: float, call: float = call) -> float:
            if new_tokens is None:
                return tokens_per_call / call
            return new_tokens / (prefill + calls_to_emit(new_tokens, tokens_per_call) * call)

        rows.append({"method": row.method, "K": K, "L": L, "tokens_per_call": float(row.tokens_per_call),
                     "seconds_per_call": call, "tokens_per_s": rate(float(row.tokens_per_call)),
                     "tokens_per_s_low": rate(float(row.ci_low)), "tokens_per_s_high": rate(float(row.ci_high))})
    columns = ["method", "K", "L", "tokens_per_call", "seconds_per_call", "tokens_per_s", "tokens_per_s_low",
               "tokens_per_s_high"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("tokens_per_s", ascending=False, kind="stable").reset_index(drop=True)


def best_configuration(predictions: pd.DataFrame) -> dict[str, Any]:
    """The fastest predicted lossless configuration (a row of ``predict_tokens_per_s``) as a dict."""
    if predictions.empty:
        raise ValueError("no lossless configuration in the replay summary to choose from")
    best = predictions.loc[predictions["tokens_per_s"].idxmax()]
    return {key: (value.item() if hasattr(value, "item") else value) for key, value in best.items()}


def describe_best(best: Mapping[str, Any]) -> str:
    return (f"fastest lossless configuration predicted: {best['method']} K={best['K']} L={best['L']}, "
            f"{best['tokens_per_s']:.2f} tok/s ({best['tokens_per_s_low']:.2f}-{best['tokens_per_s_high']:.2f}, "
            f"from {best['tokens_per_call']:.2f} tokens per call at {1e3 * best['seconds_per_call']:.0f} ms per call)")


__all__ = ["REPLAY_COLUMNS", "best_configuration", "describe_best", "predict_tokens_per_s", "read_replay_summary"]
