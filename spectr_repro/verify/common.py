"""Helpers shared by the rules: residual distributions, sampling, token ratios and exact-law atoms.

``x`` arguments are [..., V].
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from spectr_repro.sampling import sample, uniform
from spectr_repro.verify.base import Outcome


@contextlib.contextmanager
def block_cache(owner: object, attribute: str, cache: dict | None = None, key: str | None = None) -> Iterator[dict]:
    """A rule's ``shared_block``: ``owner.<attribute>`` is a cache for the block while it lasts (a fresh dict, or
    ``cache[key]`` shared with other rules, ``cache`` itself without a key), the previous one restored after."""
    previous = getattr(owner, attribute)
    current = {} if cache is None else (cache.setdefault(key, {}) if key else cache)
    setattr(owner, attribute, current)
    try:
        yield current
    finally:
        setattr(owner, attribute, previous)


__all__ = ["block_cache",
    "LawBuilder", "ValueMemo", "block_on_host", "clipped_stop_probability", "expected_emitted_from_stops", "normalize",
    "positive_part", "residual", "running_ratio", "sample", "stop_law", "stop_probability", "token_ratios",
    "tensor_key", "uniform", "uniform_list",
]

EPS = 1e-300  # only guards 0/0; every rule states what happens when a mass is exactly 0


def normalize(x: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """x / sum(x) along the last dim (x finite, non-negative); rows with zero mass become ``fallback`` (or stay
    zero). A row with a NaN stays NaN (and ``sample`` refuses it): a NaN is a bug upstream, not a fallback."""
    total = x.sum(-1, keepdim=True)
    if fallback is None:
        return x / total.clamp_min(EPS)
    # A row without mass is all zeros: divide it by 1 and add the fallback there (times 0 elsewhere, which
    # changes nothing). The select acts on the [..., 1] totals only: a broadcast torch.where over [..., V]
    # costs ~5x an elementwise pass on CPU.
    no_mass = total <= 0
    return (x / (total + no_mass)).addcmul_(fallback.to(x.dtype), no_mass)


def positive_part(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(0)


def residual(a: torch.Tensor, b: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """norm((a - b)+): the law of the correction token. ``fallback`` where (a - b)+ has no mass."""
    return normalize(positive_part(a - b), fallback=fallback if fallback is not None else None)


def stop_probability(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Block verification's stop probability h = Z / (Z + 1 - w) (tensors; Z = sum (w p - q)+ <= w <= 1).

    The one treatment of 0/0: Z = 0 with w = 1 gives h = 1. (With w = 1 every earlier token passed with
    certainty, so stopping there loses nothing; Z > 0 with w = 1 gives 1 by the formula itself, and w < 1
    keeps the denominator >= 1 - w > 0.)
    """
    return torch.nan_to_num(z / (z + (1.0 - w)), nan=1.0)


