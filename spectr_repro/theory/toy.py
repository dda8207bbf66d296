"""Toy language models over a small vocabulary, and exact / Monte-Carlo laws of decoded text.

The test kit used by the verification tests, the audit and the theory commands. A toy model's
conditional p(. | context) depends on the WHOLE context (the context is hashed into a seeded RNG that
draws a Dirichlet), so a rule that only looks right for context-free distributions cannot hide.

    target, draft = toy_pair(vocab_size=3, seed=0)
    law = exact_decoded_law(get_verifier("bv"), target, draft, K=1, L=2, n=3)   # zero sampling noise
    total_variation(law, target_law(target, 3))                                 # ~1e-16 if lossless
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from spectr_repro.sampling import sample

Context = tuple[int, ...]


class ToyLM:
    """p(. | context) ~ Dirichlet(concentration) drawn from an RNG seeded by (seed, context)."""

    def __init__(self, vocab_size: int, seed: int, concentration: float = 1.0) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.concentration = concentration
        self._cache: dict[Context, torch.Tensor] = {}

    def _draw(self, context: Context) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, len(context), *context])
        # Floor keeps every token possible so that drafts of any prefix have q > 0.
        probs = rng.dirichlet(np.full(self.vocab_size, self.concentration)) + 1e-3
        return torch.from_numpy(probs / probs.sum())

    def probs(self, context: Sequence[int]) -> torch.Tensor:
        """float64 [V]; cached (do not modify in place)."""
        context = tuple(int(t) for t in context)
        if context not in self._cache:
            self._cache[context] = self._draw(context)
        return self._cache[context]

    def greedy(self) -> GreedyLM:
        return GreedyLM(self)

    def sequence_prob(self, context: Sequence[int], tokens: Sequence[int]) -> float:
        context, prob = tuple(context), 1.0
        for token in tokens:
            prob *= float(self.probs(context)[token])
            context = context + (int(token),)
        return prob


class MixtureLM(ToyLM):
    """(1 - weight) * a + weight * b, conditional by conditional: a draft 'close' to a target."""

    def __init__(self, a: ToyLM, b: ToyLM, weight: float) -> None:
        super().__init__(a.vocab_size, seed=-1)
        self.a, self.b, self.weight = a, b, weight

    def _draw(self, context: Context) -> torch.Tensor:
        return (1 - self.weight) * self.a.probs(context) + self.weight * self.b.probs(context)


class GreedyLM(ToyLM):
    """One-hot argmax of another toy (temperature 0)."""

    def __init__(self, base: ToyLM) -> None:
        super().__init__(base.vocab_size, seed=-1)
        self.base = base

    def _draw(self, context: Context) -> torch.Tensor:
        base = self.base.probs(context)
        return torch.zeros_like(base).scatter_(0, base.argmax().view(1), 1.0)


def toy_pair(vocab_size: int = 3, seed: int = 0, concentration: float = 1.0, draft_noise: float = 0.5):
    """(target, draft): the draft mixes the target with an independent toy (weight ``draft_noise``)."""
    target = ToyLM(vocab_size, seed=2 * seed, concentration=concentration)
    noise = ToyLM(vocab_size, seed=2 * seed + 1, concentration=concentration)
    draft = target if draft_noise == 0 else MixtureLM(target, noise, draft_noise)
    return target, draft


@dataclass(frozen=True)
class ToySpec:
    """A seeded toy pair (``toy_pair(vocab_size, seed)``) decoded in blocks of L tokens; ``K`` drafts where the
    toy fixes them too (the gap table's toys)."""

    vocab_size: int
    L: int
    seed: int
    K: int | None = None

    def pair(self):
        return toy_pair(self.vocab_size, self.seed)

    def label(self, sep: str = ",") -> str:
        return sep.join((f"V={self.vocab_size}", f"L={self.L}", f"seed={self.seed}"))

    @property
    def tuples(self) -> int:
        """Draft tuples of one iteration, V^(K L) (toys with K only)."""
        return self.vocab_size ** (self._K() * self.L)

    def key(self) -> str:
        """V, L, K and seed: the key of the gap table's cache (toys with K only)."""
        return f"V={self.vocab_size},L={self.L},K={self._K()},seed={self.seed}"

    def _K(self) -> int:
        if self.K is None:
            raise ValueError(f"toy {self.label()} has no K")
        return self.K


def block_tensors(target: ToyLM, draft: ToyLM, context: Sequence[int], draft_tokens: torch.Tensor):
    """Verifier inputs for the drafts ``draft_tokens`` [K, L] after ``context``.

    Returns (draft_probs [K, L, V], target_probs [K, L+1, V]), float64.
    """
    context = tuple(context)
    rows = [tuple(int(t) for t in row) for row in draft_tokens.tolist()]
    L = draft_tokens.shape[1]
    draft_probs = torch.stack([torch.stack([draft.probs(context + r[:i]) for i in range(L)]) for r in rows])
    target_probs = torch.stack([torch.stack([target.probs(context + r[:i]) for i in range(L + 1)]) for r in rows])
    return draft_probs, target_probs


def draft_tuples(draft: ToyLM, context: Sequence[int], K: int, L: int) -> list[tuple[float, torch.Tensor]]:
    """Every tuple of K i.i.d. drafts of length L with its probability under ``draft``."""
    context = tuple(context)
    singles = [
        (draft.sequence_prob(context, seq), seq)
        for seq in itertools.product(range(draft.vocab_size), repeat=L)
    ]
    singles = [(p, s) for p, s in singles if p > 0]
    out = []
    for combo in itertools.product(singles, repeat=K):
        prob = float(np.prod([p for p, _ in combo]))
        out.append((prob, torch.tensor([s for _, s in combo], dtype=torch.long)))
    return out


def target_law(target: ToyLM, n: int, context: Sequence[int] = ()) -> dict[Context, float]:
    """Exact law of the first ``n`` tokens sampled from ``target`` after ``context``."""
    context = tuple(context)
    return {
        seq: target.sequence_prob(context, seq)
        for seq in itertools.product(range(target.vocab_size), repeat=n)
    }


def _hashable(state) -> bool:
    try:
        hash(state)
    except TypeError:
        return False
    return True


def exact_decoded_law(verifier, target: ToyLM, draft: ToyLM, K: int, L: int, n: int,
                      context: Sequence[int] = (), state=None) -> dict[Context, float]:
    """Exact law of the first ``n`` decoded tokens, iterating the rule and threading its state.

    Enumerates every draft tuple and integrates the rule's randomness through ``verifier.law``: no
    sampling noise, so a lossless rule matches ``target_law`` to float64 round-off.
    """
    memo: dict = {}
    tuples_cache: dict = {}

    def iteration_inputs(ctx: Context):
        if ctx not in tuples_cache:
            tuples_cache[ctx] = [
                (prob, tokens, *block_tensors(target, draft, ctx, tokens))
                for prob, tokens in draft_tuples(draft, ctx, K, L)
            ]
        return tuples_cache[ctx]

    def recurse(ctx: Context, st, remaining: int) -> dict[Context, float]:
        key = (ctx, st, remaining) if _hashable(st) else None
        if key is not None and key in memo:
            return memo[key]
        law: dict[Context, float] = {}
        for prob, tokens, draft_probs, target_probs in iteration_inputs(ctx):
            for outcome in verifier.law(tokens, draft_probs, target_probs, state=st):
                weight = prob * outcome.probability
                if weight == 0:
                    continue
                emitted = tuple(int(t) for t in outcome.tokens)
                if len(emitted) >= remaining:
                    head = emitted[:remaining]
                    law[head] = law.get(head, 0.0) + weight
                else:
                    for suffix, p in recurse(ctx + emitted, outcome.state, remaining - len(emitted)).items():
                        law[emitted + suffix] = law.get(emitted + suffix, 0.0) + weight * p
        if key is not None:
            memo[key] = law
        return law

    return recurse(tuple(context), state, n)


def sample_drafts(draft: ToyLM, context: Sequence[int], K: int, L: int, generator: torch.Generator) -> torch.Tensor:
    """K i.i.d. drafts of length L from ``draft`` (autoregressive), LongTensor [K, L]."""
    context = tuple(context)
    tokens = torch.empty(K, L, dtype=torch.long)
    for k in range(K):
        row: Context = ()
        for i in range(L):
            token = int(sample(draft.probs(context + row), generator))
            tokens[k, i] = token
            row = row + (token,)
    return tokens


def sample_decoded(verifier, target: ToyLM, draft: ToyLM, K: int, L: int, n: int, num_samples: int,
                   seed: int, context: Sequence[int] = ()) -> Counter:
    """Monte Carlo through the rule's real sampler: counts of the first ``n`` decoded tokens."""
    generator = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    for _ in range(num_samples):
        ctx, emitted, state = tuple(context), (), None
        while len(emitted) < n:
            tokens = sample_drafts(draft, ctx, K, L, generator)
            draft_probs, target_probs = block_tensors(target, draft, ctx, tokens)
            result = verifier(tokens, draft_probs, target_probs, generator=generator, state=state)
            new = tuple(int(t) for t in result.tokens.tolist())
            emitted, ctx, state = emitted + new, ctx + new, result.state
        counts[emitted[:n]] += 1
    return counts


@cache
def standard_toys(vocab_size: int = 3, count: int = 3) -> tuple:
    """A few seeded (target, draft) pairs used across tests, audit and theory."""
    return tuple(toy_pair(vocab_size, seed) for seed in range(count))
