"""``python -m spectr_repro theory`` and ``python -m spectr_repro audit``.

theory: on a few seeded toy pairs, the exact E[tau] of every rule for K = 1..4, whether its per-iteration
law is valid as is, the LP limit of any valid rule, the paper's bound and GBV's value; GBV's whole-generation
tokens per call against BV's; and which of the paper's claimed properties hold. Writes THEORY.md,
theory.csv, generation.csv and theory.png under --out (default results/theory).

audit: the losslessness audit of every registered rule (spectr_repro.theory.audit), the release's arithmetic
of spectr_gbv, and the peers (transformers' assisted generation, spectr_repro.theory.peers). Writes AUDIT.md
and audit.json under --out (default results/audit).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectr_repro.theory import audit as audit_mod
from spectr_repro.theory.bounds import gbv_value, paper_bound
from spectr_repro.theory.exact import expected_accepted_length, iteration_law
from spectr_repro.theory.gap import DEFAULT_MAX_TUPLES, GAP_RULES, gap_markdown, gap_rows, gap_toys
from spectr_repro.theory.generation import generation_efficiency
from spectr_repro.theory.lp import optimal_expected_accepted, optimal_expected_accepted_nodes
from spectr_repro.theory.validity import check_validity
from spectr_repro.verify import VERIFIERS, get_verifier

# From the one method registry (spectr_repro.verify.VERIFIERS).
THEORY_RULES = tuple(name for name, spec in VERIFIERS.items() if spec.in_theory)
LOSSLESS_AS_IS = tuple(name for name in THEORY_RULES if VERIFIERS[name].lossless_as_is)  # no carried state
LP_MAX_DRAFT_SETS = 5000  # beyond this the LP takes minutes on 2 cores (see theory.lp)
VALIDITY_TOLERANCE = 1e-9


@dataclass(frozen=True)
class TheoryToy:
    vocab_size: int
    L: int
    seed: int

    def label(self) -> str:
        return f"V={self.vocab_size}, L={self.L}, seed={self.seed}"


FULL_THEORY_TOYS = (TheoryToy(3, 2, 0), TheoryToy(3, 2, 1), TheoryToy(2, 3, 0))
QUICK_THEORY_TOYS = (TheoryToy(2, 2, 0),)


def lp_draft_sets(vocab_size: int, L: int, K: int) -> int:
    n = vocab_size**L
    return sum(math.comb(n, k) for k in range(1, min(K, n) + 1))


def theory_rows(toys: Sequence[TheoryToy], Ks: Sequence[int], progress=print) -> pd.DataFrame:
    """Long table: one row per (toy, K, quantity) with value, valid_as_is and seconds."""
    from spectr_repro.toy import toy_pair

    rows = []
    for toy in toys:
        target, draft = toy_pair(toy.vocab_size, toy.seed)
        base = {"toy": toy.label(), "V": toy.vocab_size, "L": toy.L, "seed": toy.seed}
        for K in Ks:
            for rule in THEORY_RULES:
                if VERIFIERS[rule].single_draft and K != 1:
                    continue
                start = time.perf_counter()
                law = iteration_law(get_verifier(rule), target, draft, K, toy.L)
                report = check_validity(law, target, toy.L, tolerance=VALIDITY_TOLERANCE)
                rows.append(
                    {
                        **base,
                        "K": K,
                        "quantity": rule,
                        "value": expected_accepted_length(law),
                        "valid_as_is": report.valid,
                        "validity_violation": max(-report.min_residual, report.max_terminal_residual),
                        "seconds": time.perf_counter() - start,
                    }
                )
            result = optimal_expected_accepted_nodes(target, draft, K, toy.L)
            rows.append(
                {
                    **base,
                    "K": K,
                    "quantity": "lp_optimum",
                    "value": result.value,
                    "valid_as_is": check_validity(result.law, target, toy.L, tolerance=1e-7).valid,
                    "validity_violation": float("nan"),
                    "seconds": result.seconds,
                }
            )
            if lp_draft_sets(toy.vocab_size, toy.L, K) <= LP_MAX_DRAFT_SETS:  # the draft-set LP, as a cross-check
                sets = optimal_expected_accepted(target, draft, K, toy.L)
                rows.append({**base, "K": K, "quantity": "lp_optimum_draft_sets", "value": sets.value,
                             "valid_as_is": None, "validity_violation": float("nan"), "seconds": sets.seconds})
            start = time.perf_counter()
            rows.append(
                {
                    **base,
                    "K": K,
                    "quantity": "paper_bound",
                    "value": paper_bound(target, draft, K, toy.L),
                    "valid_as_is": None,
                    "validity_violation": float("nan"),
                    "seconds": time.perf_counter() - start,
                }
            )
            if K == 1:
                rows.append(
                    {
                        **base,
                        "K": K,
                        "quantity": "gbv_value",
                        "value": gbv_value(target, draft, toy.L),
                        "valid_as_is": None,
                        "validity_violation": float("nan"),
                        "seconds": 0.0,
                    }
                )
            if progress:
                progress(f"theory: {toy.label()} K={K} done")
    return pd.DataFrame(rows)


def generation_rows(toys: Sequence[TheoryToy], N: int, progress=print) -> pd.DataFrame:
    from spectr_repro.toy import toy_pair

    rows = []
    for toy in toys:
        target, draft = toy_pair(toy.vocab_size, toy.seed)
        for rule in ("sd", "bv", "gbv"):
            start = time.perf_counter()
            g = generation_efficiency(rule, target, draft, 1, toy.L, N)
            rows.append(
                {
                    "toy": toy.label(),
                    "rule": rule,
                    "K": 1,
                    "L": toy.L,
                    "N": N,
                    "first_iteration_accepted": g.first_iteration_accepted,
                    "first_iteration_block_efficiency": g.first_iteration_accepted + 1,
                    "tokens_per_call": g.tokens_per_call,
                    "mean_block_efficiency": g.mean_block_efficiency,
                    "accepted_per_iteration_whole_generation": g.later_iteration_accepted,
                    "seconds": time.perf_counter() - start,
                }
            )
        if progress:
            progress(f"generation: {toy.label()} N={N} done")
    return pd.DataFrame(rows)


def _value(df: pd.DataFrame, toy: str, K: int, quantity: str) -> float | None:
    hit = df[(df.toy == toy) & (df.K == K) & (df.quantity == quantity)]
    return float(hit.value.iloc[0]) if len(hit) else None


def property_checks(
    df: pd.DataFrame,
    gen: pd.DataFrame | None = None,
    big_K: int = 64,
) -> list[tuple[str, str, str]]:
    """(claim, verdict, evidence) for the paper's properties, from the theory table."""
    from spectr_repro.toy import toy_pair

    out = []
    toys = list(dict.fromkeys(df.toy))
    Ks = sorted(set(df.K))
    # = GBV at K=1.
    gaps = [abs(_value(df, t, 1, "spectr_gbv") - _value(df, t, 1, "gbv_value")) for t in toys]
    gaps_rule = [abs(_value(df, t, 1, "spectr_gbv") - _value(df, t, 1, "gbv")) for t in toys]
    ok = max(gaps) < 1e-9 and max(gaps_rule) < 1e-9
    out.append(
        (
            "SpecTr-GBV at K=1 equals GBV",
            "holds" if ok else "FAILS",
            f"max abs(E[tau] spectr_gbv(K=1) - sum min(P,Q)) = {max(gaps):.1e}, "
            f"vs the gbv rule {max(gaps_rule):.1e}; "
            "but both are NOT valid as is (validity check), GBV needs its carry-over",
        )
    )
    # Monotone in K.
    drops = []
    for t in toys:
        values = [_value(df, t, K, "spectr_gbv") for K in Ks]
        drops += [
            (t, Ks[i], values[i] - values[i + 1])
            for i in range(len(Ks) - 1)
            if values[i + 1] < values[i] - 1e-12
        ]
    out.append(
        (
            "E[tau] of SpecTr-GBV non-decreasing in K",
            "holds" if not drops else "FAILS",
            "no decrease"
            if not drops
            else "; ".join(f"{t}: K={k}->{k + 1} drops by {d:.4f}" for t, k, d in drops),
        )
    )
    # -> L as K -> infinity.
    evidence = []
    for t in toys:
        row = df[df.toy == t].iloc[0]
        target, draft = toy_pair(int(row.V), int(row.seed))
        L = int(row.L)
        kmax = max(Ks)
        evidence.append(
            f"{t}: spectr_gbv K=1..{kmax} = "
            + ", ".join(f"{_value(df, t, K, 'spectr_gbv'):.3f}" for K in Ks)
            + f"; bound at K={big_K} = {paper_bound(target, draft, big_K, L):.3f} (L={L})"
        )
    out.append(("E[tau] -> L as K -> infinity", "trend only (finite K)", "; ".join(evidence)))
    # Optimality: the bound vs the LP limit of valid rules, and vs what the rule reaches.
    above_lp, below_lp, attained = [], [], []
    for t in toys:
        for K in Ks:
            bound, lp, rule = (_value(df, t, K, q) for q in ("paper_bound", "lp_optimum", "spectr_gbv"))
            if lp is not None:
                (above_lp if bound > lp + 1e-9 else below_lp).append(
                    f"{t} K={K}: bound {bound:.4f} vs LP {lp:.4f}"
                )
            attained.append((t, K, rule >= bound - 1e-9, rule - bound))
    out.append(
        (
            "SpecTr-GBV attains the paper's bound (its claimed optimum)",
            "holds"
            if all(a[2] for a in attained)
            else f"FAILS in {sum(not a[2] for a in attained)} of {len(attained)} cases",
            "attained at K = "
            + (", ".join(sorted({str(K) for _, K, ok, _ in attained if ok})) or "none")
            + "; largest shortfall "
            + "{:.4f} ({} K={})".format(*min(((gap, t, K) for t, K, _, gap in attained), key=lambda x: x[0]))
            + " (the release is not valid as is at any K: `*` in the tables)",
        )
    )
    out.append(
        (
            "The paper's bound is an upper limit for valid rules",
            "FAILS" if below_lp else "holds",
            f"above the LP limit of any valid rule used as is in {len(above_lp)} cases (e.g. "
            f"{above_lp[0] if above_lp else '-'}), BELOW it in {len(below_lp)} (e.g. "
            f"{below_lp[0] if below_lp else '-'}): valid rules can beat the 'optimal' value, and the "
            "value is not reachable by valid rules where it is above",
        )
    )
    # Lossless rules never exceed the LP.
    exceed = []
    for t in toys:
        for K in Ks:
            lp = _value(df, t, K, "lp_optimum")
            for rule in LOSSLESS_AS_IS:
                v = _value(df, t, K, rule)
                if lp is not None and v is not None and v > lp + 1e-7:
                    exceed.append(f"{t} K={K} {rule} {v:.4f} > LP {lp:.4f}")
    out.append(
        (
            "Every rule valid as is stays below the LP limit (sanity)",
            "holds" if not exceed else "FAILS",
            "; ".join(exceed) or "no rule above the LP",
        )
    )
    gaps = [abs(_value(df, t, K, "lp_optimum") - _value(df, t, K, "lp_optimum_draft_sets"))
            for t in toys for K in Ks if _value(df, t, K, "lp_optimum_draft_sets") is not None]
    if gaps:
        out.append(
            (
                "The node LP and the draft-set LP give the same limit (sanity)",
                "holds" if max(gaps) < 1e-7 else "FAILS",
                f"max abs difference {max(gaps):.1e} over {len(gaps)} (toy, K)",
            )
        )
    if gen is not None and not gen.empty:
        per_toy = gen.pivot_table(
            index="toy",
            columns="rule",
            values=["first_iteration_accepted", "tokens_per_call"],
            aggfunc="first",
        )
        first_better = per_toy["first_iteration_accepted"]["gbv"] > per_toy["first_iteration_accepted"]["bv"]
        whole_better = per_toy["tokens_per_call"]["gbv"] > per_toy["tokens_per_call"]["bv"]
        N = int(gen.N.iloc[0])
        calls = per_toy["tokens_per_call"]
        out.append(
            (
                f"GBV (K=1, lossless with carry-over) beats BV: per iteration / over N={N} tokens",
                f"{int(first_better.sum())}/{len(first_better)} toys / {int(whole_better.sum())}/"
                f"{len(whole_better)} toys",
                "tokens per target call gbv vs bv: "
                + "; ".join(f"{t}: {calls['gbv'][t]:.4f} vs {calls['bv'][t]:.4f}" for t in per_toy.index),
            )
        )
    return out


