"""Helpers the verification-rule tests share (their fixtures are in conftest.py, which pytest loads).

Sizes are chosen for speed: V = 3, L = 2 toys (K = 3 on one toy only); every exact check enumerates
all draft tuples, every Monte-Carlo check uses fixed seeds and states its threshold where it is used.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from spectr_repro.theory.exact import iteration_law  # noqa: F401 - re-exported for the rule tests
from spectr_repro.theory.lawcheck import chi_square_test, total_variation
from spectr_repro.theory.toy import (
    block_tensors,
    draft_tuples,
    exact_decoded_law,
    sample_decoded,
    target_law,
)
from spectr_repro.verify import get_verifier
from spectr_repro.verify.thresholds import ALPHA, EXACT_TV, POWER_ALPHA  # noqa: F401 - re-exported


def law_dict(outcomes) -> dict[tuple[int, ...], float]:
    """A rule's law (list of Outcome) as {tokens: probability}, merging equal token tuples."""
    law: dict[tuple[int, ...], float] = {}
    for outcome in outcomes:
        key = tuple(int(t) for t in outcome.tokens)
        law[key] = law.get(key, 0.0) + outcome.probability
    return law


def iteration_inputs(target, draft, K: int, L: int, context=()):
    """[(probability, draft_tokens, draft_probs, target_probs)] over every draft tuple after ``context``."""
    return [(prob, tokens, *block_tensors(target, draft, context, tokens))
            for prob, tokens in draft_tuples(draft, context, K, L)]


def exact_mean_accepted(verifier, target, draft, K: int, L: int, context=()) -> float:
    """E[tau] of one iteration after ``context``, exactly (drafts enumerated, rule's law integrated)."""
    return sum(prob * outcome.probability * (len(outcome.tokens) - 1)
               for prob, tokens, dp, tp in iteration_inputs(target, draft, K, L, context)
               for outcome in verifier.law(tokens, dp, tp))


def sampler_check(verifier, draft_tokens, draft_probs, target_probs, num_samples: int, seed: int):
    """Chi-square of the sampler's outcomes on fixed inputs against the rule's own exact law."""
    generator = torch.Generator().manual_seed(seed)
    counts = Counter(
        tuple(verifier(draft_tokens, draft_probs, target_probs, generator=generator).tokens.tolist())
        for _ in range(num_samples)
    )
    return chi_square_test(counts, law_dict(verifier.law(draft_tokens, draft_probs, target_probs)))


# ---------------------------------------------------------------------------------------------------
# Checks shared by the per-rule files. Each returns its measurement so tests can print / compare it.

MC_SAMPLES = 1500  # joint law of 3 tokens (27 bins): sampling TV ~0.04; controls are rejected at p < 1e-6


def exact_tv(verifier, toy, K: int, L: int = 2, n: int = 3) -> float:
    """TV between the exact law of the first n decoded tokens (across iterations) and the target's."""
    target, draft = toy
    return total_variation(exact_decoded_law(verifier, target, draft, K, L, n), target_law(target, n))


def monte_carlo_check(verifier, toy, K: int, L: int = 2, n: int = 3, num_samples: int = MC_SAMPLES,
                      seed: int = 0):
    """Chi-square (merged bins) + TV of the first n tokens decoded by the real sampler vs the target law."""
    target, draft = toy
    counts = sample_decoded(verifier, target, draft, K, L, n, num_samples, seed)
    return chi_square_test(counts, target_law(target, n))


def fixed_drafts(K: int) -> torch.Tensor:
    """Draft tuples for the sampler-vs-law checks: later drafts share or break the first one's prefix."""
    return torch.tensor([[0, 1], [0, 2], [1, 0]][:K])


def assert_greedy_is_argmax(verifier, toy, K: int, L: int = 2, n: int = 3) -> None:
    """One-hot p and q (temperature 0, different argmaxes): exact law and sampler emit the target's argmax."""
    target, noise = toy[0].greedy(), toy[1].greedy()
    law = exact_decoded_law(verifier, target, noise, K, L, n)
    greedy = max(target_law(target, n).items(), key=lambda item: item[1])[0]
    assert law.keys() == {greedy} and abs(law[greedy] - 1) < 1e-12
    assert all(math.isfinite(v) for v in law.values())
    counts = sample_decoded(verifier, target, noise, K, L, n, num_samples=20, seed=0)
    assert counts == Counter({greedy: 20})


