"""The markdown of ``theory`` (THEORY.md) and ``audit`` (AUDIT.md), from the rows the computations return."""

from __future__ import annotations

import platform

import pandas as pd

from spectr_repro.theory import audit as audit_mod
from spectr_repro.theory import peers as peers_mod
from spectr_repro.theory.claims import LP_MAX_DRAFT_SETS, THEORY_RULES
from spectr_repro.theory.gap import GAP_RULES
from spectr_repro.verify.thresholds import EXACT_TV


def _md(df: pd.DataFrame, floatfmt: str = ".4f") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt)


# --------------------------------------------------------------------------------------------------
# THEORY.md


def theory_markdown(df: pd.DataFrame, gen: pd.DataFrame, checks, elapsed: float, N: int) -> str:
    lines = [
        "# Theory on toy models: exact E[accepted], the LP limit, the paper's bound",
        "",
        "Exact expected accepted draft tokens per iteration E[tau] (block efficiency = E[tau] + 1) on seeded "
        "toy pairs (spectr_repro.theory.toy: context-dependent Dirichlet conditionals; the draft mixes the target "
        "with an independent toy). Rules: exact per-iteration laws (every draft tuple enumerated, draws "
        "integrated). `LP limit`: the best E[tau] of ANY verifier valid as is (docs/methods.md, \"The limit any "
        "valid rule obeys\"; scipy HiGHS). `paper's bound`: sum_i sum_{x^i} P(x^i)[1 - (1 - min(1, Q/P))^K]. "
        "`gbv_value` = sum_i sum min(P, Q). A `*` marks a rule whose per-iteration law FAILS the "
        "validity check (R >= 0, R = 0 at length L+1, tolerance 1e-9): it is not lossless used as is.",
        "",
    ]
    for toy in dict.fromkeys(df.toy):
        lines += [f"## {toy}", "", toy_table(df[df.toy == toy]), ""]
    lines += [
        "Single-draft rules (sd, bv, gbv) are shown at K=1 only.",
        "",
        *_claims_lines(checks),
        "",
        *_generation_lines(gen, N),
        *_timing_lines(df, elapsed),
    ]
    return "\n".join(lines)


def toy_table(sub: pd.DataFrame) -> str:
    """One toy's E[tau] per quantity and K (`*`: not valid as is), and each rule's share of the spectr→LP gap."""
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
    return table.reset_index(names="rule").to_markdown(index=False, disable_numparse=True)


def _gap_closed(rule: float, spectr: float, lp: float) -> str:
    """(rule - spectr) / (lp - spectr) as a percentage; '—' where undefined (no gap, or a missing value)."""
    if any(pd.isna(v) for v in (rule, spectr, lp)) or lp - spectr < EXACT_TV:
        return "—"
    return f"{100 * (rule - spectr) / (lp - spectr):.0f} %"


def _claims_lines(checks) -> list[str]:
    return [
        "## The paper's properties",
        "",
        "| claim | verdict | evidence |",
        "|---|---|---|",
        *(f"| {c} | {v} | {e} |" for c, v, e in checks),
    ]


def _generation_lines(gen: pd.DataFrame, N: int) -> list[str]:
    return [
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


def _timing_lines(df: pd.DataFrame, elapsed: float) -> list[str]:
    lp = df[df.quantity == "lp_optimum"]
    return [
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


# --------------------------------------------------------------------------------------------------
# AUDIT.md


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
        f"`target.generate(assistant_model=draft, do_sample=True)` on a {peer_rows[0].pair} (spectr_repro.models.tiny; "
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