def _md(df: pd.DataFrame, floatfmt: str = ".4f") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt)


def write_figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    toys = list(dict.fromkeys(df.toy))
    fig, axes = plt.subplots(1, len(toys), figsize=(5.2 * len(toys), 4.2), squeeze=False)
    styles = {
        "lp_optimum": dict(color="black", lw=2.2, marker="s"),
        "paper_bound": dict(color="black", ls="--", marker="x"),
    }
    for ax, toy in zip(axes[0], toys):
        sub = df[df.toy == toy]
        for quantity in (*THEORY_RULES, "lp_optimum", "paper_bound"):
            points = sub[sub.quantity == quantity].sort_values("K")
            if points.empty:
                continue
            label = {
                "lp_optimum": "LP limit (any valid rule)",
                "paper_bound": "paper's bound",
                "gbv": "gbv (valid only with carry-over)",
                "spectr_gbv": "spectr_gbv (release, not lossless)",
            }.get(quantity, quantity)
            if len(points) == 1 and quantity in ("sd", "bv", "gbv"):
                ax.axhline(points.value.iloc[0], ls=":", lw=1, color=f"C{THEORY_RULES.index(quantity)}")
                ax.plot(
                    points.K,
                    points.value,
                    "o",
                    label=f"{label} (K=1, single draft)",
                    color=f"C{THEORY_RULES.index(quantity)}",
                )
                continue
            style = (
                styles[quantity]
                if quantity in styles
                else dict(marker="o", color=f"C{THEORY_RULES.index(quantity)}")
            )
            ax.plot(points.K, points.value, label=label, **style)
        ax.axhline(int(sub.L.iloc[0]), color="grey", lw=0.8)
        ax.set_title(toy)
        ax.set_xlabel("K (drafts)")
        ax.set_ylabel("E[accepted tokens per iteration]")
        ax.set_xticks(sorted(set(sub.K)))
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_theory(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro theory", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("--out", default="results/theory", help="output folder (default results/theory)")
    parser.add_argument("--quick", action="store_true", help="one small toy, K <= 3, N = 4 (for tests)")
    parser.add_argument("--max-k", type=int, default=None, help="largest K (default 4, quick 3)")
    parser.add_argument(
        "--generation-tokens",
        type=int,
        default=None,
        help="N for the whole-generation comparison (default 6, quick 4)",
    )
    parser.add_argument("--gap", action="store_true",
                        help="instead: the share of the SpecTr->LP gap of every lossless multi-draft rule on the "
                             "broad toy set (V 2-4, L 2-3, K 2-3, seeds 0-2), written to GAP.md and gap.csv")
    parser.add_argument("--cache", default=None, help="--gap: JSON file caching exact values between runs")
    parser.add_argument("--max-tuples", type=int, default=DEFAULT_MAX_TUPLES,
                        help=f"--gap: skip toys with more draft tuples V^(K L) (default {DEFAULT_MAX_TUPLES})")
    args = parser.parse_args(list(argv or []))
    if args.gap:
        return _main_gap(args)
    max_k = args.max_k if args.max_k is not None else (3 if args.quick else 4)
    N = args.generation_tokens if args.generation_tokens is not None else (4 if args.quick else 6)
    if not 1 <= max_k <= 6:
        print(f"error: --max-k must be in 1..6 (exact enumeration is V^(K L)), got {max_k}", file=sys.stderr)
        return 2
    if not 1 <= N <= 8:
        print(f"error: --generation-tokens must be in 1..8 (exact enumeration), got {N}", file=sys.stderr)
        return 2
    toys = QUICK_THEORY_TOYS if args.quick else FULL_THEORY_TOYS
    start = time.perf_counter()
    df = theory_rows(toys, list(range(1, max_k + 1)))
    gen = generation_rows(toys, N)
    checks = property_checks(df, gen)
    elapsed = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "theory.csv", index=False)
    gen.to_csv(out / "generation.csv", index=False)
    write_figure(df, out / "theory.png")
    (out / "THEORY.md").write_text(theory_markdown(df, gen, checks, elapsed, N))
    print(f"theory: wrote {out / 'THEORY.md'} ({elapsed:.0f} s)")
    return 0


