"""Context length and output position, from the shared-block replay's blocks (files only).

- Input length: the replay's groups whose dataset config fixes its input length (a long-input bucket,
  ``conf/dataset/longcode_<n>k.yaml``) are the buckets; every rule's tokens per target call in each bucket, with
  the replay's own prompt-clustered intervals (:func:`spectr_repro.analysis.replay.summary`) and its paired
  differences against the release and SD on the same blocks (:func:`~spectr_repro.analysis.replay.differences`).
  The buckets of one pool draw the same repositories, so the change of a rule's gain over SD from the shortest to
  the longest bucket is paired by repository too (:func:`gain_change`).
- Output position: a block's ``output_position`` is the number of tokens the trajectory generated before it (older
  records: the sum of the earlier blocks' ``reference_tokens``). Blocks are binned by it (``POSITION_BINS``) and
  every rule's tokens per call is given per bin, intervals over prompts (datasets weighed alike).
- Per-position acceptance by output position: where a (rule, K) was replayed at every L = 1 .. m, the gain of
  drafting position i is T(L=i) - T(L=i-1) (T(0) = 1): for a token-by-token rule (SD) exactly P(the first i
  drafts are accepted), for a block rule the expected tokens position i adds. Its mean over the blocks of a bin.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from spectr_repro.analysis.format import AVERAGE
from spectr_repro.analysis.replay import GROUP_KEYS, differences, summary
from spectr_repro.analysis.stats import RESAMPLES, bootstrap_sums, mean_of_ratios, paired_comparison
from spectr_repro.cost.model import chunked_prefill_seconds  # re-exported: the one prefill price
from spectr_repro.data import bucket_tokens
from spectr_repro.verify import VERIFIERS

POSITION_BINS = (0, 64, 256, 1024)  # tokens already generated: [0, 64), [64, 256), [256, 1024), [1024, ...)
PROMPT_KEYS = [*GROUP_KEYS, "dataset", "prompt_id"]


def position_label(low: int, high: int | None) -> str:
    return f"{low}-{high}" if high is not None else f"{low}+"


def bucket_blocks(blocks: pd.DataFrame) -> pd.DataFrame:
    """The blocks of the replay's long-input buckets, with their ``input_tokens`` (the bucket's length)."""
    if blocks.empty:
        return blocks.assign(input_tokens=pd.Series(dtype=int))
    sizes = {name: bucket_tokens(str(name)) for name in blocks["dataset"].unique()}
    kept = blocks[blocks["dataset"].map(sizes).notna()].copy()
    kept["input_tokens"] = kept["dataset"].map(sizes).astype(int)
    return kept


def by_input_length(blocks: pd.DataFrame, resamples: int = RESAMPLES) -> pd.DataFrame:
    """Tokens per call of every (rule, K, L) per bucket with its interval over prompts, shortest bucket first."""
    buckets = bucket_blocks(blocks)
    if buckets.empty:
        return pd.DataFrame()
    table = summary(buckets, resamples)
    table = table[table["dataset"] != AVERAGE].copy()  # an average over input lengths answers nothing here
    lengths = buckets.groupby("dataset")["input_tokens"].first()
    measured = buckets.groupby("dataset")["prompt_tokens"].median()
    table["input_tokens"] = table["dataset"].map(lengths).astype(int)
    table["prompt_tokens_median"] = table["dataset"].map(measured)
    return table.sort_values(["input_tokens", "method", "K", "L"], kind="stable").reset_index(drop=True)


def differences_by_input_length(blocks: pd.DataFrame, resamples: int = RESAMPLES) -> pd.DataFrame:
    """Every rule against the release and SD in each bucket, paired on the same blocks."""
    buckets = bucket_blocks(blocks)
    if buckets.empty:
        return pd.DataFrame()
    diffs = differences(buckets, resamples=resamples)
    diffs = diffs[diffs["dataset"] != AVERAGE].copy()
    diffs["input_tokens"] = diffs["dataset"].map(buckets.groupby("dataset")["input_tokens"].first()).astype(int)
    return diffs.sort_values(["input_tokens", "method", "K", "L"], kind="stable").reset_index(drop=True)


def _prompt_sums(blocks: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    return blocks.groupby([*keys, "prompt_id"], sort=False).agg(tokens=("tokens", "sum"),
                                                                blocks=("tokens", "size")).reset_index()


def gain_change(blocks: pd.DataFrame, method: str, K: int, L: int, comparator: str = "sd",
                resamples: int = RESAMPLES) -> dict | None:
    """How ``method`` at (K, L)'s gain over ``comparator`` (at K=1 when it drafts one row) changes from the shortest
    to the longest bucket: (gain at the longest) - (gain at the shortest), paired over the repositories present in
    both (the buckets of one pool share them); None when fewer than two buckets or no repository in both."""
    buckets = bucket_blocks(blocks)
    if buckets.empty or buckets["input_tokens"].nunique() < 2:
        return None
    other_K = 1 if VERIFIERS[comparator].single_draft else K
    shortest, longest = buckets["input_tokens"].min(), buckets["input_tokens"].max()
    sums = {}
    for name, (rule, rows) in (("a", (method, K)), ("b", (comparator, other_K))):
        part = buckets[(buckets["method"] == rule) & (buckets["K"] == rows) & (buckets["L"] == L)]
        sums[name] = _prompt_sums(part, ["input_tokens"]).set_index(["input_tokens", "prompt_id"])
    prompts = sorted(set.intersection(*[{p for (t, p) in frame.index if t == size} for frame in sums.values()
                                        for size in (shortest, longest)]))
    if not prompts:
        return None

    def columns(size):
        a = sums["a"].loc[[(size, p) for p in prompts]]
        b = sums["b"].loc[[(size, p) for p in prompts]]
        return a["tokens"].to_numpy(), a["blocks"].to_numpy(), b["tokens"].to_numpy(), b["blocks"].to_numpy()

    short, long = columns(shortest), columns(longest)
    # (gain long) - (gain short) = [R(a, long) - R(b, long)] - [R(a, short) - R(b, short)]: a difference of two
    # paired differences, resampled jointly over the repositories (one stratum: the same prompts throughout).

    stacked = [np.vstack([*long, *short]).astype(float)]

    def statistic(strata):
        s = strata[0]
        return (s[0] / s[1] - s[2] / s[3]) - (s[4] / s[5] - s[6] / s[7])

    interval = bootstrap_sums(stacked, statistic, resamples=resamples)
    at = {size: paired_comparison([columns(size)], "difference", resamples=resamples) for size in (shortest,
                                                                                                    longest)}
    return {"method": method, "K": K, "L": L, "comparator": comparator, "comparator_K": other_K,
            "shortest": int(shortest), "longest": int(longest), "gain_shortest": at[shortest].estimate,
            "gain_longest": at[longest].estimate, "change": interval.estimate, "ci_low": interval.low,
            "ci_high": interval.high, "prompts": len(prompts)}


def position_bins(positions: pd.Series, edges: Sequence[int] = POSITION_BINS) -> pd.Series:
    """The bin label of each output position (the last bin is open)."""
    edges = list(edges)
    labels = [position_label(low, high) for low, high in zip(edges, [*edges[1:], None])]
    index = np.searchsorted(np.asarray(edges[1:]), positions.to_numpy(), side="right")
    return pd.Series([labels[i] for i in index], index=positions.index)


def by_output_position(blocks: pd.DataFrame, edges: Sequence[int] = POSITION_BINS,
                       resamples: int = RESAMPLES) -> pd.DataFrame:
    """Tokens per call of every (rule, K, L) per bin of tokens already generated, with its interval over prompts
    (datasets weighed alike, as the replay's average); bins without blocks are left out."""
    if blocks.empty:
        return pd.DataFrame()
    frame = blocks.assign(position=position_bins(blocks["output_position"], edges))
    order = {label: i for i, label in enumerate(position_bins(pd.Series(list(edges)), edges))}
    rows = []
    keys = [*GROUP_KEYS, "method", "K", "L", "position"]
    for key, cell in frame.groupby(keys, sort=False):
        sums = _prompt_sums(cell, ["dataset"])
        strata = [(part["tokens"], part["blocks"]) for _, part in sums.groupby("dataset", sort=False)]
        interval = mean_of_ratios(strata, resamples=resamples)
        rows.append({**dict(zip(keys, key)), "blocks": len(cell), "prompts": len(sums),
                     "tokens_per_call": interval.estimate, "ci_low": interval.low, "ci_high": interval.high})
    table = pd.DataFrame(rows)
    table["bin"] = table["position"].map(order)
    return table.sort_values(["method", "K", "L", "bin"], kind="stable").drop(columns="bin").reset_index(drop=True)


def acceptance_by_output_position(blocks: pd.DataFrame, edges: Sequence[int] = POSITION_BINS) -> pd.DataFrame:
    """Per (rule, K) replayed at every L = 1 .. m and bin of output position: the mean gain of each draft position
    i, T(L=i) - T(L=i-1) with T(0) = 1 (columns ``position_1`` .. ``position_m``), over the bin's blocks."""
    if blocks.empty:
        return pd.DataFrame()
    rows = []
    frame = blocks.assign(position=position_bins(blocks["output_position"], edges))
    block_keys = [*PROMPT_KEYS, "iteration"]
    for (pair, temperature, method, K), cell in frame.groupby([*GROUP_KEYS, "method", "K"], sort=False):
        lengths = sorted(cell["L"].unique())
        if lengths != list(range(1, len(lengths) + 1)) or len(lengths) < 2:
            continue  # needs L = 1, 2, ..., m
        wide = cell.pivot_table(index=[*block_keys, "position"], columns="L", values="tokens", aggfunc="first")
        wide = wide.dropna()
        gains = wide.diff(axis=1)
        gains[lengths[0]] = wide[lengths[0]] - 1.0
        gains = gains[lengths].rename(columns={n: f"position_{n}" for n in lengths})
        means = gains.groupby(level="position", sort=False).mean()
        counts = gains.groupby(level="position", sort=False).size()
        for position, values in means.iterrows():
            rows.append({"model_pair": pair, "temperature": temperature, "method": method, "K": K,
                         "position": position, "blocks": int(counts[position]), **values.to_dict()})
    if not rows:
        return pd.DataFrame()
    order = {label: i for i, label in enumerate(position_bins(pd.Series(list(edges)), edges))}
    table = pd.DataFrame(rows)
    table["bin"] = table["position"].map(order)
    return table.sort_values(["method", "K", "bin"], kind="stable").drop(columns="bin").reset_index(drop=True)


__all__ = ["POSITION_BINS", "acceptance_by_output_position", "bucket_blocks", "by_input_length",
           "by_output_position", "chunked_prefill_seconds", "differences_by_input_length", "gain_change",
           "position_bins", "position_label"]