def assert_draft_equal_target_accepts_all(verifier, toy, K: int, L: int = 2) -> None:
    """q = p: every outcome of every draft tuple has L accepted tokens plus the bonus (outcomes cut short may
    carry float64 round-off mass, < 1e-12 in all)."""
    target = toy[0]
    for _, tokens, dp, tp in iteration_inputs(target, target, K, L):
        law = law_dict(verifier.law(tokens, dp, tp))
        assert sum(p for o, p in law.items() if len(o) != L + 1) < 1e-12 and abs(sum(law.values()) - 1) < 1e-12
        result = verifier(tokens, dp, tp, generator=torch.Generator().manual_seed(1))
        assert result.num_accepted == L and len(result.tokens) == L + 1


def contract_inputs(K: int, L: int = 2, V: int = 4, dtype=torch.float64):
    """Valid random inputs (draft tokens drawn from their own q) for contract tests. Drafts sharing a
    prefix share its rows (one context, one conditional), as the contract requires."""
    g = torch.Generator().manual_seed(7)
    q = torch.rand(K, L, V, generator=g, dtype=torch.float64) + 0.1
    p = torch.rand(K, L + 1, V, generator=g, dtype=torch.float64) + 0.1
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    tokens = torch.zeros(K, L, dtype=torch.long)
    for k in range(K):
        for i in range(L + 1):
            first = next(j for j in range(k + 1) if torch.equal(tokens[j, :i], tokens[k, :i]))
            p[k, i] = p[first, i]
            if i < L:
                q[k, i] = q[first, i]
                tokens[k, i] = torch.multinomial(q[k, i], 1, generator=g)
    return tokens, q.to(dtype), p.to(dtype)


def broken_inputs(K: int):
    """(label, draft_tokens, draft_probs, target_probs) triples that each break the contract once."""
    tokens, q, p = contract_inputs(K)
    negative = p.clone()
    negative[0, 0, 0], negative[0, 0, 1] = -0.1, negative[0, 0, 1] + 0.1
    zero_q = q.clone()
    zero_q[0, 0] = 0.0
    zero_q[0, 0, (int(tokens[0, 0]) + 1) % q.shape[-1]] = 1.0
    return [
        ("1-D tokens", tokens[0], q, p),
        ("float tokens", tokens.double(), q, p),
        ("target has L rows", tokens, q, p[:, :-1]),
        ("draft wrong L", tokens, q[:, :1], p),
        ("vocab mismatch", tokens, q, p[..., :-1] / p[..., :-1].sum(-1, keepdim=True)),
        ("K mismatch", tokens, q[:1] if K > 1 else q.expand(2, -1, -1), p),
        ("negative", tokens, q, negative),
        ("not normalised", tokens, q * 1.01, p),
        ("NaN", tokens, q, p.clone().fill_(float("nan"))),
        ("half", tokens, q.half(), p.half()),
        ("bfloat16", tokens, q.bfloat16(), p.bfloat16()),
        ("token out of range", tokens.clone().fill_(q.shape[-1]), q, p),
        ("drafted token has q = 0", tokens, zero_q, p),
    ]


def assert_contract(rule: str, K: int) -> None:
    """Every broken input gives ValueError from both the sampler and the law; valid float32 works."""
    verifier = get_verifier(rule)
    for label, tokens, q, p in broken_inputs(K):
        with pytest.raises(ValueError):
            verifier(tokens, q, p)
            pytest.fail(f"{rule}: {label} accepted by the sampler")
        with pytest.raises(ValueError):
            verifier.law(tokens, q, p)
            pytest.fail(f"{rule}: {label} accepted by the law")
    tokens, q, p = contract_inputs(K, dtype=torch.float32)
    result = verifier(tokens, q, p, generator=torch.Generator().manual_seed(0))
    assert result.tokens.dtype == torch.long and len(result.tokens) == result.num_accepted + 1
    assert torch.equal(result.tokens[:-1], tokens[result.draft_index, : result.num_accepted])
    law32 = law_dict(verifier.law(tokens, q, p))
    law64 = law_dict(verifier.law(*contract_inputs(K, dtype=torch.float64)))
    assert total_variation(law32, law64) < 1e-5
