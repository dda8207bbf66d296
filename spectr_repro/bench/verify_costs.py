"""GPU cost of every registered verification rule per call, counted on the CPU (bench.counters).

    from spectr_repro.bench.verify_costs import rule_costs
    rows = rule_costs()                       # synthetic blocks, K in {1, 3, 7}, L in {4, 12, 24}
    rows = rule_costs(real_blocks, Ks=(), Ls=())   # only the given (draft_tokens, draft_probs, target_probs)

One row per (rule, K, L, block kind, carried frames): the worst ops (kernel launches) and host reads
(device -> host synchronisations) over the calls of that group, their means and the number of calls.
Single-draft rules run at K = 1 only; on a real block with K > 1 they verify its first draft (an i.i.d.
draft of the same q, so a valid single-draft input). Rules that carry state (gbv) are also counted with
1-3 carried frames, built as in tests/verify/test_op_budgets.py. Counts are deterministic given the
seeds: they are what the benchmark reports beside its timings, never timings themselves.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from spectr_repro.bench.blocks import AGREEMENTS, synthetic_block
from spectr_repro.bench.counters import count_ops
from spectr_repro.verify import VERIFIERS, get_verifier
from spectr_repro.verify.carry_over import CarryFrame, CarryOverState

# q far from p (rejections early) and close to p (acceptance deep into the block).
DRAFT_NOISES = {"far": 1.0, "close": 0.05}


@dataclass(frozen=True)
class CostRow:
    rule: str
    K: int
    L: int
    block: str  # "<agreement>/<far|close>" for synthetic blocks, "real" for given ones
    carried_frames: int  # frames alive in the state handed to the rule (0 for rules without state)
    calls: int
    ops: int  # worst over the calls
    host_reads: int  # worst over the calls
    mean_ops: float
    mean_host_reads: float

    def as_dict(self) -> dict:
        return asdict(self)


def carried_state(L: int, frames: int) -> CarryOverState | None:
    """``frames`` live carry-over frames (oldest first, each expiring before the next), None for 0."""
    if frames == 0:
        return None
    return CarryOverState(tuple(CarryFrame(log_ratio=0.4 * (j + 1) - 0.5, remaining=max(1, (j + 1) * L // frames))
                                for j in range(frames)))


def _count_calls(verifier, block, states, seeds) -> dict[int, list[tuple[int, int]]]:
    """(ops, host reads) of each call, keyed by the number of carried frames."""
    out: dict[int, list[tuple[int, int]]] = {}
    for frames, state in states:
        for seed in seeds:
            generator = torch.Generator(device=block[1].device).manual_seed(seed)
            with count_ops() as counts:
                verifier(*block, generator=generator, state=state)
            out.setdefault(frames, []).append((counts.ops, counts.host_reads))
    return out


def _rows(name: str, K: int, L: int, kind: str, calls: dict[int, list[tuple[int, int]]]) -> list[CostRow]:
    rows = []
    for frames, counted in sorted(calls.items()):
        ops, reads = zip(*counted)
        rows.append(CostRow(name, K, L, kind, frames, len(counted), max(ops), max(reads),
                            sum(ops) / len(ops), sum(reads) / len(reads)))
    return rows


def _merge(into: dict, more: dict) -> None:
    for key, counted in more.items():
        into.setdefault(key, []).extend(counted)


def rule_costs(
    real_blocks: Iterable[Sequence[torch.Tensor]] | None = None,
    *,
    rules: Iterable[str] | None = None,
    Ks: Iterable[int] = (1, 3, 7),
    Ls: Iterable[int] = (4, 12, 24),
    V: int = 32_022,
    seeds: Iterable[int] = range(4),
    frames: Iterable[int] = (0, 1, 2, 3),
    block_seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[CostRow]:
    """Op and host-read counts of every rule (default: every registered one) per verify call.

    Synthetic blocks: every K in ``Ks`` and L in ``Ls`` (single-draft rules at K = 1 only), V entries, both
    agreements (drafts parting at once / agreeing everywhere) and both draft noises, ``seeds`` of the
    rule's own uniforms. ``real_blocks``: (draft_tokens [K, L], draft_probs [K, L, V], target_probs
    [K, L+1, V]) triples, grouped by their (K, L) under block kind "real". ``frames``: carried frames
    tried for rules that carry state (0 = no state). Rules run with default options, check_inputs=False
    (as the engine runs them).
    """
    names = list(VERIFIERS) if rules is None else list(rules)
    unknown = [name for name in names if name not in VERIFIERS]
    if unknown:
        raise ValueError(f"rule_costs: unknown rules {unknown}; known: {', '.join(VERIFIERS)}")
    seeds, frames, Ks, Ls = list(seeds), list(frames), list(Ks), list(Ls)
    if not seeds:
        raise ValueError("rule_costs: need at least one seed")
    if any(f < 0 for f in frames) or 0 not in frames:
        raise ValueError(f"rule_costs: frames must be non-negative counts including 0, got {frames}")
    real = [tuple(block) for block in (real_blocks or [])]
    for block in real:
        if len(block) != 3 or block[0].dim() != 2:
            raise ValueError("rule_costs: each real block must be (draft_tokens [K, L], draft_probs, target_probs)")
    rows: list[CostRow] = []
    for name in names:
        spec = VERIFIERS[name]
        verifier = get_verifier(name, check_inputs=False)

        def states(L: int, spec=spec):
            return [(f, carried_state(L, f)) for f in (frames if spec.carries_state else [0])]

        for K, L in itertools.product(Ks, Ls):
            if spec.single_draft and K != 1:
                continue
            for agreement, (noise_name, noise) in itertools.product(AGREEMENTS, DRAFT_NOISES.items()):
                block = synthetic_block(K, L, V, agreement=agreement, seed=block_seed + K * 100 + L,
                                        draft_noise=noise, device=device)
                calls = _count_calls(verifier, block, states(L), seeds)
                rows += _rows(name, K, L, f"{agreement}/{noise_name}", calls)
        by_shape: dict[tuple[int, int], dict[int, list[tuple[int, int]]]] = {}
        for block in real:
            if spec.single_draft:
                block = (block[0][:1], block[1][:1], block[2][:1])
            K, L = block[0].shape
            _merge(by_shape.setdefault((K, L), {}), _count_calls(verifier, block, states(L), seeds))
        for (K, L), calls in sorted(by_shape.items()):
            rows += _rows(name, K, L, "real", calls)
    return rows


def worst_by_rule(rows: Iterable[CostRow]) -> dict[tuple[str, int, int], tuple[int, int]]:
    """(rule, K, L) -> (worst ops, worst host reads) over every block kind and carried state."""
    worst: dict[tuple[str, int, int], tuple[int, int]] = {}
    for row in rows:
        key = (row.rule, row.K, row.L)
        ops, reads = worst.get(key, (0, 0))
        worst[key] = (max(ops, row.ops), max(reads, row.host_reads))
    return worst


@dataclass(frozen=True)
class TimeRow:
    rule: str
    K: int
    L: int
    block: str  # "<agreement>/<far|close>"
    calls: int
    median_ms: float  # wall time per verify call, median over the calls (indicative: depends on the machine)


def rule_times(
    *,
    rules: Iterable[str] | None = None,
    Ks: Iterable[int] = (3, 7),
    Ls: Iterable[int] = (12,),
    V: int = 151_936,
    seeds: Iterable[int] = range(8),
    block_seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[TimeRow]:
    """Wall time per verify call of each rule on the synthetic blocks of ``rule_costs`` (one warm-up call per
    block first, so that buffers and caches are in place). All rules in one process: compare their ratios."""
    names = list(VERIFIERS) if rules is None else list(rules)
    unknown = [name for name in names if name not in VERIFIERS]
    if unknown:
        raise ValueError(f"rule_times: unknown rules {unknown}; known: {', '.join(VERIFIERS)}")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("rule_times: need at least one seed")
    rows: list[TimeRow] = []
    for name in names:
        verifier = get_verifier(name, check_inputs=False)
        for K, L in itertools.product(Ks, Ls):
            if VERIFIERS[name].single_draft and K != 1:
                continue
            for agreement, (noise_name, noise) in itertools.product(AGREEMENTS, DRAFT_NOISES.items()):
                block = synthetic_block(K, L, V, agreement=agreement, seed=block_seed + K * 100 + L,
                                        draft_noise=noise, device=device)
                verifier(*block, generator=torch.Generator(device=block[1].device).manual_seed(2**31 - 1))  # warm-up
                elapsed = []
                for seed in seeds:
                    generator = torch.Generator(device=block[1].device).manual_seed(seed)
                    if block[1].device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    verifier(*block, generator=generator)
                    if block[1].device.type == "cuda":
                        torch.cuda.synchronize()
                    elapsed.append(time.perf_counter() - start)
                rows.append(TimeRow(name, K, L, f"{agreement}/{noise_name}", len(elapsed),
                                    1000 * statistics.median(elapsed)))
    return rows


__all__ = ["DRAFT_NOISES", "CostRow", "TimeRow", "carried_state", "rule_costs", "rule_times", "worst_by_rule"]
