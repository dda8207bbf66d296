"""Efficiency over a whole generation, exactly, for rules that carry state (GBV's carry-over).

GBV's per-iteration E[tau] = sum_i sum min(P, Q) beats BV's in the FIRST iteration, but after a correction
its carry-over target p' (spectr_repro.verify.carry_over) governs the next L positions, and p' is further
from the draft than p: later iterations accept less. What a user gets is tokens per target call over a
whole generation. For a generation of N tokens, C_N = the number of iterations (target calls) until at
least N tokens are emitted; we compute its exact law by enumerating every draft tuple and every outcome
of every iteration (state threaded), as the engine would run it (the last block is truncated to N).

Reported: N / E[C_N] (tokens per call pooled over many generations, the harness's block efficiency) and
E[N / C_N] (the mean of per-generation block efficiencies). Cost grows like (V^(K L) * outcomes)^(N / BE):
keep V = 2..3, L = 2, N <= 6.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spectr_repro.theory.exact import iteration_outcomes
from spectr_repro.theory.toy import ToyLM
from spectr_repro.verify import get_verifier


@dataclass(frozen=True)
class GenerationEfficiency:
    rule: str
    options: dict
    K: int
    L: int
    N: int
    first_iteration_accepted: float  # E[tau] of the first iteration (no carried state)
    expected_calls: float  # E[C_N]
    tokens_per_call: float  # N / E[C_N]
    mean_block_efficiency: float  # E[N / C_N]
    later_iteration_accepted: float  # E[tau] per iteration over the whole generation, last block uncut


def calls_law(verifier, target: ToyLM, draft: ToyLM, K: int, L: int, N: int, context: Sequence[int] = (),
              state: Any = None) -> tuple[dict[int, float], float]:
    """(law of C_N, E[total tokens emitted before truncation]) for a generation of N tokens."""
    memo: dict = {}

    def recurse(ctx: tuple[int, ...], st: Any, remaining: int) -> tuple[dict[int, float], float]:
        key = (ctx, st, remaining)
        if key in memo:
            return memo[key]
        law: dict[int, float] = {}
        emitted_mean = 0.0
        for weight, tokens, next_state in iteration_outcomes(verifier, target, draft, K, L, ctx, st):
            emitted_mean += weight * len(tokens)
            if len(tokens) >= remaining:
                law[1] = law.get(1, 0.0) + weight
                continue
            sub_law, sub_emitted = recurse(ctx + tokens, next_state, remaining - len(tokens))
            emitted_mean += weight * sub_emitted
            for calls, prob in sub_law.items():
                law[calls + 1] = law.get(calls + 1, 0.0) + weight * prob
        memo[key] = (law, emitted_mean)
        return law, emitted_mean

    return recurse(tuple(context), state, N)


def generation_efficiency(rule: str, target: ToyLM, draft: ToyLM, K: int, L: int, N: int,
                          context: Sequence[int] = (), **options: Any) -> GenerationEfficiency:
    """Exact whole-generation efficiency of the registered rule ``rule`` (state threaded)."""
    if N < 1:
        raise ValueError(f"N must be >= 1, got {N}")
    verifier = get_verifier(rule, **options)
    first = sum(w * (len(t) - 1) for w, t, _ in iteration_outcomes(verifier, target, draft, K, L, context))
    law, emitted = calls_law(verifier, target, draft, K, L, N, context)
    expected_calls = sum(c * p for c, p in law.items())
    return GenerationEfficiency(
        rule=rule, options=dict(options), K=K, L=L, N=N, first_iteration_accepted=first,
        expected_calls=expected_calls, tokens_per_call=N / expected_calls,
        mean_block_efficiency=sum(N / c * p for c, p in law.items()),
        later_iteration_accepted=emitted / expected_calls - 1.0,
    )
