"""Predicted speed-ups over AR at a batch of B prompts on a named accelerator: A MODEL, not a measurement.

For B prompts decoded together, one call at K drafts of L tokens costs (the one cost model's ``seconds_per_call``
on the roofline's forwards, :class:`~spectr_repro.cost.shapes.ModelledForwardCosts` at the accelerator's peaks):

    call(B) = draft(B rows x 2 pending tokens) + (L - 1) x draft(B*K rows x 1) + target(B*K rows x (L + 1), all logits)
    AR(B)   = target(B rows x 1)                     speed-up(B) = tokens per call x AR(B) / call(B)

each forward max(bytes / bandwidth, FLOPs / peak) with the weights read once for all its rows and attention and KV
reads per row over ``context`` cached tokens. At small B every forward is bound by reading the weights, so a call
costs about L + 1 weight reads and the speed-up is the tokens per call over that; once the verify forward's
B*K*(L+1) tokens pass the ridge point (peak FLOP/s / bandwidth, per byte of weight) it is compute-bound and grows
with B, while AR's forward stays bound by the weights longer: the speed-up falls, and a K-draft rule, whose verify
carries K times SD's tokens, reaches the ridge at a K times smaller B and loses its edge first. The rules' own
seconds and any per-forward overhead are left out (an ideal implementation).

Tokens per call are an input: a replay's (``replay_summary.csv``) or :func:`assumed_tokens_per_call`, a stated
assumption (i.i.d. per-position acceptance), not a measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd

from spectr_repro.cost.model import (
    SECTIONS,
    CallCosts,
    chunked_prefill_seconds,
    seconds_per_call,
    section_forward_seconds,
)
from spectr_repro.cost.shapes import ModelledForwardCosts, ModelShape

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
METHODS = ("ar", "sd", "spectr", "spectr_gbv", "sbvf")
SINGLE_DRAFT = ("ar", "sd")
KS, LS = (1, 3), (4, 6)
LABEL = "a model (roofline at spec-sheet peaks, ideal kernels, no overhead, no rule time), not a measurement"


def assumed_tokens_per_call(method: str, K: int, L: int, acceptance: float = 0.8) -> float:
    """Tokens per call under i.i.d. per-position acceptance ``acceptance`` for one draft, and 1 - (1 - a)^K for K
    drafts (an optimistic multi-draft rule: some draft survives each position): sum of a^i for i = 0..L. AR: 1."""
    if method == "ar":
        return 1.0
    a = 1.0 - (1.0 - acceptance) ** (1 if method in SINGLE_DRAFT else K)
    return float(sum(a ** i for i in range(L + 1)))


def settings(methods: Sequence[str] = METHODS, Ks: Iterable[int] = KS, Ls: Iterable[int] = LS
             ) -> list[tuple[str, int, int]]:
    """(method, K, L) of the prediction: AR once, SD at K = 1, the multi-draft rules at every K and L."""
    rows = []
    for method in methods:
        for K in ((1,) if method in SINGLE_DRAFT else tuple(Ks)):
            rows += [(method, K, L) for L in ((1,) if method == "ar" else tuple(Ls))]
    return rows


def batch_speedups(target: ModelShape, draft: ModelShape, rates, tokens_per_call: Callable[[str, int, int], float]
                   | Mapping[tuple[str, int, int], float], context: int, batches: Sequence[int] = BATCHES,
                   grid: Sequence[tuple[str, int, int]] | None = None, width: int = 2) -> pd.DataFrame:
    """One row per (method, K, L, B): tokens per call, seconds per call, AR's seconds per token at B, the speed-up
    over AR at the same B, and whether the verify forward's tokens are past the ridge point (``rates``: a
    :class:`~spectr_repro.cost.shapes.Rates`, e.g. ``Accelerator.rates()``)."""
    tokens = tokens_per_call if callable(tokens_per_call) else (lambda m, k, l_: tokens_per_call[(m, k, l_)])
    t = ModelledForwardCosts(target, rates, width, context)
    d = ModelledForwardCosts(draft, rates, width, context)
    ridge = rates.ridge_tokens(target, width)
    rows = []
    for method, K, L in grid or settings():
        tau = tokens(method, K, L)
        for B in batches:
            ar = t.seconds(B, 1)
            call = ar if method == "ar" else seconds_per_call(t, d, K, L, batch=B)
            verified = B * (1 if method == "ar" else K * (L + 1))
            rows.append({"method": method, "K": K, "L": L, "B": B, "tokens_per_call": tau, "seconds_per_call": call,
                         "ar_seconds_per_token": ar, "speedup": tau * ar / call, "verify_tokens": verified,
                         "compute_bound": verified > ridge, "model": LABEL})
    return pd.DataFrame(rows)


def batch_decode_seconds(costs: CallCosts, method: str, K: int, L: int, prompt_tokens: Sequence[int],
                         calls_per_prompt: Sequence[int], new_tokens: int, chunk: int | None = None,
                         prefill: bool = True) -> float:
    """Seconds the one cost model gives to ``engine.generate_batch`` decoding these prompts together, each making
    ``calls_per_prompt[i]`` calls (AR: one per token) and emitting ``new_tokens`` (EOS off):

        prefill  = each prompt alone through the target (and the draft), chunked       (engine.batched._prefill)
        call c   = the forwards at a(c) prompts = #{i : calls_i >= c} (B*K rows, shrinking as prompts finish)
                   + a(c) x the rule's call + each section's overhead at a(c) prompts

    The rule is charged per prompt because the engine verifies each prompt in its own Python loop; the forwards
    read the weights once for all rows; the overheads are once per call plus once per prompt when the calibration
    decoded at two batch sizes (``SectionOverheads``), else all per prompt. Calls are priced on the batch's cache
    width, its longest prompt plus half the new tokens: the engine left-pads every row to the longest
    (``engine.batch_cache``), and every row's forward reads that width (priced at the prompts' mean context, the
    K = 3 rules at B = 8 ran up to 58 % slower than predicted, 2026-12-07).
    ``prefill`` False: the decoding after the prefill only."""
    context = max(int(n) for n in prompt_tokens) + int(new_tokens) // 2
    speculative = method != "ar"
    prefill = sum(chunked_prefill_seconds(costs.target, n, chunk)
                  + (chunked_prefill_seconds(costs.draft, n, chunk) if speculative else 0.0)
                  for n in prompt_tokens) if prefill else 0.0
    if not speculative:
        batch = len(prompt_tokens)
        step = costs.overheads.ar_step_seconds(batch) if costs.overheads else None
        if step is None:  # overheads measured at B = 1 only: all of it per prompt
            step = batch * max(0.0, costs.ar_token_seconds(context) - costs.target.seconds(1, 1, context=context))
        return prefill + max(calls_per_prompt) * (costs.target.seconds(batch, 1, context=context) + max(0.0, step))

    def overheads(active: int) -> float:
        # a least-squares fit of the overheads can dip below 0 between its corners; a call never costs less than
        # its forwards and its rule
        if not costs.overheads:
            return 0.0
        return max(0.0, sum(costs.overheads.batch_seconds(section, K, L, context, active) for section in SECTIONS))

    rule = costs.rule_call_seconds(method, K, L)
    seconds = prefill
    for call in range(1, max(calls_per_prompt) + 1):
        active = sum(calls >= call for calls in calls_per_prompt)
        seconds += sum(section_forward_seconds(costs.target, costs.draft, K, L, context, active).values())
        seconds += active * rule + overheads(active)
    return seconds


__all__ = ["BATCHES", "KS", "LABEL", "LS", "METHODS", "assumed_tokens_per_call", "batch_decode_seconds",
           "batch_speedups", "settings"]
