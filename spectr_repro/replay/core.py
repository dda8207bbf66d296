"""Shared-block replay: every rule at every K <= K_max and L <= L_max judged on ONE drafted block.

One draft of K_max rows x L_max tokens and one target forward over them hold a valid block for every
smaller (K, L): the first K rows are K i.i.d. drafts from q, and attention is causal, so the first L+1
target rows of a draft row are the target's conditionals for its first L tokens. Asking every rule what
it would emit on the sub-blocks of the same block pairs the rules on identical inputs: the differences
between rules lose the variance of each rule drawing its own drafts on its own trajectory.

Pure tensors in, numbers out (no models, files or configs): the driver is ``spectr_repro.replay.driver``.

Estimators (``BlockEstimate.estimator``):
    "exact"        the rule's own ``expected_emitted``: E[tau + 1 | drafts] in closed form, no noise;
    "monte_carlo"  the mean of tau + 1 over ``draws`` runs of the rule's sampler on the block. Draw j of
                   every (rule, K, L) is seeded alike (common random numbers), which correlates the
                   rules' noise on a block and so shrinks the variance of their paired differences;
    "control_variate"  for a rule whose registry entry names ``shares_draws_with`` (sbvf: sbv's sampler
                   plus a fallback): that rule's exact value plus the mean of (this draw - that draw) over
                   ``draws`` paired draws (same seed). Unbiased; its noise comes only from the draws where
                   the two rules decide differently (sbvf's fallback), so it is near-exact where they rarely do;
    "law"          sum of probability x length over the rule's exact outcome law (``Verifier.law``):
                   exact for every rule but for small vocabularies only (the toy tests use it).
Rules that carry state across iterations (gbv's carry-over) are run from a fresh state: their values are
first-iteration values (``first_iteration=True``), above what they average over a whole generation.

Shared work (issue 35; what each rule computes alone, to float round-off: tests/replay/test_shared_work.py):
K = 1 values of the lossless rules that reduce to a single-draft rule there (``single_draft_reductions``) are that
rule's closed form, computed once per row group; inside one block, sbv and sbvf compute the rule at each (row,
depth, K) once, mpbv sorts each path row once, rbv each draft's rows once and spectr solves each tree node's rho*
once (their ``shared_block``), across row groups, draws and L; sbv walks its events once for every L; sbvf's
paired draws come from one run each (``paired_draw``: sbv's sampler is its first stages).

Row groups (``row_groups``): the K_max rows are i.i.d., so every set of K distinct rows is a valid K-draft block.
"disjoint" (the default) averages a rule's value over the floor(K_max / K) disjoint groups of K consecutive rows
(rows [gK, (g + 1)K)): at K_max = 7, single-draft rules average 7 drafts and K = 3 rules 2 triples, which removes
much of the draft-to-draft noise from a block's value (and from the paired differences between K = 1 and K = 3)
at the cost of the rules' work only; "first" uses rows [:K] alone (the replays written before 2026-12-02).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spectr_repro.replay.support import compact_block
from spectr_repro.verify import VERIFIERS, get_verifier

ESTIMATORS = ("exact", "control_variate", "monte_carlo", "law")
# "auto": each rule's exact expectation where it has one, else Monte-Carlo draws of its sampler.
MODES = ("auto", "monte_carlo", "law")
ROW_GROUPS = ("disjoint", "first")


@dataclass(frozen=True)
class BlockEstimate:
    method: str
    K: int
    L: int
    tokens: float  # E[tau + 1] on this block: the tokens the rule emits for one target call
    estimator: str  # "exact", "control_variate" or "monte_carlo" (or "law")
    draws: int  # Monte-Carlo draws averaged, over every row group (0 for exact)
    first_iteration: bool  # the rule carries state: this is its value from a fresh state


def grid(methods: Sequence[str], K_values: Sequence[int], L_values: Sequence[int]) -> list[tuple[str, int, int]]:
    """Every (method, K, L) a replay evaluates: single-draft rules at K = 1 only (if 1 is asked)."""
    cells = []
    for method in methods:
        Ks = [K for K in K_values if K == 1] if VERIFIERS[method].single_draft else list(K_values)
        cells += [(method, int(K), int(L)) for K in Ks for L in L_values]
    return cells


def check_grid(methods: Sequence[str], K_values: Sequence[int], L_values: Sequence[int], draws: int) -> None:
    """ValueError with one message for a grid no replay can run (unknown rule, K or L < 1, ...)."""
    unknown = [m for m in methods if m not in VERIFIERS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; known: {', '.join(VERIFIERS)}")
    if not methods:
        raise ValueError("no method to replay")
    for name, values in (("K", K_values), ("L", L_values)):
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{name} values must be integers >= 1, got {list(values)}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be an integer >= 1, got {draws!r}")
    only_single = [m for m in methods if VERIFIERS[m].single_draft and 1 not in K_values]
    if only_single:
        raise ValueError(f"single-draft method(s) {', '.join(only_single)} verify one draft (K=1), but K="
                         f"{','.join(map(str, K_values))} has no 1: add K=1 or drop them")


def block_estimates(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    methods: Sequence[str],
    K_values: Sequence[int],
    L_values: Sequence[int],
    draws: int,
    generator: torch.Generator | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    mode: str = "auto",
    row_groups: str = "disjoint",
    sampled: Sequence[str] = (),
    support_mass: float | None = None,
) -> list[BlockEstimate]:
    """Tokens per target call of every (method, K, L) on sub-blocks of one block.

    draft_tokens [K_max, L_max], draft_probs [K_max, L_max, V], target_probs [K_max, L_max + 1, V]: one
    engine block (K_max i.i.d. drafts). Sub-block (K, L) = positions [:L] (target [:L + 1]) of rows [gK, (g + 1)K),
    averaged over the floor(K_max / K) groups g (``row_groups="disjoint"``) or of rows [:K] alone ("first"; single-
    draft rules then use row 0). ``generator`` seeds the Monte-Carlo draws (one seed per draw, shared by
    every rule: common random numbers). ``options``: per-rule options for ``get_verifier``. ``mode``:
    "auto" (exact where the rule has it, else Monte-Carlo), "monte_carlo" (always the sampler) or "law"
    (every rule through its exact law: small vocabularies only). ``sampled``: rules taken by their sampler's draws
    even where they have a closed form (the release's exact scan is a programme over the rejected prefixes, whose
    states grow quickly with L: on the Qwen pair at K=3, L=24 one block took minutes). ``support_mass``: judge the
    rules on the block's support (``replay.support.compact_block``: the tokens that carry its mass, at most this much
    of any row pooled into one tail token; exact values move by at most ~(L + 1) x this); None: the whole vocabulary.
    """
    _check_arguments(tuple(draft_tokens.shape), methods, K_values, L_values, draws, mode, row_groups)
    K_max = draft_tokens.shape[0]
    if support_mass is not None:
        draft_tokens, draft_probs, target_probs, _ = compact_block(draft_tokens, draft_probs, target_probs,
                                                                   support_mass)
    seeds = torch.randint(0, 2**62, (draws,), generator=generator, device=generator.device if generator
                          is not None else "cpu").tolist()  # one read per block
    options = options or {}
    controls = {VERIFIERS[m].shares_draws_with for m in methods} - {None} if mode == "auto" else set()
    reduced = single_draft_reductions(methods, K_values, options, sampled) if mode == "auto" else {}
    verifiers = {m: get_verifier(m, **{"check_inputs": False, **options.get(m, {})})
                 for m in {*methods, *controls, *reduced.values()}}
    paired = _paired_rules(methods, verifiers, options)
    block = (draft_tokens, draft_probs, target_probs)
    closed = _ClosedForms(verifiers, block, sorted(set(L_values)), set(sampled)) if mode == "auto" else None
    estimates = []
    with _shared_block(verifiers):
        for method, K, L in grid(methods, K_values, L_values):
            groups = range(K_max // K if row_groups == "disjoint" else 1)
            values = [_group_value(verifiers, closed, block, method, K, L, g, seeds, mode, reduced, paired)
                      for g in groups]
            tokens = sum(value for value, _, _ in values) / len(values)
            estimator, used = values[0][1], sum(draws_used for _, _, draws_used in values)
            estimates.append(BlockEstimate(method, K, L, tokens, estimator, used, VERIFIERS[method].carries_state))
    return estimates


def _check_arguments(shape: tuple[int, int], methods: Sequence[str], K_values: Sequence[int],
                     L_values: Sequence[int], draws: int, mode: str, row_groups: str) -> None:
    """ValueError unless the mode, row groups and grid are known and fit a block of ``shape`` (K_max, L_max)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if row_groups not in ROW_GROUPS:
        raise ValueError(f"row_groups must be one of {', '.join(ROW_GROUPS)}, got {row_groups!r}")
    K_max, L_max = shape
    check_grid(methods, K_values, L_values, draws)
    too_big = [v for v in K_values if v > K_max] + [v for v in L_values if v > L_max]
    if too_big:
        raise ValueError(f"K <= {K_max} and L <= {L_max} (the block's shape), got K={list(K_values)} "
                         f"L={list(L_values)}")


