"""Closed-form per-iteration quantities over joint prefix probabilities.

P(x^i), Q(x^i) are the target and draft probabilities of the first i tokens of an iteration (products
of conditionals after the context). Two numbers from the GBV paper (arXiv 2604.25925):

- the paper's bound on E[tau] for K drafts:  sum_{i=1..L} sum_{x^i} P(x^i) [1 - (1 - min(1, Q/P))^K];
- GBV's per-iteration value (its K=1 case):  sum_{i=1..L} sum_{x^i} min(P(x^i), Q(x^i)).

Both are compared in ``theory.claims`` with the LP limit of ANY valid rule used as is (``theory.lp``) and with
every rule's exact E[tau] (``theory.exact``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spectr_repro.theory.toy import ToyLM


def prefix_masses(model: ToyLM, context: Sequence[int], L: int) -> list[np.ndarray]:
    """[P_1, ..., P_L] with P_i of shape [V] * i: P_i[x_1, ..., x_i] = prob of x^i after ``context``."""
    context = tuple(context)
    V = model.vocab_size
    masses: list[np.ndarray] = []
    previous = np.ones(())
    for i in range(1, L + 1):
        current = np.empty((V,) * i)
        for prefix in np.ndindex(*((V,) * (i - 1))):
            current[prefix] = previous[prefix] * model.probs(context + prefix).numpy()
        masses.append(current)
        previous = current
    return masses


def _coverage(P: np.ndarray, Q: np.ndarray, K: int) -> np.ndarray:
    """P [1 - (1 - min(1, Q/P))^K], 0 where P = 0."""
    ratio = np.divide(Q, P, out=np.ones_like(P), where=P > 0)
    return P * (1.0 - (1.0 - np.minimum(1.0, ratio)) ** K)


def paper_bound(target: ToyLM, draft: ToyLM, K: int, L: int, context: Sequence[int] = ()) -> float:
    """The paper's bound on E[tau]: sum_i sum_{x^i} P(x^i) [1 - (1 - min(1, Q(x^i)/P(x^i)))^K]."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    target_masses = prefix_masses(target, context, L)
    draft_masses = prefix_masses(draft, context, L)
    return float(sum(_coverage(P, Q, K).sum() for P, Q in zip(target_masses, draft_masses)))


def gbv_value(target: ToyLM, draft: ToyLM, L: int, context: Sequence[int] = ()) -> float:
    """GBV's per-iteration E[tau] (first iteration): sum_i sum_{x^i} min(P(x^i), Q(x^i))."""
    target_masses = prefix_masses(target, context, L)
    draft_masses = prefix_masses(draft, context, L)
    return float(sum(np.minimum(P, Q).sum() for P, Q in zip(target_masses, draft_masses)))
