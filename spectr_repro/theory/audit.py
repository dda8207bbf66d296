"""Losslessness audit of every registered verification rule, across iterations, on toy models.

For each rule (and option variant) and K, on seeded toy pairs whose conditionals depend on the whole
context (spectr_repro.theory.toy):
- exact: the joint law of the first n decoded tokens across iterations (state threaded, every draft
  tuple enumerated, the rule's draws integrated by ``verifier.law``) vs the target's law -> TV. No
  sampling noise: a lossless rule gives float64 round-off (~1e-16);
- Monte Carlo through the rule's real sampler (``sample_decoded``): chi-square p-value against the target
  (does the sampler look lossless?) and against the rule's own exact law (does the sampler implement the
  law we audited? this must pass for every rule, lossless or not), plus the empirical TV.

Option variants also get ``exact_tv_vs_default``: the exact TV between their decoded law and that of the same
rule with default options (e.g. how far the release's half-precision arithmetic moves spectr_gbv's law from the
float64 replica's).

Verdict: "lossless" iff the exact TV < EXACT_TV_THRESHOLD = 1e-9 on every toy (round-off is ~1e-16, the
smallest bias any audited rule shows is > 1e-4, so the threshold separates them by orders of magnitude).
A Monte-Carlo p-value below P_VALUE_THRESHOLD = 1e-4 is flagged: against the target it is a detected bias,
against the rule's own law it means sampler and law disagree (a bug). With fixed seeds and ~20 checks, a
false flag at 1e-4 has probability ~2e-3.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from spectr_repro.theory.lawcheck import chi_square_test, total_variation
from spectr_repro.theory.toy import ToySpec, exact_decoded_law, sample_decoded, target_law
from spectr_repro.verify import VERIFIERS, Verifier, get_verifier
from spectr_repro.verify.thresholds import ALPHA, EXACT_TV

EXACT_TV_THRESHOLD = EXACT_TV  # the verdict's threshold (verify.thresholds)
P_VALUE_THRESHOLD = ALPHA  # the Monte-Carlo flag's threshold (verify.thresholds)

# Option variants audited besides each rule's defaults: the releases' and ablations' switches (spectr_gbv's
# arithmetic: the release's own float32 arithmetic on rows rounded to float16 / bfloat16 / float32).
EXTRA_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "gbv": [{"carry_over": False}],
    "spectr_gbv": [{"carry_over": True}, {"arithmetic": "release_fp16"}, {"arithmetic": "release_bf16"},
                   {"arithmetic": "release_fp32"}],
    "sbv": [{"count_posterior": False}],  # sbv with greedy selection is MP-BV, audited as `mpbv`
    "sbvf": [{"selection": "mixture"}],  # rho for the count mixture, greedy point included (docs/theory.md)
    # hsd: the release's EAGLE-3H cap; the capped last test (which makes it BV, the lossless reading)
    "hsd": [{"cap": "joint_min"}, {"final_test": "capped"}],
    # hsd_rrs: each of the release's two changes alone (both together are `hsd_rrs_release`)
    "hsd_rrs": [{"final_test": "joint"}, {"prefix": "carried"}],
}


QUICK_TOYS = (ToySpec(2, 2, 0),)
FULL_TOYS = (ToySpec(3, 2, 0), ToySpec(2, 3, 1))


@dataclass
class AuditRow:
    rule: str
    K: int
    options: dict
    exact_tv: float  # max over toys
    p_value: float  # MC vs target, first toy
    mc_tv: float  # empirical TV vs target, first toy
    p_value_vs_law: float  # MC vs the rule's own exact decoded law, first toy
    expected_mc_tv: float  # TV expected from sampling noise alone
    verdict: str  # "lossless" | "NOT lossless"
    claimed_lossless: bool  # the rule's authors' claim
    harness_lossless: bool  # what the harness states for this rule and options (Verifier.lossless)
    flags: list[str]
    n_tokens: int
    num_samples: int
    seconds: float
    toys: list[dict] = field(default_factory=list)
    exact_tv_vs_default: float | None = None  # option variants: max over toys of TV to the default options' law

    def to_json(self) -> dict:
        return asdict(self)


def variants(rules: Sequence[str] | None = None) -> list[tuple[str, dict]]:
    """(rule, options) pairs audited: each registered rule's defaults, then its extra variants."""
    names = list(VERIFIERS) if rules is None else list(rules)
    out = []
    for name in names:
        if name not in VERIFIERS:
            raise ValueError(f"unknown rule {name!r}; known: {', '.join(VERIFIERS)}")
        out.append((name, {}))
        out.extend((name, dict(options)) for options in EXTRA_VARIANTS.get(name, []))
    return out


