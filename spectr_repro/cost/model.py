"""Seconds of a forward, a decoding call, a prompt and a cell: the one cost model (``plan``, ``check``, the bench).

A forward's seconds come from one of two sources, and every estimate says which:

- a calibration (``spectr_repro.cost.calibration``): seconds per forward of the pair's target and draft
  measured on this machine by ``python -m spectr_repro check`` at the shapes of the run (rows x new tokens
  on a cached context), plus the overhead per call the forwards do not explain;
- else the assumed roofline of the selected hardware (``hardware.estimate`` in conf/hardware/*.yaml):

      seconds per forward = overhead + weight bytes / bandwidth + tokens x 2 x params / compute

A call (one speculative iteration at K drafts of L tokens) is

    seconds per call = target(K rows x (L+1)) [+ target(1 x 1) at K > 1: the last emitted token, fed once]
                       + draft(1 x 2) (the pending tokens, fed once) + (L-1) x draft(K rows x 1)
                       + overhead per call (sampling, verification, cache bookkeeping; measured by ``check``)

(the roofline charges one target call over K x (L+1) tokens and L draft forwards over K rows). A prompt is
its prefill through target and draft plus its calls: tokens / block efficiency of them, the block efficiency
being the paper's for that pair and method when it gives one, else one measured by finished cells, else
(L+1)/2 (:func:`expected_block_efficiency` names which). A cell is its prompts plus the runner's warm-up.
The rules' own seconds (the replay's grid on a block) are measured by finished replay blocks
(:func:`rule_seconds_per_block`).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from spectr_repro.cost.calibration import Calibration, ForwardCosts
from spectr_repro.data import typical_prompt_tokens

GB = 1e9


# --------------------------------------------------------------------------------------------------
# One forward, one call


def forward_seconds(estimate: dict[str, Any], params: float, bytes_per_param: int, tokens: int) -> float:
    """One forward of a model with ``params`` parameters over ``tokens`` tokens, on the roofline of
    ``hardware.estimate`` (see the module docstring)."""
    memory = params * bytes_per_param / (float(estimate["bandwidth_gbs"]) * GB)
    compute = tokens * 2 * params / (float(estimate["compute_tflops"]) * 1e12)
    return float(estimate["overhead_ms"]) / 1e3 + memory + compute


def seconds_per_call(target: ForwardCosts, draft: ForwardCosts, K: int, L: int, overhead_s: float = 0.0,
                     batch: int = 1) -> float:
    """Seconds of one speculative iteration at K drafts of L tokens from measured forward costs (see the module
    docstring); ``batch`` prompts decoded together (``engine.generate_batch``) call the same forwards with
    ``batch`` x the rows."""
    shared_target = target.seconds(batch, 1) if K > 1 else 0.0
    return (target.seconds(batch * K, L + 1, "all") + shared_target + draft.seconds(batch, 2)
            + (L - 1) * draft.seconds(batch * K, 1) + overhead_s)


def calls_to_emit(new_tokens: int, tokens_per_call: float) -> float:
    """Expected target calls to emit ``new_tokens`` at ``tokens_per_call`` a call: the last call is cut at the
    length, so it yields only part of a block. By renewal theory the calls to pass N tokens number
    N/mu + E[X^2]/(2 mu^2) >= N/mu + 1/2 (X: a call's tokens, mu = E[X]); the replay gives mu only, so this is
    the +1/2 of a block of constant length, a lower bound (measured 2026-12-02, gbv K=1 L=6, 48 tokens: 9 calls a
    generation against 48/5.65 = 8.5)."""
    return new_tokens / tokens_per_call + 0.5


def rule_seconds_per_block(blocks: Iterable[dict]) -> tuple[float | None, str]:
    """The rules' seconds per replay block (mean ``rule_seconds`` of finished blocks) and where it comes from;
    None without a finished block."""
    seconds = [b["rule_seconds"] for b in blocks if "rule_seconds" in b]
    if not seconds:
        return None, "rules not estimated (no finished replay here)"
    mean = statistics.fmean(seconds)
    return mean, f"rules {mean:.3g} s per block, mean of {len(seconds)} finished replay block(s) here"


def model_calls_source(cfg: DictConfig, calibration: Calibration | None) -> str:
    """Where a cell's or a replay's model-call seconds come from: this machine's calibration, else the
    hardware's roofline, else nowhere (not estimated)."""
    estimate = cfg.hardware.get("estimate")
    if calibration is not None:
        return calibration.note
    if estimate is not None:
        return f"cost model, {estimate.get('device', 'hardware.estimate')}"
    return f"no cost model (hardware {cfg.choices.hardware} has no `estimate`): not estimated"


# --------------------------------------------------------------------------------------------------
# Tokens per call


def expected_block_efficiency(cfg: DictConfig, measured: dict[tuple, float]) -> tuple[float, str]:
    """Block efficiency to expect for the cell: the paper's, else measured here (``measured``: finished cells'
    per (pair, method, K, L)), else (L+1)/2; and which of the three."""
    method, pair, dataset = cfg.method.name, cfg.choices.model_pair, cfg.choices.dataset
    if method == "ar":
        return 1.0, "ar"
    paper = _paper_block_efficiency()
    for key in ((pair, dataset, method), (pair, "average", method)):
        if key in paper:
            return min(paper[key], cfg.L + 1.0), "paper"
    key = (pair, method, cfg.K, cfg.L)
    if key in measured:
        return measured[key], "measured"
    return (cfg.L + 1) / 2, "(L+1)/2"


@functools.cache
def _paper_block_efficiency() -> dict[tuple[str, str, str], float]:
    from spectr_repro.paper import load_paper_numbers

    table = load_paper_numbers()
    table = table[table["metric"] == "block_efficiency"]
    return {(r.model_pair, r.dataset, r.method): float(r.value) for r in table.itertuples() if r.model_pair}


# --------------------------------------------------------------------------------------------------
# A prompt, a cell


def _params(pair: dict, role: str) -> float:
    """Parameters of the pair's ``role`` model: ``params_b`` of its config; the tiny pair's are ~1e5."""
    if pair.get("source") == "tiny":
        return 1e5
    return float((pair.get(role) or {}).get("params_b") or 1.0) * 1e9


def _width(cfg: DictConfig, pair: dict) -> int:
    dtype = str(cfg.hardware.get("dtype") or pair.get("dtype") or "float32")
    return 4 if dtype == "float32" else 2


def cell_seconds(cfg: DictConfig, pair: dict, block_efficiency: float, calibration: Calibration | None = None,
                 batches: Sequence[int] = ()) -> float | None:
    """Estimated seconds of one cell on ``cfg.hardware`` (warm-up included); None when there is no calibration
    and the hardware config has no ``estimate``. With a ``calibration`` its costs replace the roofline, and
    ``batches`` (the sizes of the groups of untimed prompts decoded together, ``runner.batched``) count."""
    if calibration is not None:
        return calibrated_cell_seconds(cfg, calibration, block_efficiency, batches)
    if cfg.hardware.get("estimate") is None:
        return None
    estimate = OmegaConf.to_container(cfg.hardware.estimate, resolve=True)
    target, width = _params(pair, "target"), _width(cfg, pair)
    prompt = typical_prompt_tokens(cfg.choices.dataset)
    tokens = cfg.max_new_tokens
    if cfg.method.name == "ar":
        per_prompt = forward_seconds(estimate, target, width, prompt) + tokens * forward_seconds(
            estimate, target, width, 1)
    else:
        per_prompt = speculative_prompt_seconds(cfg, pair, cfg.K, cfg.L, math.ceil(tokens / block_efficiency))
    warmup = forward_seconds(estimate, target, width, 32) + 8 * forward_seconds(estimate, target, width, 1)
    return cfg.num_prompts * per_prompt + warmup


def speculative_prompt_seconds(cfg: DictConfig, pair: dict, K: int, L: int, iterations: int) -> float | None:
    """One prompt decoded alone at K drafts of L tokens, on the roofline (None without ``estimate``): the
    prompt through target and draft, then per iteration one target call over K x (L+1) tokens and L draft
    forwards over K rows."""
    if cfg.hardware.get("estimate") is None:
        return None
    estimate = OmegaConf.to_container(cfg.hardware.estimate, resolve=True)
    target, draft, width = _params(pair, "target"), _params(pair, "draft"), _width(cfg, pair)
    prompt = typical_prompt_tokens(cfg.choices.dataset)
    prefill = forward_seconds(estimate, target, width, prompt) + forward_seconds(estimate, draft, width, prompt)
    target_call = forward_seconds(estimate, target, width, K * (L + 1))
    draft_step = forward_seconds(estimate, draft, width, K)
    return prefill + iterations * (target_call + L * draft_step)


def calibrated_cell_seconds(cfg: DictConfig, calibration: Calibration, block_efficiency: float,
                            batches: Sequence[int] = ()) -> float:
    """Seconds of one cell from measured forward costs: per prompt the prefill (in ``hardware.prefill_chunk``
    chunks) and the decoding calls; the prompts of ``batches`` (group sizes, B > 1 with
    ``hardware.batch_prompts``) decode a group at a time (B*K rows per call), the others alone, as
    ``runner.batched`` runs them."""
    target = calibration.target
    tokens = cfg.max_new_tokens
    timed = cfg.num_prompts - sum(batches)

    def prompts_seconds(batch: int) -> float:
        """``batch`` prompts decoded together (1: alone)."""
        if cfg.method.name == "ar":
            prefill = sum(target.seconds(1, n) for n in prefill_pieces(cfg)) * batch
            return prefill + tokens * target.seconds(batch, 1)  # the per-call overhead is measured on sd-like loops
        return calibrated_prompt_seconds(cfg, calibration, cfg.K, cfg.L, math.ceil(tokens / block_efficiency),
                                         batch)

    seconds = timed * prompts_seconds(1) + sum(prompts_seconds(size) for size in batches)
    warmup = target.seconds(1, 32) + 8 * target.seconds(1, 1)
    return seconds + warmup


def calibrated_prompt_seconds(cfg: DictConfig, calibration: Calibration, K: int, L: int, iterations: int,
                              batch: int = 1) -> float:
    """``batch`` prompts decoded together at K drafts of L tokens, from measured forward costs: each prompt
    through target and draft (in ``hardware.prefill_chunk`` chunks), then ``iterations`` calls."""
    target, draft = calibration.target, calibration.draft
    overhead = float(calibration.extra.get("overhead_s_per_call", 0.0))
    prefill = sum(target.seconds(1, n) + draft.seconds(1, n) for n in prefill_pieces(cfg)) * batch
    return prefill + iterations * seconds_per_call(target, draft, K, L, overhead, batch=batch)


def prompt_seconds(cfg: DictConfig, pair: dict | None, calibration: Calibration | None, K: int, L: int,
                   iterations: int) -> float | None:
    """One prompt decoded alone at K drafts of L tokens: calibrated when ``calibration`` is given, else on the
    roofline of the ``pair`` config (None without ``hardware.estimate``)."""
    if calibration is not None:
        return calibrated_prompt_seconds(cfg, calibration, K, L, iterations)
    return speculative_prompt_seconds(cfg, pair, K, L, iterations)


def prefill_pieces(cfg: DictConfig) -> list[int]:
    """The prompt's prefill chunks (tokens each; ``hardware.prefill_chunk``, else the whole prompt)."""
    prompt = typical_prompt_tokens(cfg.choices.dataset)
    chunk = int(cfg.hardware.get("prefill_chunk") or prompt)
    return [chunk] * (prompt // chunk) + ([prompt % chunk] if prompt % chunk else [])


__all__ = ["GB", "calibrated_cell_seconds", "calibrated_prompt_seconds", "calls_to_emit", "cell_seconds",
           "expected_block_efficiency", "forward_seconds", "model_calls_source", "prefill_pieces", "prompt_seconds",
           "rule_seconds_per_block", "seconds_per_call", "speculative_prompt_seconds"]