def clipped_stop_probability(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``stop_probability`` clipped to w (bv, gbv): Z <= w in exact arithmetic, so h <= w, and the clip keeps a
    scan that skips every position with eta >= w consistent with the exact law bit for bit."""
    return torch.minimum(stop_probability(z, w), w)


def running_ratio(ratios: torch.Tensor, with_start: bool = True) -> torch.Tensor:
    """BV's running clipped ratio along the last dim: w_0 = 1, w_i = min(1, w_{i-1} ratio_i), computed as
    exp(S_i - max(0, S_1..S_i)) with S the partial sums of log ratio (no loop). [..., n] -> [..., n + 1]
    (w_0..w_n), or [..., n] (w_1..w_n) with ``with_start=False``.

    A ratio of 0 makes every later w 0; ratios must not be +inf or NaN (callers decide what a zero draft
    probability means and map it first).
    """
    s = torch.cumsum(torch.log(ratios), -1)
    w = torch.exp(s - torch.cummax(s.clamp_min(0.0), -1).values)
    return torch.cat([torch.ones_like(s[..., :1]), w], -1) if with_start else w


def expected_emitted_from_stops(h: torch.Tensor) -> torch.Tensor:
    """E[tau + 1] of a backward block-verification scan from its stop probabilities h_1..h_L ([L], float64):
    tau = the largest i with a success (probability h_i, independent), 0 if none. P(tau < i) = prod_{m >= i}
    (1 - h_m), so E[tau] = sum_i P(tau >= i) = L - sum_i prod_{m >= i} (1 - h_m). A 0-dim tensor, no host read."""
    survive = (1.0 - h).flip(-1).cumprod(-1)  # [L]: entry j = prod over the last j + 1 positions
    return 1.0 + h.shape[-1] - survive.sum(-1)


def stop_law(h: list[float]) -> list[float]:
    """[P(tau = i) for i = 0..L] of block verification's backward scan from its stop probabilities h_0..h_L (host
    floats, h_0 = 1): tau = the largest i with eta_i < h_i, the eta_i independent uniforms, 0 if none. So
    P(tau = i) = h_i prod_{m > i} (1 - h_m). The exact laws of bv, sbv (and sbvf) and mpbv take it from here."""
    law, none_above = [0.0] * len(h), 1.0  # none_above: P(no success at the positions above i)
    for i in range(len(h) - 1, -1, -1):
        law[i] = h[i] * none_above
        none_above *= 1.0 - h[i]
    return law


def token_ratios(target_rows: torch.Tensor, draft_rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(x_i) / q(x_i) in float64 for rows [n, V] and tokens [n] (same device as the rows).

    q(x_i) = 0 cannot happen for a drawn token (inputs are validated); if it does (check_inputs=False)
    the ratio is +inf where p(x_i) > 0 and 0 where both vanish, so no NaN reaches an acceptance test.
    """
    index = tokens.long().to(target_rows.device).unsqueeze(-1)
    p_at = target_rows.gather(-1, index).squeeze(-1).double()
    q_at = draft_rows.gather(-1, index).squeeze(-1).double()
    return (p_at / q_at).nan_to_num(nan=0.0, posinf=float("inf"))


def block_on_host(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, list[list[int]], list, list]:
    """One host read for rules that scan drafts in Python: (tokens [K, L] on the rows' device, the tokens as
    lists, p/q of every draft token as [K][L] floats (``token_ratios``), one uniform per (draft, position))."""
    device = draft_probs.device
    tokens = draft_tokens.long().to(device)
    K, L = tokens.shape
    ratios = token_ratios(target_probs[:, :L], draft_probs, tokens)  # [K, L] float64
    eta = uniform(K * L, generator, device=None if generator is not None else device).to(device)
    host = torch.cat([tokens.double(), ratios, eta.view(K, L)]).tolist()
    return tokens, [[int(x) for x in row] for row in host[:K]], host[K : 2 * K], host[2 * K :]


def uniform_list(n: int, generator: torch.Generator | None, device: torch.device) -> list[float]:
    """n U(0,1) draws as Python floats, from ``generator`` (on its own device) or the default RNG."""
    return uniform(n, generator, device=None if generator is not None else device).tolist()


class LawBuilder:
    """Accumulates the atoms of an exact per-iteration law, merging outcomes with equal tokens."""

    def __init__(self) -> None:
        self.mass: dict[tuple[int, ...], float] = {}

    def add(self, prefix: tuple[int, ...], weight: float, dist: torch.Tensor) -> None:
        """Atoms prefix + (y,) with probability weight * dist[y] (dist: a normalised [V] vector)."""
        if weight <= 0:
            return
        for y, prob in enumerate(dist.tolist()):
            if prob > 0:
                key = prefix + (y,)
                self.mass[key] = self.mass.get(key, 0.0) + weight * prob

    def outcomes(self) -> list[Outcome]:
        return [Outcome(prob, tokens, None) for tokens, prob in self.mass.items() if prob > 0]


def tensor_key(*tensors: torch.Tensor) -> tuple:
    """A hashable key for the values of ``tensors`` (dtype, shape and bytes of each, read to the host): for
    memo tables of the exact laws, whose inputs are small by contract."""
    return tuple((str(t.dtype), tuple(t.shape), t.detach().cpu().numpy().tobytes()) for t in tensors)


class ValueMemo:
    """Named memo tables keyed by value (``tensor_key``), for the exact laws on toy vocabularies: ``law()`` is
    called for every draft tuple of a toy and revisits the same rows each time. A table is emptied when it
    reaches ``max_entries`` (a bound on memory over long test sessions, not an eviction policy)."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self.tables: dict[str, dict] = {}

    def get(self, table: str, key, compute):
        """``compute()`` memoised under ``key`` in ``table``."""
        memo = self.tables.setdefault(table, {})
        if key not in memo:
            if len(memo) >= self.max_entries:
                memo.clear()
            memo[key] = compute()
        return memo[key]
