"""The shared contract suite: every rule in the registry (spectr_repro.verify.VERIFIERS) is tested here,
with no test file of its own needed. A new rule = one module + one registry entry + one config, and these
tests pick it up at collection time.

For each registered rule and each K it supports (1 for single-draft rules, 1-3 otherwise):
- its registry flag ``lossless`` is honest: lossless rules give the exact target law of the first 3 decoded
  tokens across iterations (TV < 1e-9; carry-over states threaded), rules flagged not lossless are measurably
  biased (TV > 1e-4) on at least one K — so the flag cannot drift from what the rule does;
- lossless rules pass the Monte-Carlo joint-law chi-square through their real sampler;
- the sampler follows the rule's own exact law on fixed drafts (chi-square, p > 1e-4);
- the contract: broken inputs are one ValueError (sampler and law), float32 agrees with float64;
- degenerate inputs: one-hot p and q emit the target's argmax; q = p accepts every block (lossless rules).

Thresholds (EXACT_TV, ALPHA, MC_SAMPLES) and their reasons are in conftest.py. The last tests register a toy
rule on the fly and show that the same battery tests it — and rejects a broken one (the suite's power).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.theory.toy import block_tensors, exact_decoded_law, target_law, toy_pair
from spectr_repro.verify import VERIFIERS, VerifierSpec, get_verifier
from spectr_repro.verify.sd import SpeculativeDecoding
from spectr_repro.verify.thresholds import BIASED_TV
from tests.verify.verify_helpers import (
    ALPHA,
    EXACT_TV,
    assert_contract,
    assert_draft_equal_target_accepts_all,
    assert_greedy_is_argmax,
    exact_tv,
    fixed_drafts,
    iteration_inputs,
    law_dict,
    monte_carlo_check,
    sampler_check,
)

from .test_controls import AlwaysAccept


def supported_Ks(name: str) -> tuple[int, ...]:
    return (1,) if VERIFIERS[name].single_draft else (1, 2, 3)


def rule_cases() -> list[tuple[str, int]]:
    """(rule, K) for every registered rule: what this suite runs, read from the registry at collection."""
    return [(name, K) for name in VERIFIERS for K in supported_Ks(name)]


def exact_tvs(name: str, toys) -> dict[int, float]:
    """Exact TV to the target law per K (K = 3 on one toy only, for time), max over toys."""
    tvs = {}
    for K in supported_Ks(name):
        chosen = toys[:1] if K == 3 else toys
        tvs[K] = max(exact_tv(get_verifier(name), toy, K=K, L=2) for toy in chosen)
    return tvs


def battery(name: str, toys, mc_toy) -> list[str]:
    """Run every shared check on rule ``name``; returns the failures (empty: the rule passes)."""
    spec, failures = VERIFIERS[name], []
    tvs = exact_tvs(name, toys)
    if spec.lossless and max(tvs.values()) >= EXACT_TV:
        failures.append(f"flagged lossless but exact TV {tvs}")
    if not spec.lossless and max(tvs.values()) <= BIASED_TV:
        failures.append(f"flagged not lossless but exact TV {tvs} (update the registry)")
    for K in supported_Ks(name):
        if spec.lossless:
            check = monte_carlo_check(get_verifier(name), mc_toy, K=K, seed=40 + K)
            if not (check.p_value > ALPHA and check.tv < 3 * check.expected_tv):
                failures.append(f"K={K}: Monte-Carlo joint law {check}")
        target, draft = toys[1]
        tokens = fixed_drafts(K)
        check = sampler_check(get_verifier(name), tokens, *block_tensors(target, draft, (), tokens), 2000, seed=K)
        if not check.p_value > ALPHA:
            failures.append(f"K={K}: sampler disagrees with its law {check}")
    return failures


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_lossless_flag_matches_the_exact_law(name, toys):
    tvs = exact_tvs(name, toys)
    if VERIFIERS[name].lossless:
        assert max(tvs.values()) < EXACT_TV, tvs
    else:
        assert max(tvs.values()) > BIASED_TV, f"{name} is flagged not lossless but looks lossless: {tvs}"


@pytest.mark.parametrize("name, K", [case for case in rule_cases() if VERIFIERS[case[0]].lossless])
def test_monte_carlo_joint_law(name, K, mc_toy):
    check = monte_carlo_check(get_verifier(name), mc_toy, K=K, seed=40 + K)
    assert check.p_value > ALPHA and check.tv < 3 * check.expected_tv, check


@pytest.mark.parametrize("name, K", rule_cases())
def test_sampler_matches_its_exact_law(name, K, toys):
    target, draft = toys[1]
    tokens = fixed_drafts(K)
    check = sampler_check(get_verifier(name), tokens, *block_tensors(target, draft, (), tokens), 2000, seed=K)
    assert check.p_value > ALPHA, check


@pytest.mark.parametrize("name, K", rule_cases())
def test_contract(name, K):
    assert_contract(name, K=K)


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_one_hot_distributions_emit_the_target_argmax(name, toys):
    assert_greedy_is_argmax(get_verifier(name), toys[1], K=max(supported_Ks(name)[:2]))


@pytest.mark.parametrize("name", [name for name, spec in VERIFIERS.items() if spec.lossless])
def test_draft_with_zero_probabilities_is_handled(name):
    """A one-hot draft has q = 0 on most tokens (ratio p/q undefined there): no NaN, still lossless."""
    target, _ = toy_pair(3, 6)
    draft = toy_pair(3, 7)[0].greedy()
    K = max(supported_Ks(name)[:2])
    law = exact_decoded_law(get_verifier(name), target, draft, K=K, L=2, n=2)
    assert all(math.isfinite(p) for p in law.values())
    assert total_variation(law, target_law(target, 2)) < EXACT_TV


@pytest.mark.parametrize("name, K", [(name, K) for name, spec in VERIFIERS.items() if spec.lossless
                                     for K in (supported_Ks(name)[1:] or (1,))])
def test_draft_equal_to_target_accepts_every_block(name, K, toys):
    assert_draft_equal_target_accepts_all(get_verifier(name), toys[2], K=K)


K1_CASES = [(name, toy_index, L) for name, spec in VERIFIERS.items() if spec.reduces_at_K1_to
            for toy_index, L in [(0, 2), (1, 2), (2, 2), (0, 3)]]


@pytest.mark.parametrize("name, toy_index, L", K1_CASES)
def test_single_draft_reduces_to_the_named_rule(name, toy_index, L, toys):
    """K = 1: the law equals that of the single-draft rule the registry names (``reduces_at_K1_to``), draft
    tuple by draft tuple after a context token, to 1e-12 (both exact; observed 0 to ~1e-16). Control: another
    single-draft rule differs from the named one on these draft tuples (by > 1e-6), so the check can fail."""
    reduced = VERIFIERS[name].reduces_at_K1_to
    ours, theirs = get_verifier(name), get_verifier(reduced)
    other = get_verifier(next(n for n, s in VERIFIERS.items() if s.single_draft and n != reduced))
    target, draft = toys[toy_index]
    control_gap = 0.0
    for _, tokens, dp, tp in iteration_inputs(target, draft, 1, L, context=(0,)):
        reference = law_dict(theirs.law(tokens, dp, tp))
        assert total_variation(law_dict(ours.law(tokens, dp, tp)), reference) < 1e-12
        control_gap = max(control_gap, total_variation(law_dict(other.law(tokens, dp, tp)), reference))
    assert control_gap > 1e-6


# --- a rule registered on the fly is tested by the same battery ---------------------------------------

class ToySD(SpeculativeDecoding):
    """A valid toy rule: SD under another name."""

    name = "toy_sd"


class ToyAlwaysAccept(AlwaysAccept):
    """A broken toy rule that claims losslessness (emits the first draft whole, then a bonus from p)."""

    name = "toy_always_accept"
    lossless = True


def _register(monkeypatch, cls, lossless: bool = True) -> str:
    spec = VerifierSpec(cls.name, f"{__name__}:{cls.__name__}", cls.name.upper(), lossless, True, cls.single_draft,
                        "toy")
    monkeypatch.setitem(VERIFIERS, cls.name, spec)
    return cls.name


def test_a_registered_rule_is_picked_up_and_passes(monkeypatch, toys, mc_toy):
    name = _register(monkeypatch, ToySD)
    assert (name, 1) in rule_cases()  # collected like every built-in rule
    assert get_verifier(name).name == name
    assert battery(name, toys, mc_toy) == []


def test_the_battery_rejects_a_broken_registered_rule(monkeypatch, toys, mc_toy):
    name = _register(monkeypatch, ToyAlwaysAccept)
    failures = battery(name, toys, mc_toy)
    assert any("flagged lossless but exact TV" in f for f in failures), failures
    assert any("Monte-Carlo joint law" in f for f in failures), failures


def test_the_registry_describes_every_rule():
    for name, spec in VERIFIERS.items():
        verifier = get_verifier(name)
        assert verifier.name == name and verifier.single_draft == spec.single_draft
        assert verifier.lossless == spec.lossless, f"{name}: class and registry disagree on losslessness"
        assert spec.label and spec.description
        assert dataclasses.replace(spec) == spec


def test_mc_toy_is_the_far_draft_toy():
    """Guards the power argument of conftest.mc_toy: a draft far from the target (TV > 0.2 at the first token)."""
    target, draft = toy_pair(vocab_size=3, seed=0, draft_noise=0.8)
    first_p, first_q = target.probs(()), draft.probs(())
    assert 0.5 * float((first_p - first_q).abs().sum()) > 0.05