def _main_gap(args) -> int:
    start = time.perf_counter()
    toys = gap_toys(seeds=(0,)) if args.quick else gap_toys()
    df = gap_rows(toys, cache=Path(args.cache) if args.cache else None, max_tuples=args.max_tuples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "gap.csv", index=False)
    (out / "GAP.md").write_text(gap_markdown(df) + f"\n{len(df)} toys listed in {time.perf_counter() - start:.0f} s.\n")
    print(f"theory: wrote {out / 'GAP.md'}")
    return 0


def _gap_closed(rule: float, spectr: float, lp: float) -> str:
    """(rule - spectr) / (lp - spectr) as a percentage; '—' where undefined (no gap, or a missing value)."""
    if any(pd.isna(v) for v in (rule, spectr, lp)) or lp - spectr < 1e-9:
        return "—"
    return f"{100 * (rule - spectr) / (lp - spectr):.0f} %"


def theory_markdown(df: pd.DataFrame, gen: pd.DataFrame, checks, elapsed: float, N: int) -> str:
    lines = [
        "# Theory on toy models: exact E[accepted], the LP limit, the paper's bound",
        "",
        "Exact expected accepted draft tokens per iteration E[tau] (block efficiency = E[tau] + 1) on seeded "
        "toy pairs (spectr_repro.toy: context-dependent Dirichlet conditionals; the draft mixes the target "
        "with an independent toy). Rules: exact per-iteration laws (every draft tuple enumerated, draws "
        "integrated). `LP limit`: the best E[tau] of ANY verifier valid as is (docs/methods.md, \"The limit any "
        "valid rule obeys\"; scipy HiGHS). `paper's bound`: sum_i sum_{x^i} P(x^i)[1 - (1 - min(1, Q/P))^K]. "
        "`gbv_value` = sum_i sum min(P, Q). A `*` marks a rule whose per-iteration law FAILS the "
        "validity check (R >= 0, R = 0 at length L+1, tolerance 1e-9): it is not lossless used as is.",
        "",
    ]
    for toy in dict.fromkeys(df.toy):
        sub = df[df.toy == toy]
        table = raw = sub.pivot_table(index="quantity", columns="K", values="value", aggfunc="first")
        invalid = set(sub[(sub.valid_as_is == False)].quantity)  # noqa: E712 (None = not applicable)
        order = [q for q in (*THEORY_RULES, "lp_optimum", "paper_bound", "gbv_value") if q in table.index]
        table = table.loc[order]
        table.index = [f"{q} *" if q in invalid else q for q in order]
        table.columns = [f"K={k}" for k in table.columns]
        table = table.map(lambda v: "—" if pd.isna(v) else f"{v:.4f}")
        for rule in GAP_RULES:
            if rule != "spectr" and {rule, "spectr", "lp_optimum"} <= set(order):
                table.loc[f"{rule}: share of the spectr→LP gap closed"] = [
                    _gap_closed(*(raw.loc[q, k] for q in (rule, "spectr", "lp_optimum"))) for k in raw.columns
                ]
        lines += [
            f"## {toy}",
            "",
            table.reset_index(names="rule").to_markdown(index=False, disable_numparse=True),
            "",
        ]
    lines += [
        "Single-draft rules (sd, bv, gbv) are shown at K=1 only.",
        "",
        "## The paper's properties",
        "",
        "| claim | verdict | evidence |",
        "|---|---|---|",
    ]
    lines += [f"| {c} | {v} | {e} |" for c, v, e in checks]
    lines += [
        "",
        f"## GBV over a whole generation of N = {N} tokens (K = 1, exact)",
        "",
        "GBV with its carry-over is lossless across iterations, but after a correction the carried target "
        "lowers later acceptance. `first_iteration_block_efficiency` = E[tau] + 1 of the first iteration; "
        "`tokens_per_call` = N / E[target calls to emit N tokens] (last block truncated, as the engine "
        "does); `mean_block_efficiency` = E[N / calls].",
        "",
        _md(gen.drop(columns=["K", "seconds"])),
        "",
    ]
    lp = df[df.quantity == "lp_optimum"]
    lines += [
        "## Sizes and timings",
        "",
        f"Whole command: {elapsed:.0f} s on {platform.machine()} ({platform.python_version()}). "
        f"LP solve times here: "
        + ", ".join(f"{r.toy} K={r.K}: {r.seconds:.2f} s" for r in lp.itertuples())
        + ".",
        "The limit comes from the node LP (one variable per node of the draft tree, antichain constraints as "
        "cuts; V=4 L=3 K=3 in seconds). The draft-set LP is solved beside it as a cross-check where it has at "
        f"most {LP_MAX_DRAFT_SETS} draft sets; measured earlier on 2 shared CPU cores (draft sets = distinct "
        "draft sets of size <= K): V=3 L=2 K<=4 and V=2 L=3 K<=4: < 0.1 s; V=4 L=2 K=3 (696 sets): 0.4 s; "
        "V=4 L=3 K=2 (2,080 sets): 3 s; V=3 L=3 K=3 (3,303 sets, 86k variables): 6 s; V=4 L=2 K=4 (2,516 "
        "sets): 10 s (HiGHS presolve fails on it, solved without); V=3 L=3 K=4 (20,853 sets, 666k "
        "variables): 8 min.",
        "",
    ]
    return "\n".join(lines)