def audit_verifier(
    verifier: Verifier,
    K: int,
    toys: Sequence[ToySpec],
    n_tokens: int,
    num_samples: int,
    seed: int = 0,
    rule: str | None = None,
    options: dict | None = None,
    claimed_lossless: bool | None = None,
    exact_laws: Sequence[dict] | None = None,
    reference_laws: Sequence[dict] | None = None,
) -> AuditRow:
    """Audit one verifier instance (registered or not, e.g. a deliberately broken one in a test).

    exact_laws: the verifier's exact decoded laws per toy when already computed (see ``exact_laws``);
    reference_laws: laws per toy to report the TV to (``exact_tv_vs_default``).
    """
    if not toys:
        raise ValueError("need at least one toy")
    start = time.perf_counter()
    if exact_laws is None:
        exact_laws = decoded_laws(verifier, K, toys, n_tokens)
    toy_rows, mc = _toy_rows(verifier, K, toys, n_tokens, num_samples, seed, exact_laws, reference_laws)
    exact_tv = max(row["exact_tv"] for row in toy_rows)
    verdict = "lossless" if exact_tv < EXACT_TV_THRESHOLD else "NOT lossless"
    nan = float("nan")
    p_value = mc[0].p_value if mc else nan
    p_value_vs_law = mc[1].p_value if mc else nan
    flags = []
    if mc and p_value < P_VALUE_THRESHOLD:
        flags.append("MC detects bias vs target")
    if mc and p_value_vs_law < P_VALUE_THRESHOLD:
        flags.append("SAMPLER DISAGREES WITH ITS EXACT LAW")
    harness_lossless = bool(getattr(verifier, "lossless", False))
    if harness_lossless and verdict != "lossless":
        flags.append("HARNESS CALLS THIS RULE LOSSLESS")
    return AuditRow(
        rule=rule or getattr(verifier, "name", type(verifier).__name__),
        K=K,
        options=dict(options or {}),
        exact_tv=exact_tv,
        p_value=p_value,
        mc_tv=mc[0].tv if mc else nan,
        p_value_vs_law=p_value_vs_law,
        expected_mc_tv=mc[0].expected_tv if mc else nan,
        verdict=verdict,
        claimed_lossless=bool(
            getattr(verifier, "claimed_lossless", True) if claimed_lossless is None else claimed_lossless
        ),
        harness_lossless=harness_lossless,
        flags=flags,
        n_tokens=n_tokens,
        num_samples=num_samples,
        seconds=time.perf_counter() - start,
        toys=toy_rows,
        exact_tv_vs_default=(max(row["exact_tv_vs_default"] for row in toy_rows)
                             if reference_laws is not None else None),
    )


def _toy_rows(verifier: Verifier, K: int, toys: Sequence[ToySpec], n_tokens: int, num_samples: int, seed: int,
              exact_laws: Sequence[dict], reference_laws: Sequence[dict] | None):
    """Per toy: the exact TV to the target (and to ``reference_laws``); on the first toy also the Monte-Carlo
    checks, returned as (vs target, vs own exact law), or None without samples."""
    toy_rows = []
    mc = None
    for index, (toy, exact) in enumerate(zip(toys, exact_laws, strict=True)):
        target, draft = toy.pair()
        truth = target_law(target, n_tokens)
        toy_row = {
            "toy": toy.label(),
            "exact_tv": total_variation(exact, truth),
            "exact_mass": sum(exact.values()),
        }
        if reference_laws is not None:
            toy_row["exact_tv_vs_default"] = total_variation(exact, reference_laws[index])
        if index == 0 and num_samples > 0:
            counts = sample_decoded(verifier, target, draft, K, toy.L, n_tokens, num_samples, seed)
            vs_target = chi_square_test(counts, truth)
            vs_law = chi_square_test(counts, exact)
            mc = (vs_target, vs_law)
            toy_row.update(p_value=vs_target.p_value, mc_tv=vs_target.tv, p_value_vs_law=vs_law.p_value)
        toy_rows.append(toy_row)
    return toy_rows, mc


def decoded_laws(verifier: Verifier, K: int, toys: Sequence[ToySpec], n_tokens: int) -> list[dict]:
    """The verifier's exact law of the first ``n_tokens`` decoded tokens on each toy."""
    out = []
    for toy in toys:
        target, draft = toy.pair()
        out.append(exact_decoded_law(verifier, target, draft, K, toy.L, n_tokens))
    return out


def run_audit(
    quick: bool = False,
    rules: Sequence[str] | None = None,
    Ks: Sequence[int] = (1, 2, 3),
    n_tokens: int = 3,
    num_samples: int | None = None,
    seed: int = 0,
    progress=None,
) -> list[AuditRow]:
    """Audit every (rule, options) variant at every K (single-draft rules at K=1 only)."""
    toys = QUICK_TOYS if quick else FULL_TOYS
    if num_samples is None:
        num_samples = 1500 if quick else 5000
    rows = []
    default_laws: dict[tuple[str, int], list[dict]] = {}  # (rule, K) -> exact laws with default options
    for name, options in variants(rules):
        spec = VERIFIERS[name]
        for K in Ks:
            if spec.single_draft and K != 1:
                continue
            verifier = get_verifier(name, **options)
            start = time.perf_counter()
            laws = decoded_laws(verifier, K, toys, n_tokens)
            if not options:
                default_laws[name, K] = laws
            elif (name, K) not in default_laws:
                default_laws[name, K] = decoded_laws(get_verifier(name), K, toys, n_tokens)
            row = audit_verifier(
                verifier,
                K,
                toys,
                n_tokens,
                num_samples,
                seed,
                rule=name,
                options=options,
                claimed_lossless=spec.claimed_lossless,
                exact_laws=laws,
                reference_laws=default_laws[name, K] if options else None,
            )
            row.seconds = time.perf_counter() - start  # the exact laws included
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows
