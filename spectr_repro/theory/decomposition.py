"""Where the released SpecTr-GBV rule's bias comes from: correct it one step at a time, exactly, on toys.

Steps (cumulative; each a named option of ``spectr_gbv`` except the last, see docs/theory.md):

  release       the authors' rule as released (``spectr_gbv`` defaults);
  clamp_h       h clamped to [0, 1] before its test (``clamp_h=True``);
  coupling      the correction P·p·(1 − c)^K, the mass the paper's conditionally independent coupling leaves at
                each token, instead of the release's P·p·(1 − c^K) (``residual="coupling"``);
  carry_over    the carry-over target threaded, frames in the same form (``carry_over=True``);
  marginal      the correction and the carried target taken from the law of the selection actually made:
                C(s) = T(s) − B(s), B(s) = P(the scan's accepted prefix runs through s) over every draft set,
                T the iteration's effective target. Not a rule a block can run (B needs every draft set's scan
                law: it is computed here by enumeration, toys only): it shows which assumption breaks.

Why ``marginal`` is lossless when B(s) ≤ T(s) for every s (checked, ``min_carried_mass``): the decoded text
runs through s either because the accepted prefix does (mass B(s)) or because an earlier stop's correction and
the carried target lead there; drawing the correction at w and every carried token after a stop from
p′(x | s) ∝ C(s·x) gives the second mass C(s) exactly, by induction on |s| (Σ_x C(s·x) = C(s) + P(stop at s)),
so the two add up to T(s); beyond the horizon L the target below applies again (GBV's carry-over argument, with
the K = 1 marginal B = min(P, Q) replaced by the scan's own). The negative control ``marginal_as_is`` keeps that
correction but carries nothing: it needs B(s·x) ≤ B(s)·p(x | s) instead, which the scan breaks.

The release's correction and carry-over assume that its scan realises the coupling's marginal
B(s) = P(s)·(1 − (1 − min(1, Q(s)/P(s)))^K). At K = 1 it does (B = min(P, Q): GBV); at K ≥ 2 it does not
(``max_coupling_gap``), and that is the bias the carry-over cannot remove.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import pandas as pd
import torch

from spectr_repro.theory.exact import iteration_outcomes
from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.theory.toy import ToyLM, ToySpec, block_tensors, draft_tuples, exact_decoded_law, target_law
from spectr_repro.verify.spectr_gbv import SpecTrGBV

Context = tuple[int, ...]

# (step, options of spectr_gbv); cumulative, in the order the table applies them.
RULE_STEPS: tuple[tuple[str, dict], ...] = (
    ("release", {}),
    ("clamp_h", {"clamp_h": True}),
    ("coupling", {"clamp_h": True, "residual": "coupling"}),
    ("carry_over", {"clamp_h": True, "residual": "coupling", "carry_over": True}),
)
# (step, carry-over, cap) of the oracle steps, then the negative control (the carry-over skipped).
ORACLE_STEPS: tuple[tuple[str, bool, bool], ...] = (
    ("marginal", True, False),
    ("capped", True, True),
    ("capped_as_is", False, True),
)
FINAL_STEP = "capped"
NEGATIVE_CONTROL = "capped_as_is"  # the last step without the carry-over: a skipped step must fail
STEPS = tuple(name for name, _ in RULE_STEPS) + tuple(name for name, _, _ in ORACLE_STEPS[:2])

DECOMPOSITION_TOYS = (ToySpec(3, 2, 0), ToySpec(2, 3, 1))  # the audit's toys (theory.audit.FULL_TOYS)
QUICK_DECOMPOSITION_TOYS = (ToySpec(2, 2, 0),)


@dataclass(frozen=True)
class CarriedLayer:
    """The target modification an iteration that began at ``start`` (absolute context) leaves for the tokens up
    to L after its start; ``below`` is the layer that was in force for that iteration (None: plain p)."""

    start: Context
    below: CarriedLayer | None


class MarginalOracle:
    """The ``marginal`` step: the release's scan (h clamped), its correction and carried target built from the
    scan's exact law over every draft set (toys only). ``carry_over=False``: the negative control."""

    def __init__(self, target: ToyLM, draft: ToyLM, K: int, L: int, carry_over: bool = True,
                 cap: bool = True) -> None:
        self.target, self.draft, self.K, self.L = target, draft, K, L
        self.carry_over, self.cap = carry_over, cap
        self.scan_rule = SpecTrGBV(clamp_h=True, check_inputs=False)
        self._conditionals: dict = {}
        self._iterations: dict = {}
        self.min_carried_mass = 0.0  # min over visited s of C(s) = T(s) − B(s) (< 0: the oracle cannot be valid)

    # --- the effective target -----------------------------------------------------------------------------

    def conditional(self, context: Context, layer: CarriedLayer | None) -> torch.Tensor:
        """Effective target [V] after the absolute ``context`` under ``layer`` (float64)."""
        key = (context, layer)
        if key not in self._conditionals:
            self._conditionals[key] = self._conditional(context, layer)
        return self._conditionals[key]

    def _conditional(self, context: Context, layer: CarriedLayer | None) -> torch.Tensor:
        if layer is None:
            return self.target.probs(context)
        relative = context[len(layer.start):]
        if len(relative) >= self.L:  # past the horizon; older layers expired earlier
            return self.conditional(context, layer.below)
        carried = self.iteration(layer.start, layer.below).carried
        weights = torch.tensor([max(carried.get(relative + (x,), 0.0), 0.0) for x in range(self.target.vocab_size)],
                               dtype=torch.float64)
        total = float(weights.sum())
        return weights / total if total > 0 else self.conditional(context, layer.below)

    # --- one iteration --------------------------------------------------------------------------------------

    def iteration(self, context: Context, layer: CarriedLayer | None) -> _Iteration:
        key = (context, layer)
        if key not in self._iterations:
            self._iterations[key] = self._iteration(context, layer)
        return self._iterations[key]

    def _iteration(self, context: Context, layer: CarriedLayer | None) -> _Iteration:
        K, L, V = self.K, self.L, self.target.vocab_size
        accepted: dict[Context, float] = {}
        for prob, tokens in draft_tuples(self.draft, context, K, L):
            draft_probs, _ = block_tensors(self.target, self.draft, context, tokens)
            rows = [tuple(int(t) for t in row) for row in tokens.tolist()]
            target_probs = torch.stack([torch.stack([self.conditional(context + r[:i], layer) for i in range(L + 1)])
                                        for r in rows])
            for (tau, selected), weight in self.scan_rule.scan_law(tokens, draft_probs, target_probs).items():
                prefix = rows[selected][:tau]
                accepted[prefix] = accepted.get(prefix, 0.0) + prob * weight
        target_mass: dict[Context, float] = {(): 1.0}
        for n in range(1, L + 2):
            for s in itertools.product(range(V), repeat=n):
                target_mass[s] = target_mass[s[:-1]] * float(self.conditional(context + s[:-1], layer)[s[-1]])
        if self.cap:
            accepted = _capped(accepted, target_mass)
        through = _through(accepted)
        carried = {s: mass - through.get(s, 0.0) for s, mass in target_mass.items() if s}
        self.min_carried_mass = min(self.min_carried_mass, *carried.values())
        return _Iteration(accepted, through, carried, target_mass)

    def outcomes(self, context: Context, layer: CarriedLayer | None) -> list[tuple[float, Context, CarriedLayer]]:
        """(probability, emitted tokens, layer for what follows) of one iteration at ``context``."""
        it = self.iteration(context, layer)
        V, L = self.target.vocab_size, self.L
        out = []
        for prefix, mass in it.accepted.items():
            if mass <= 0:
                continue
            if len(prefix) == L:
                last = self.conditional(context + prefix, layer)
            else:
                weights = torch.tensor([max(it.carried[prefix + (x,)], 0.0) for x in range(V)], dtype=torch.float64)
                total = float(weights.sum())
                last = weights / total if total > 0 else self.conditional(context + prefix, layer)
            for x, p_x in enumerate(last.tolist()):
                if p_x <= 0:
                    continue
                emitted = prefix + (x,)
                following = CarriedLayer(context, layer) if self.carry_over and len(emitted) < L else None
                following = _alive(following, context + emitted, L)
                out.append((mass * p_x, emitted, following))
        return out

    def decoded_law(self, n: int, context: Context = ()) -> dict[Context, float]:
        """Exact law of the first ``n`` decoded tokens, iterating the oracle (layers threaded)."""
        memo: dict = {}

        def recurse(ctx: Context, layer, remaining: int) -> dict[Context, float]:
            key = (ctx, layer, remaining)
            if key in memo:
                return memo[key]
            law: dict[Context, float] = {}
            for weight, emitted, following in self.outcomes(ctx, layer):
                if len(emitted) >= remaining:
                    head = emitted[:remaining]
                    law[head] = law.get(head, 0.0) + weight
                    continue
                for suffix, p in recurse(ctx + emitted, following, remaining - len(emitted)).items():
                    law[emitted + suffix] = law.get(emitted + suffix, 0.0) + weight * p
            memo[key] = law
            return law

        return recurse(tuple(context), None, n)

    def second_iteration_expected_accepted(self) -> float:
        """E[τ] of the second iteration, averaged over the first one's outcomes (layers threaded)."""
        return sum(weight * self.iteration(emitted, following).expected_accepted
                   for weight, emitted, following in self.outcomes((), None))


@dataclass
class _Iteration:
    accepted: dict[Context, float]  # law of the accepted prefix (over draft sets and the scan's uniforms)
    through: dict[Context, float]  # B(s): P(accepted prefix runs through s), |s| >= 1
    carried: dict[Context, float]  # C(s) = T(s) − B(s), |s| = 1..L+1
    target_mass: dict[Context, float]  # T(s)

    @cached_property
    def expected_accepted(self) -> float:
        return sum(mass * len(prefix) for prefix, mass in self.accepted.items())


def _through(accepted: dict[Context, float]) -> dict[Context, float]:
    """B(s) = P(the accepted prefix runs through s), |s| >= 1, from the law of the accepted prefix."""
    through: dict[Context, float] = {}
    for prefix, mass in accepted.items():
        for n in range(1, len(prefix) + 1):
            through[prefix[:n]] = through.get(prefix[:n], 0.0) + mass
    return through


def _capped(accepted: dict[Context, float], target_mass: dict[Context, float]) -> dict[Context, float]:
    """The accepted prefix thinned so that no prefix is accepted through more often than the target emits it.

    Top-down, the prefix is kept through s with probability κ(s) = min(1, T(s)/B_in(s)), B_in(s) the mass that
    reaches s after its ancestors' thinning, and cut back to s's parent otherwise: the thinned B(s) is
    min(T(s), B_in(s)) ≤ T(s), so C = T − B ≥ 0 (κ depends on the node only, so B_in(s) = B(s)·Π ancestors' κ).
    """
    through = _through(accepted)
    keep: dict[Context, float] = {}  # κ(s)
    reach: dict[Context, float] = {(): 1.0}  # Π of the ancestors' κ
    for s in sorted(through, key=len):
        reach[s] = reach[s[:-1]] * keep[s[:-1]] if s[:-1] else 1.0
        arriving = through[s] * reach[s]
        keep[s] = min(1.0, target_mass[s] / arriving) if arriving > 0 else 1.0
    capped: dict[Context, float] = {}
    for prefix, mass in accepted.items():
        alive = mass
        for n in range(1, len(prefix) + 1):
            cut = alive * (1 - keep[prefix[:n]])
            if cut > 0:
                capped[prefix[: n - 1]] = capped.get(prefix[: n - 1], 0.0) + cut
            alive -= cut
        capped[prefix] = capped.get(prefix, 0.0) + alive
    return capped


def _alive(layer: CarriedLayer | None, context: Context, L: int) -> CarriedLayer | None:
    """``layer`` if it still governs the token after ``context``, else None (older layers expire first)."""
    if layer is None or len(context) - len(layer.start) >= L:
        return None
    return layer


def second_iteration_expected_accepted(verifier, target: ToyLM, draft: ToyLM, K: int, L: int) -> float:
    """E[τ] of a registered rule's second iteration, averaged over its first one's outcomes (state threaded)."""
    total = 0.0
    memo: dict = {}
    for weight, emitted, state in iteration_outcomes(verifier, target, draft, K, L):
        key = (emitted, state)
        if key not in memo:
            memo[key] = sum(w * (len(tokens) - 1)
                            for w, tokens, _ in iteration_outcomes(verifier, target, draft, K, L, emitted, state))
        total += weight * memo[key]
    return total


def coupling_gap(oracle: MarginalOracle) -> float:
    """max_s |B(s) − P(s)·(1 − (1 − min(1, Q(s)/P(s)))^K)| of the first iteration: how far the scan's accepted
    prefix law is from the conditionally independent coupling's, the law the release's correction assumes."""
    first = oracle.iteration((), None)
    worst = 0.0
    for s, P in first.target_mass.items():
        if not 1 <= len(s) <= oracle.L:
            continue
        Q = oracle.draft.sequence_prob((), s)
        coupling = P * (1 - (1 - min(1.0, Q / P)) ** oracle.K)
        worst = max(worst, abs(first.through.get(s, 0.0) - coupling))
    return worst


def h_excursion_stats(target: ToyLM, draft: ToyLM, K: int, L: int) -> dict[str, float]:
    """Where the release's h leaves [0, 1] in a first iteration (``SpecTrGBV.h_excursions``, beyond 1e-9 round-off):
    the probability (over draft sets) that some slot of the block has a defined h outside [0, 1], the share of slots
    that do (weighted by the draft sets' probability), the smallest and largest defined h seen, and the probability
    that some slot is 0/0 in exact arithmetic with a rounded value outside [0, 1] (harmless: see docs/theory.md)."""
    rule = SpecTrGBV(check_inputs=False)
    any_out, slots_out, any_undefined, low, high = 0.0, 0.0, 0.0, 0.0, 1.0
    for prob, tokens in draft_tuples(draft, (), K, L):
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
        excursions = rule.h_excursions(tokens, draft_probs, target_probs)
        if len(rule.h_excursions(tokens, draft_probs, target_probs, undefined=True)) > len(excursions):
            any_undefined += prob
        if excursions:
            any_out += prob
            slots_out += prob * len(excursions) / (K * L)
            values = [h for _, _, h in excursions]
            low, high = min(low, *values), max(high, *values)
    return {"p_block_h_outside": any_out, "share_slots_h_outside": slots_out, "h_min": low, "h_max": high,
            "p_block_h_undefined": any_undefined}


def step_decoded_law(step: str, target: ToyLM, draft: ToyLM, K: int, L: int, n_tokens: int = 3) -> dict:
    """Exact law of the first ``n_tokens`` decoded tokens after the corrective ``step`` (a name of STEPS or
    NEGATIVE_CONTROL)."""
    rule_options = dict(RULE_STEPS)
    if step in rule_options:
        return exact_decoded_law(SpecTrGBV(**rule_options[step]), target, draft, K, L, n_tokens)
    oracle_options = {name: (carry, cap) for name, carry, cap in ORACLE_STEPS}
    if step not in oracle_options:
        raise ValueError(f"unknown step {step!r}; known: {', '.join([*rule_options, *oracle_options])}")
    carry, cap = oracle_options[step]
    return MarginalOracle(target, draft, K, L, carry_over=carry, cap=cap).decoded_law(n_tokens)


def decomposition_rows(toys: Sequence[ToySpec] = DECOMPOSITION_TOYS, Ks: Sequence[int] = (1, 2, 3),
                       n_tokens: int = 3, progress=None) -> pd.DataFrame:
    """One row per (toy, K, step): exact TV of the first ``n_tokens`` decoded tokens to the target's law, E[τ] of
    the first and second iterations, and the diagnostics (min C, coupling gap, h excursions)."""
    rows = []
    for toy in toys:
        target, draft = toy.pair()
        truth = target_law(target, n_tokens)
        for K in Ks:
            base = {"toy": toy.label(), "K": K}
            excursions = h_excursion_stats(target, draft, K, toy.L)
            for step, options in RULE_STEPS:
                verifier = SpecTrGBV(**options)
                law = exact_decoded_law(verifier, target, draft, K, toy.L, n_tokens)
                first = sum(w * (len(t) - 1) for w, t, _ in iteration_outcomes(verifier, target, draft, K, toy.L))
                rows.append({**base, "step": step, "exact_tv": total_variation(law, truth),
                             "e_tau_first": first,
                             "e_tau_second": second_iteration_expected_accepted(verifier, target, draft, K, toy.L),
                             **excursions})
                if progress:
                    progress(rows[-1])
            for step, carry, cap in ORACLE_STEPS:
                oracle = MarginalOracle(target, draft, K, toy.L, carry_over=carry, cap=cap)
                law = oracle.decoded_law(n_tokens)
                rows.append({**base, "step": step, "exact_tv": total_variation(law, truth),
                             "e_tau_first": oracle.iteration((), None).expected_accepted,
                             "e_tau_second": oracle.second_iteration_expected_accepted(),
                             "min_carried_mass": oracle.min_carried_mass, "max_coupling_gap": coupling_gap(oracle),
                             **excursions})
                if progress:
                    progress(rows[-1])
    return pd.DataFrame(rows)


def decomposition_markdown(df: pd.DataFrame, n_tokens: int) -> str:
    """The table of docs/theory.md: TV and E[τ] (first / second iteration) after each step, per toy and K."""
    steps = [*STEPS, NEGATIVE_CONTROL]
    header = "| toy | K | " + " | ".join(steps) + " |"
    lines = [f"Exact TV of the first {n_tokens} decoded tokens to the target's law; E[τ] of the first / second "
             "iteration (the second averaged over the first one's outcomes, carried state threaded).", "",
             header, "|" + "---|" * (len(steps) + 2)]
    for (toy, K), group in df.groupby(["toy", "K"], sort=False):
        by_step = group.set_index("step")
        cells = [f"TV {by_step.at[s, 'exact_tv']:.2g}; E[τ] {by_step.at[s, 'e_tau_first']:.4f} / "
                 f"{by_step.at[s, 'e_tau_second']:.4f}" for s in steps]
        lines.append(f"| {toy} | {K} | " + " | ".join(cells) + " |")
    lines += ["", "Diagnostics: where h leaves [0, 1] (first iteration, release) and the scan's accepted-prefix law B "
              "against the coupling the correction assumes.", "",
              "| toy | K | P(block has h ∉ [0,1]) | share of test slots | h min | h max | P(block has a 0/0 h, rounded "
              "outside [0,1]) | max_s abs(B − coupling) | min_s C(s) = T − B |",
              "|---|---|---|---|---|---|---|---|---|"]
    oracle = df[df.step == "marginal"]
    for row in oracle.itertuples():
        lines.append(f"| {row.toy} | {row.K} | {row.p_block_h_outside:.3g} | {row.share_slots_h_outside:.3g} | "
                     f"{row.h_min:.3g} | {row.h_max:.3g} | {row.p_block_h_undefined:.3g} | "
                     f"{row.max_coupling_gap:.3g} | {row.min_carried_mass:.3g} |")
    return "\n".join(lines) + "\n"