def release_arithmetic_markdown(rows) -> list[str]:
    """spectr_gbv under the release's arithmetic beside the float64 replica, per K."""
    chosen = [r for r in rows if r.rule == "spectr_gbv" and set(r.options) <= {"arithmetic"}]
    if not any(r.options for r in chosen):
        return []
    largest: dict[str, float] = {}
    for r in chosen:
        if r.options:
            name = r.options["arithmetic"]
            largest[name] = max(largest.get(name, 0.0), r.exact_tv_vs_default)
    table = pd.DataFrame(
        [
            {
                "K": r.K,
                "arithmetic": r.options.get("arithmetic", "float64 (replica)"),
                "exact TV to target (per toy)": " / ".join(f"{t['exact_tv']:.4f}" for t in r.toys),
                "exact TV to the float64 replica (per toy)": (
                    " / ".join(f"{t['exact_tv_vs_default']:.1e}" for t in r.toys) if r.options else "0"
                ),
                "MC p (vs own law)": f"{r.p_value_vs_law:.2g}",
            }
            for r in sorted(chosen, key=lambda r: (r.K, bool(r.options), str(r.options)))
        ]
    )
    return [
        "## The release's arithmetic (spectr_gbv `arithmetic=release_*`)",
        "",
        "The released code keeps its probability rows in the model dtype (float16 by default) but computes every "
        "product, ratio, power, sum and h in float32 (its m_s, m_b, eps and one are float32 tensors; torch "
        "promotes the half rows to them). `release_fp16` / `release_bf16` / `release_fp32` round the rows to that "
        "dtype and repeat the release's float32 operations in its order; the float64 replica is the default. "
        "Exact laws as above (drafts from the toy's float64 q, as our engine draws them from float32 rows). "
        "Largest exact TV to the float64 replica's law, over K and toys: "
        + ", ".join(f"{name} {value:.1e}" for name, value in largest.items())
        + " (the TV to the target is the rule's own bias, ~1e-2 to 1e-1). Where float32 does matter: a block "
        "whose draft probability Q < 2^-25 makes 1 - (1 - Q)^K = 0, and the release then accepts it whenever "
        "P(...) > 1e-20 (tests/verify/test_spectr_gbv.py); on these toys (V^L <= 9 blocks) such blocks carry "
        "less than 9 * 2^-25 < 3e-7 of the draft's mass, on a 150k vocabulary far more. Block efficiency "
        "on a real pair: run `python -m spectr_repro run method=spectr_gbv +method.options.arithmetic=release_fp16` "
        "beside the default; REPORT.md shows such cells as variants.",
        "",
        table.to_markdown(index=False),
        "",
    ]


def peers_markdown(peer_rows) -> list[str]:
    """The peer rows: transformers' assisted generation, its power, its negative control, its first iteration."""
    if not peer_rows:
        return []
    from spectr_repro.theory import peers as peers_mod

    table = pd.DataFrame(
        [
            {
                "peer": f"{r.peer} ({r.setting})",
                "samples": r.num_samples,
                "MC p (vs target)": f"{r.p_value:.2g}",
                "MC TV (noise)": f"{r.mc_tv:.3f} ({r.expected_mc_tv:.3f})",
                "detectable TV": f"{r.detectable_tv:.3f}",
                "power vs known biases": "; ".join(f"{b['label']} (TV {b['exact_tv']:.3f}): {b['power']:.2f}"
                                                   for b in r.reference_biases),
                "first iteration: mean tau vs SD exact (draft at T / T^2)": _first_iteration_cell(r.first_iteration),
                "verdict": r.verdict,
                "flags": "; ".join(r.flags),
            }
            for r in peer_rows
        ]
    )
    control = [r for r in peer_rows if r.is_control]
    control_lines = [
        f"Negative control ({r.setting}): exact TV {r.exact_tv:.3f} to the target; MC p {r.p_value:.2g} vs the "
        f"target, {r.p_value_vs_own_law:.2g} vs its own exact law -> {r.verdict}."
        for r in control
    ]
    return [
        "## Peers: transformers' assisted generation",
        "",
        f"`target.generate(assistant_model=draft, do_sample=True)` on a {peer_rows[0].pair} (spectr_repro.tiny; "
        "the target's law of the first tokens enumerated from one batched forward). `MC p`: Pearson chi-square "
        f"of the first {peer_rows[0].law_tokens} tokens over independent calls against the target's exact law "
        f"(threshold {peers_mod.ALPHA:g}). `detectable TV`: every bias whose TV over the test's bins is at "
        f"least this is detected with >= {peers_mod.POWER:.0%} power, whatever its direction (lambda >= 4 N TV^2, "
        "noncentral chi-square). `power vs known biases`: simulated power of the same test at the same N against "
        "the exact laws of known biased rules on the same pair. First iteration (recorded by a streamer): mean "
        "accepted length and its SE against SD's exact expectation with the draft at temperature T and at T^2; "
        "`matches` says which exact first-iteration law the counts fit.",
        "",
        "Finding: the decoded law shows no bias, but transformers' assistant samples its drafts at temperature "
        "T^2, not T: the candidate generator passes the main model's prepared logits processors (holding "
        "TemperatureLogitsWarper(T)) to the assistant's generate, whose _get_logits_processor merges them in and "
        "then appends its own TemperatureLogitsWarper(T) (transformers generation/utils.py, _get_logits_processor; "
        "candidate_generator.py, AssistedCandidateGenerator). The acceptance test uses the same twice-tempered "
        "scores, so it is still exact speculative sampling (lossless) but with a sharper draft: its block "
        "efficiency is not SD's at equal T. Workaround (checked in `workaround_*`): temperature=1 and "
        "logits_processor=[TemperatureLogitsWarper(T)].",
        "",
        table.to_markdown(index=False),
        "",
        *control_lines,
        "",
    ]


