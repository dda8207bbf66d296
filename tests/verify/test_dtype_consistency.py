"""Every rule's exact law from float32 inputs equals its law from float64 inputs (within 1e-5).

The engine hands the rules float32 probabilities and the rules compute in the input dtype where that is
numerically safe; the exact-law tests run in float64. This file closes the gap: a float32 fast path that
underflows, loses a term or biases a rule in any way moves the law by far more than the 1e-5 allowed here
(float32 rounding of the inputs alone moves it by ~1e-7). The negative control rounds the inputs to
bfloat16 inside the rule and must be caught by the same check.
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.toy import block_tensors, draft_tuples, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier

TOLERANCE = 1e-5
NUM_TUPLES = 6  # draft tuples per case, spread over the enumeration (all: slower, not stronger)

# (rule, options): every registered rule with its defaults, plus the non-default carry-over variants.
CASES = [(name, {}) for name in VERIFIERS] + [("gbv", {"carry_over": False}),
                                              ("spectr_gbv", {"carry_over": True})]


def law_by_tokens(outcomes) -> dict[tuple[int, ...], float]:
    law: dict[tuple[int, ...], float] = {}
    for outcome in outcomes:
        key = tuple(int(t) for t in outcome.tokens)
        law[key] = law.get(key, 0.0) + outcome.probability
    return law


def law_gap(law_a: dict, law_b: dict) -> float:
    return max(abs(law_a.get(key, 0.0) - law_b.get(key, 0.0)) for key in set(law_a) | set(law_b))


def block_inputs(K: int, L: int, concentration: float, seed: int):
    """A few (draft_tokens, draft_probs, target_probs) float64 blocks of a toy, spread over its drafts."""
    target, draft = toy_pair(vocab_size=3, seed=seed, concentration=concentration)
    tuples = draft_tuples(draft, (), K, L)
    stride = max(1, len(tuples) // NUM_TUPLES)
    chosen = tuples[::stride][:NUM_TUPLES]
    return [(tokens, *block_tensors(target, draft, (), tokens)) for _, tokens in chosen]


def a_carry_over_state(rule, inputs):
    """A state with at least one frame, produced by the rule itself (None for rules without one)."""
    for tokens, draft_probs, target_probs in inputs:
        for outcome in rule.law(tokens, draft_probs, target_probs):
            if outcome.state is not None:
                return outcome.state
    return None


def worst_gap(rule, inputs, state=None) -> float:
    gaps = []
    for tokens, draft_probs, target_probs in inputs:
        law64 = law_by_tokens(rule.law(tokens, draft_probs, target_probs, state=state))
        law32 = law_by_tokens(rule.law(tokens, draft_probs.float(), target_probs.float(), state=state))
        assert abs(sum(law32.values()) - 1) < TOLERANCE
        gaps.append(law_gap(law64, law32))
    return max(gaps)


CASE_IDS = [f"{name}-{options}" if options else name for name, options in CASES]


@pytest.mark.parametrize("concentration", [1.0, 0.2])  # 0.2: peaked toys, probabilities down to ~1e-10
@pytest.mark.parametrize(("name", "options"), CASES, ids=CASE_IDS)
def test_float32_law_matches_float64_law(name, options, concentration):
    spec = VERIFIERS[name]
    K, L = (1, 3) if spec.single_draft else (2, 2)
    rule = get_verifier(name, **options)
    inputs = block_inputs(K, L, concentration, seed=1)
    assert worst_gap(rule, inputs) < TOLERANCE
    state = a_carry_over_state(rule, inputs)
    if state is not None:  # the carried target, too, must not depend on the dtype
        assert worst_gap(rule, inputs, state=state) < TOLERANCE


class Bfloat16Inputs:
    """Negative control: a rule whose 'fast path' rounds float32 inputs to bfloat16 (8 mantissa bits)."""

    def __init__(self, rule):
        self.rule = rule

    def law(self, tokens, draft_probs, target_probs, state=None):
        if draft_probs.dtype == torch.float32:
            def rounded(x):
                x = x.to(torch.bfloat16).float()
                return x / x.sum(-1, keepdim=True)

            draft_probs, target_probs = rounded(draft_probs), rounded(target_probs)
        return self.rule.law(tokens, draft_probs, target_probs, state=state)


@pytest.mark.parametrize("name", ["gbv", "spectr_gbv"])
def test_a_low_precision_fast_path_is_caught(name):
    K, L = (1, 3) if VERIFIERS[name].single_draft else (2, 2)
    inputs = block_inputs(K, L, 1.0, seed=1)
    assert worst_gap(Bfloat16Inputs(get_verifier(name)), inputs) > 10 * TOLERANCE
