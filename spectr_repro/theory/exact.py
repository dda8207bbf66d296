"""Exact per-iteration output law of a rule on a toy pair.

One iteration draws K i.i.d. drafts of L tokens from q; the rule returns z = accepted prefix + one
token. M(z) = sum over the V^(K*L) draft tuples D of q(D) * P(rule outputs z | D), where the inner law
comes from ``verifier.law`` (the rule's uniform draws integrated analytically). No sampling noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spectr_repro.theory.toy import ToyLM, block_tensors, draft_tuples
from spectr_repro.verify import Verifier, get_verifier

Law = dict[tuple[int, ...], float]


def iteration_outcomes(
    verifier: Verifier, target: ToyLM, draft: ToyLM, K: int, L: int, context: Sequence[int] = (),
    state: Any = None,
) -> list[tuple[float, tuple[int, ...], Any]]:
    """Every (probability, emitted tokens, next state) of one iteration, drafts integrated out.

    Atoms are not merged (their states may differ); probabilities sum to 1.
    """
    context = tuple(context)
    atoms = []
    for prob, tokens in draft_tuples(draft, context, K, L):
        draft_probs, target_probs = block_tensors(target, draft, context, tokens)
        for outcome in verifier.law(tokens, draft_probs, target_probs, state=state):
            weight = prob * outcome.probability
            if weight > 0:
                atoms.append((weight, tuple(int(t) for t in outcome.tokens), outcome.state))
    return atoms


def iteration_law(verifier: Verifier, target: ToyLM, draft: ToyLM, K: int, L: int,
                  context: Sequence[int] = (), state: Any = None) -> Law:
    """M(z): the law of one iteration's output z (length 1..L+1), merged over draft tuples and states."""
    law: Law = {}
    for weight, tokens, _ in iteration_outcomes(verifier, target, draft, K, L, context, state):
        law[tokens] = law.get(tokens, 0.0) + weight
    return law


def expected_accepted_length(law: Law) -> float:
    """E[tau] = sum_z M(z) (|z| - 1): accepted draft tokens per iteration (block efficiency - 1)."""
    return sum(prob * (len(tokens) - 1) for tokens, prob in law.items())


def rule_law(name: str, target: ToyLM, draft: ToyLM, K: int, L: int, context: Sequence[int] = (),
             **options: Any) -> Law:
    """Shortcut: M(z) of the registered rule ``name`` (first iteration, no carried state)."""
    return iteration_law(get_verifier(name, **options), target, draft, K, L, context)


def rule_expected_accepted(name: str, target: ToyLM, draft: ToyLM, K: int, L: int,
                           context: Sequence[int] = (), **options: Any) -> float:
    """Exact E[tau] of the rule ``name`` in one iteration (first iteration, no carried state)."""
    return expected_accepted_length(rule_law(name, target, draft, K, L, context, **options))