def _first_iteration_cell(first) -> str:
    if not first:
        return ""
    squared = first["draft_at_T_squared"]
    cell = (f"L={first['L']}: {first['mean_tau']:.3f} ± {first['se']:.3f} vs {first['exact_mean_tau']:.3f} "
            f"(z {first['z']:.1f}, p {first['p_value_outcome_law']:.2g}) / {squared['exact_mean_tau']:.3f} "
            f"(z {squared['z']:.1f}, p {squared['p_value_outcome_law']:.2g})")
    if "matches" in first:
        cell += f"; matches {first['matches']}"
    if "control_own_law" in first:
        own = first["control_own_law"]
        cell += f"; own exact law {own['exact_mean_tau']:.3f} (p {own['p_value_outcome_law']:.2g})"
    return cell


def audit_markdown(rows, quick: bool, elapsed: float, peer_rows=()) -> str:
    toys = audit_mod.QUICK_TOYS if quick else audit_mod.FULL_TOYS
    table = pd.DataFrame(
        [
            {
                "rule": r.rule,
                "options": ", ".join(f"{k}={v}" for k, v in r.options.items()) or "default",
                "K": r.K,
                "exact TV": f"{r.exact_tv:.1e}",
                "per toy": " / ".join(f"{t['exact_tv']:.1e}" for t in r.toys),
                "MC p (vs target)": f"{r.p_value:.2g}",
                "MC TV": f"{r.mc_tv:.3f}",
                "MC p (vs own law)": f"{r.p_value_vs_law:.2g}",
                "TV vs defaults": "" if r.exact_tv_vs_default is None else f"{r.exact_tv_vs_default:.1e}",
                "verdict": r.verdict,
                "authors claim lossless": "yes" if r.claimed_lossless else "no",
                "flags": "; ".join(r.flags),
            }
            for r in rows
        ]
    )
    n, samples = rows[0].n_tokens, rows[0].num_samples
    return "\n".join(
        [
            "# Losslessness audit of every verification rule",
            "",
            f"Joint law of the first {n} decoded tokens across iterations (carried state threaded), on toy "
            f"pairs {', '.join(t.label() for t in toys)} (context-dependent Dirichlet conditionals). `exact "
            "TV`: total variation between the rule's exact decoded law (every draft tuple enumerated, draws "
            "integrated) and the target's, max over toys (`per toy`: each toy's, in the order listed). "
            f"`MC`: {samples} decoded sequences through the "
            "rule's real sampler on the first toy, Pearson chi-square "
            "(bins with expected count < 5 merged) against the target and against the rule's own exact law "
            "(the latter must pass for every rule: it checks that the sampler implements the audited law).",
            "",
            f"Verdict: **lossless** iff exact TV < {audit_mod.EXACT_TV_THRESHOLD:g} "
            "(float64 round-off is ~1e-16). "
            f"MC p-values below {audit_mod.P_VALUE_THRESHOLD:g} are flagged. A low MC power (small TV, few "
            "samples) can leave a biased rule unflagged by MC; the exact TV is the verdict.",
            "",
            table.to_markdown(index=False),
            "",
            *release_arithmetic_markdown(rows),
            *peers_markdown(peer_rows),
            f"{len(rows)} rule checks and {len(peer_rows)} peer checks in {elapsed:.0f} s "
            f"({'--quick' if quick else 'full'}).",
            "",
        ]
    )


