"""How much of the SpecTr -> LP gap each lossless multi-draft rule closes, on a broad set of toys.

    python -m spectr_repro theory --gap --cache ~/.cache/spectr_repro/gap.json   # GAP.md, gap.csv

For every toy (V, L, seed) of ``toy_pair`` and every K: the exact E[tau] of one iteration of each rule (every
draft tuple enumerated, the rule's own randomness integrated) and the LP limit of any rule valid as is (the node
LP of ``theory.lp``). share = (rule - spectr) / (LP - spectr). Exact laws cost V^(K L) draft tuples each: toys
above ``max_tuples`` are skipped and listed. Values are cached by (rule, V, L, K, seed) in a JSON file when
``cache`` is given (a rule's values must be recomputed after its law changes: delete the file).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from spectr_repro.theory.exact import expected_accepted_length, iteration_law
from spectr_repro.theory.lp import optimal_expected_accepted_nodes
from spectr_repro.theory.structure import myopic_selection_limit
from spectr_repro.theory.toy import ToySpec
from spectr_repro.verify import VERIFIERS, get_verifier

BASELINE = "spectr"
# Lossless multi-draft rules used as is (their E[tau] is bounded by the LP), from the registry.
GAP_RULES = tuple(name for name, spec in VERIFIERS.items()
                  if spec.lossless_as_is and not spec.single_draft and spec.in_theory)
# Option variants shown beside the rules: column -> (rule, options). sbvf_mixture: SBV-F with rho chosen for the count
# mixture BV sees (verify/mixture_rho.py), at least MP-BV and SBV-F on every toy computed (docs/theory.md).
GAP_VARIANTS: dict[str, tuple[str, dict]] = {"sbvf_mixture": ("sbvf", {"selection": "mixture"})}
DEFAULT_MAX_TUPLES = 50_000
MYOPIC_MAX_TUPLES = 5_000  # the myopic-selection LP enumerates tuples too, with many more variables


def gap_toys(vocab_sizes: Sequence[int] = (2, 3, 4), lengths: Sequence[int] = (2, 3), drafts: Sequence[int] = (2, 3),
             seeds: Sequence[int] = (0, 1, 2)) -> list[ToySpec]:
    """The cross product (the headline set of docs/sbvf.md)."""
    return [ToySpec(V, L, s, K=K) for V, L, K, s in itertools.product(vocab_sizes, lengths, drafts, seeds)]


def _load(cache: Path | None) -> dict:
    return json.loads(cache.read_text()) if cache is not None and cache.exists() else {}


def _store(cache: Path | None, values: dict) -> None:
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(values, indent=0, sort_keys=True))
        tmp.replace(cache)


def gap_rows(toys: Sequence[ToySpec], rules: Sequence[str] = GAP_RULES, cache: Path | None = None,
             max_tuples: int = DEFAULT_MAX_TUPLES, progress: Callable[[str], None] | None = print) -> pd.DataFrame:
    """One row per toy with the E[tau] of each rule, the LP and each rule's share of the gap (NaN if skipped)."""
    values = _load(cache)
    rows = []
    for toy in toys:
        row = {"V": toy.vocab_size, "L": toy.L, "K": toy.K, "seed": toy.seed, "skipped": toy.tuples > max_tuples}
        if row["skipped"]:
            rows.append(row)
            continue
        target, draft = toy.pair()
        extras = ("myopic_limit",) if toy.tuples <= MYOPIC_MAX_TUPLES else ()
        variants = tuple(name for name, (rule, _) in GAP_VARIANTS.items() if rule in rules)
        for quantity in (*rules, *variants, "lp_optimum", *extras):
            key = f"{quantity}|{toy.key()}"
            if key not in values:
                start = time.perf_counter()
                if quantity == "lp_optimum":
                    value = optimal_expected_accepted_nodes(target, draft, toy.K, toy.L).value
                elif quantity == "myopic_limit":
                    value = myopic_selection_limit(target, draft, toy.K, toy.L)
                else:  # a rule, or an option variant of one
                    rule, options = GAP_VARIANTS.get(quantity, (quantity, {}))
                    value = expected_accepted_length(iteration_law(get_verifier(rule, **options), target, draft,
                                                                   toy.K, toy.L))
                values[key] = value
                _store(cache, values)
                if progress:
                    progress(f"gap: {quantity} {toy.key()} = {value:.6f} ({time.perf_counter() - start:.0f} s)")
            row[quantity] = values[key]
        gap = row["lp_optimum"] - row[BASELINE]
        for rule in (*rules, *variants, *extras):
            row[f"share_{rule}"] = (row[rule] - row[BASELINE]) / gap if gap > 1e-9 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def gap_markdown(df: pd.DataFrame, rules: Sequence[str] = GAP_RULES) -> str:
    done = df[~df.skipped]
    rules = [*rules, *(name for name in GAP_VARIANTS if name in df and name not in rules)]
    skipped = ", ".join(f"V={r.V} L={r.L} K={r.K} seed={r.seed}" for r in df[df.skipped].itertuples())
    others = [r for r in rules if r != BASELINE]
    if "myopic_limit" in done:
        others.append("myopic_limit")
    lines = [
        "# Share of the SpecTr -> LP gap closed by each lossless multi-draft rule",
        "",
        "Exact E[accepted draft tokens] per iteration (block efficiency - 1) on `toy_pair(V, seed)` toys, every "
        "draft tuple enumerated; `LP` = the best any rule valid as is can do (node LP, theory.lp). "
        "share = (rule - SpecTr) / (LP - SpecTr); toys where LP - SpecTr < 1e-9 have no share. "
        "`myopic_limit` (toys with at most 5,000 draft tuples): the best E[tau] of BV on a path selected depth by "
        "depth, each token chosen from the tokens up to its depth (theory.structure) -- no rule of SBV's kind "
        "can pass it.",
        "",
        f"Toys: {len(done)} (V, L, K, seed) computed"
        + (f"; skipped (more than the tuple limit): {skipped}" if skipped else "") + ".",
        "",
    ]
    table = done[["V", "L", "K", "seed", *rules, "lp_optimum", *(f"share_{r}" for r in others)]].copy()
    table.columns = ["V", "L", "K", "seed", *rules, "LP", *(f"share {r}" for r in others)]
    table[["V", "L", "K", "seed"]] = table[["V", "L", "K", "seed"]].astype(int)
    lines += [table.to_markdown(index=False, floatfmt=".4f"), ""]
    summary = []
    for rule in others:
        shares = done[f"share_{rule}"].dropna()
        summary.append({"rule": rule, "toys": len(shares), "mean share": shares.mean(), "min": shares.min(),
                        "max": shares.max(), "toys above sbv": int((done[rule] > done["sbv"] + 1e-12).sum())
                        if "sbv" in done else None})
    lines += ["## Summary", "", pd.DataFrame(summary).to_markdown(index=False, floatfmt=".3f"), ""]
    by_cell = done.groupby(["V", "L", "K"])[[f"share_{r}" for r in others]].mean().reset_index()
    by_cell.columns = ["V", "L", "K", *(f"mean share {r}" for r in others)]
    by_cell[["V", "L", "K"]] = by_cell[["V", "L", "K"]].astype(int)
    lines += ["## Mean share per (V, L, K)", "", by_cell.to_markdown(index=False, floatfmt=".3f"), ""]
    return "\n".join(lines)