def _paired_rules(methods: Sequence[str], verifiers: dict[str, Any], options: dict[str, dict[str, Any]]
                  ) -> frozenset[str]:
    """The rules whose one run draws their control's sample too (``paired_draw``; sbvf: sbv's sampler is its first
    stages), with default options on both sides (the identity holds between the default rules)."""
    return frozenset(m for m in methods if hasattr(verifiers[m], "paired_draw") and VERIFIERS[m].shares_draws_with
                     and not options.get(m) and not options.get(VERIFIERS[m].shares_draws_with))


@contextlib.contextmanager
def _shared_block(verifiers: dict[str, Any]) -> Iterator[None]:
    """Every rule that can share work across the calls on one block's views opens its ``shared_block`` (sbv and
    sbvf one dict of rules by (row, depth, K), mpbv, rbv and spectr their own entries in it); dropped on exit."""
    with contextlib.ExitStack() as stack:
        cache: dict = {}
        for verifier in verifiers.values():
            if hasattr(verifier, "shared_block"):
                stack.enter_context(verifier.shared_block(cache))
        yield


def single_draft_reductions(methods: Sequence[str], K_values: Sequence[int], options: dict[str, dict[str, Any]],
                            sampled: Sequence[str] = ()) -> dict[str, str]:
    """{rule: the single-draft rule whose law it has at K = 1} for the rules whose K = 1 values the replay takes
    from that rule's closed form (``VerifierSpec.reduces_at_K1_to``, a law identity the registry's contract tests
    prove: rbv, sbv, sbvf, mpbv -> bv, spectr -> sd). At K_max = 7 a block has seven K = 1 groups per rule: each
    rule's own K = 1 evaluation (mpbv's greedy path, sbvf's draws, rbv's recursion) would repeat bv's number seven
    times over. Only for lossless rules (ours and SpecTr): the release's K = 1 = GBV is a claim of the paper that
    the report's verdicts test on these very values, so spectr_gbv keeps its own. Only with default options on both
    sides (an option may break the identity) and never for a rule in ``sampled`` (asked for by its draws)."""
    if 1 not in K_values:
        return {}
    return {m: base for m in methods if (base := VERIFIERS[m].reduces_at_K1_to) is not None and VERIFIERS[m].lossless
            and m not in sampled and base not in sampled and not options.get(m) and not options.get(base)}


def _group_value(verifiers, closed, block, method: str, K: int, L: int, group: int, seeds: list[int],
                 mode: str, reduced: dict[str, str] | None = None, paired: frozenset[str] = frozenset()
                 ) -> tuple[float, str, int]:
    """(tokens, estimator, draws) of ``method`` on positions [:L] of rows [group K, (group + 1) K)."""
    if K == 1 and closed is not None and method in (reduced or {}):
        value = closed.value(reduced[method], K, L, group)
        if value is not None:
            return value, "exact", 0
    draft_tokens, draft_probs, target_probs = block
    rows = slice(group * K, (group + 1) * K)
    sub_block = (draft_tokens[rows, :L], draft_probs[rows, :L], target_probs[rows, :L + 1])
    verifier = verifiers[method]
    control = VERIFIERS[method].shares_draws_with if closed is not None else None
    if mode == "law":
        return sum(o.probability * len(o.tokens) for o in verifier.law(*sub_block)), "law", 0
    if closed is not None and (value := closed.value(method, K, L, group)) is not None:
        return value, "exact", 0
    if control is not None and (base := closed.value(control, K, L, group)) is not None:
        if method in paired:
            difference = _mean_paired_difference(verifier, sub_block, seeds)
        else:
            difference = _mean_draw(verifier, sub_block, seeds) - _mean_draw(verifiers[control], sub_block, seeds)
        return base + difference, "control_variate", len(seeds)
    return _mean_draw(verifier, sub_block, seeds), "monte_carlo", len(seeds)


class _ClosedForms:
    """Each rule's closed form on the sub-blocks of one block, computed once per (rule, K, row group) for every L
    asked (``expected_emitted_by_length``: rules share work across L); None for a rule without one."""

    def __init__(self, verifiers: dict[str, Any], block, lengths: list[int], sampled: set[str] = frozenset()
                 ) -> None:
        self.verifiers, self.block, self.lengths = verifiers, block, lengths
        self.values: dict[tuple[str, int, int], dict[int, float] | None] = {
            (method, K, group): None for method in sampled for K in range(1, block[0].shape[0] + 1)
            for group in range(block[0].shape[0])}  # no closed form asked: the sampler's draws

    def value(self, method: str, K: int, L: int, group: int = 0) -> float | None:
        key = (method, K, group)
        if key not in self.values:
            tokens, draft_probs, target_probs = self.block
            rows = slice(group * K, (group + 1) * K)
            values = self.verifiers[method].expected_emitted_by_length(tokens[rows], draft_probs[rows],
                                                                       target_probs[rows], self.lengths)
            self.values[key] = None if values is None else {n: float(v) for n, v in values.items()}
        values = self.values[key]
        return None if values is None else values[L]


def _mean_paired_difference(verifier, block, seeds: list[int]) -> float:
    """Mean of (this rule's tau - its control's tau) over one run per seed of ``verifier.paired_draw``, which gives
    both (sbvf: sbv's sampler is its first stages): what two ``_mean_draw`` with the same seeds give, in one run."""
    device = block[1].device
    total = 0
    for seed in seeds:
        own, control = verifier.paired_draw(*block, generator=torch.Generator(device=device).manual_seed(seed))
        total += own - control
    return total / len(seeds)


def _mean_draw(verifier, block, seeds: list[int]) -> float:
    """Mean of tau + 1 over one run of the sampler per seed (the same seeds for every rule of a block). A rule that
    gives its draws' tau from one shared table (the release's ``sampled_lengths``: the same tau draw by draw) is
    asked once for every seed."""
    device = block[1].device
    if hasattr(verifier, "sampled_lengths"):
        generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        return sum(tau + 1 for tau in verifier.sampled_lengths(*block, generators)) / len(seeds)
    total = 0
    for seed in seeds:
        draw = torch.Generator(device=device).manual_seed(seed)
        total += int(verifier(*block, generator=draw).num_accepted) + 1
    return total / len(seeds)


@contextlib.contextmanager
def recursion_room(L_max: int) -> Iterator[None]:
    """Room for the rules whose exact law walks a block position by position (sbv's selection walk recurses once
    per position): Python's default limit (1000 frames) would end an L in the thousands in a RecursionError.
    Python-to-Python calls use no C stack since 3.11, so a larger limit is safe."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 4 * L_max + 1000))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


__all__ = ["BlockEstimate", "ESTIMATORS", "ROW_GROUPS", "block_estimates", "check_grid", "grid",
           "recursion_room", "single_draft_reductions"]