def main_audit(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro audit",
        description="losslessness audit of every registered verification rule",
    )
    parser.add_argument("--out", default="results/audit", help="output folder (default results/audit)")
    parser.add_argument("--quick", action="store_true", help="one small toy, 1,500 MC samples")
    parser.add_argument("--rules", default=None, help="comma list of rules (default: all registered)")
    parser.add_argument("--samples", type=int, default=None, help="MC samples (default 5,000; quick 1,500)")
    parser.add_argument("--tokens", type=int, default=3, help="decoded tokens in the joint law (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-peers", action="store_true",
                        help="skip the peer audit (transformers' assisted generation on a tiny Llama pair)")
    args = parser.parse_args(list(argv or []))
    rules = None if args.rules is None else [r.strip() for r in args.rules.split(",") if r.strip()]
    if rules is not None:
        unknown = [r for r in rules if r not in VERIFIERS]
        if unknown or not rules:
            print(f"error: unknown rules {unknown}; known: {', '.join(VERIFIERS)}", file=sys.stderr)
            return 2
    if not 1 <= args.tokens <= 5 or (args.samples is not None and args.samples < 0):
        print("error: --tokens must be in 1..5 and --samples >= 0", file=sys.stderr)
        return 2
    start = time.perf_counter()

    def progress(row):
        print(
            f"audit: {row.rule} K={row.K} {row.options or ''} exact TV {row.exact_tv:.1e} "
            f"p {row.p_value:.2g} -> {row.verdict} ({row.seconds:.1f} s)",
            flush=True,
        )

    rows = audit_mod.run_audit(
        quick=args.quick,
        rules=rules,
        n_tokens=args.tokens,
        num_samples=args.samples,
        seed=args.seed,
        progress=progress,
    )
    peer_rows = []
    if not args.no_peers:
        from spectr_repro.theory import peers

        def peer_progress(row):
            print(f"audit: peer {row.setting}: MC p {row.p_value:.2g} -> {row.verdict} "
                  f"{'; '.join(row.flags)} ({row.seconds:.1f} s)", flush=True)

        peer_rows = peers.audit_peers(quick=args.quick, progress=peer_progress)
    elapsed = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "quick": args.quick,
        "seconds": elapsed,
        "exact_tv_threshold": audit_mod.EXACT_TV_THRESHOLD,
        "p_value_threshold": audit_mod.P_VALUE_THRESHOLD,
        "rows": [r.to_json() for r in rows],
        "peers": [r.to_json() for r in peer_rows],
    }
    (out / "audit.json").write_text(json.dumps(payload, indent=1, default=float))
    (out / "AUDIT.md").write_text(audit_markdown(rows, args.quick, elapsed, peer_rows))
    print(f"audit: wrote {out / 'AUDIT.md'} ({elapsed:.0f} s)")
    return 0
