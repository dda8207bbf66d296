"""A roofline for a named accelerator: what physics allows a forward, a speculative call and a speed-up to cost.

A MODEL, not a measurement: every number it gives is a lower bound on seconds (an upper bound on speed) on an
ideal implementation of the forward, from spec-sheet peaks (``accelerators.yaml``, each with its source) and the
model's architecture (its ``config.json``: ``spectr_repro/check/configs/``, the copies ``check
check.random_weights=true`` builds random-weight models from). One forward of ``rows`` sequences, each feeding
``tokens`` new tokens on top of ``context`` cached ones, costs

    memory  = (weight bytes + rows x (context + tokens) x KV bytes per token) / peak memory bandwidth
    compute = (2 x body params x rows x tokens + 2 x vocab x hidden x head positions
               + attention: 4 x layers x heads x head_dim x rows x tokens x (context + (tokens + 1) / 2)) / peak FLOP/s
    seconds = max(memory, compute) + overhead (a fixed per-forward overhead, 0 unless said)

- The weights are read once per forward whatever the rows (a batched matmul streams each weight once), except the
  input embedding of an untied model: a lookup reads only the rows of the tokens fed, so it is not charged.
- max, not sum: a well-pipelined kernel streams the next weights while the tensor cores work on the last ones, so
  the two overlap and the slower bounds the time; a sum would charge them as if they never ran at once, a
  different (pessimistic) model. The max is the classic roofline, and the bound a real forward cannot beat.
- The overhead (Python, kernel launches, an eager HuggingFace forward's ~10-20 ms on a GPU) is what a roofline
  leaves out; it is a parameter (default 0) so that every use says what it assumed.

A speculative call is priced by the one cost model's :func:`spectr_repro.cost.model.seconds_per_call` on the
roofline's :class:`~spectr_repro.cost.calibration.ForwardCosts` (:func:`roofline_forward_costs`), so the
roofline and a calibration of this machine go through the same formula (:func:`roofline_seconds_per_call`). The
speed-up a roofline allows at batch 1 is AR's seconds per token (one target forward of 1 x 1) over the call's
seconds per emitted token (seconds per call / block efficiency): :func:`allowed_speedup`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from spectr_repro.cost.calibration import Calibration, ForwardCosts
from spectr_repro.cost.model import seconds_per_call
from spectr_repro.cost.shapes import (
    ARCHITECTURE_CONFIGS,
    ModelShape,
    Rates,
    model_shape,
    pair_shapes,
    shape_from_config,
    width_of,
)
from spectr_repro.paper import load_paper_numbers, release_numbers
from spectr_repro.verify import VERIFIERS

ACCELERATORS_YAML = Path(__file__).resolve().parent / "accelerators.yaml"
PAPER_MAIN_YAML = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "paper_main.yaml"
RELEASE_YAML = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "release_humaneval.yaml"
# The release ran on one H20 (its README); its prompts are HumanEval's (~150 tokens) and it generates 64 tokens, so
# a forward sits on ~200 cached tokens on average.
RELEASE_ACCELERATOR = "H20"
RELEASE_CONTEXT = 200
# The accelerators the paper's speed-ups are set against (the paper does not name its GPU; the release used an H20).
PAPER_ACCELERATORS = ("A100-80GB", "H100", "H20")
# Cached tokens under each forward of the paper's table: a prompt of a few hundred tokens plus, on average, half of
# the 256 new tokens of our paper_main cells (the paper publishes neither). At 512 the KV cache is < 7 % of the
# bytes of a 6.7B forward at K=3 rows and < 1 % of a 33B one, so the table barely depends on it.
PAPER_CONTEXT = 512
# The label every table of this module carries.
MODEL_LABEL = "a roofline (spec-sheet peaks, ideal kernels, no overhead): an upper bound on speed"


# --------------------------------------------------------------------------------------------------
# Accelerators


@dataclass(frozen=True)
class Accelerator:
    """Peak figures of one accelerator (spec sheet, or measured here for this machine's CPU)."""

    key: str
    name: str
    bandwidth_gbs: float  # peak memory bandwidth, GB/s (1e9 bytes/s)
    bf16_tflops: float  # peak dense bfloat16 TFLOP/s (for a CPU: the matmul rate measured in its dtype)
    memory_gb: float | None = None
    source: str = ""
    recorded: str = ""
    verified: bool = False

    @property
    def note(self) -> str:
        return f"{self.name}: {self.bandwidth_gbs:,.0f} GB/s, {self.bf16_tflops:,.4g} TFLOP/s ({self.source})"

    def rates(self, overhead_s: float = 0.0) -> Rates:
        """The roofline's rates: peaks, attention at the tensor-core peak, max(memory, compute)."""
        return Rates(self.bandwidth_gbs, self.bf16_tflops, self.bf16_tflops, overhead_s, "max", self.key)


@functools.cache
def load_accelerators(path: Path = ACCELERATORS_YAML) -> dict[str, Accelerator]:
    """Every accelerator of ``accelerators.yaml`` by key."""
    entries = yaml.safe_load(Path(path).read_text(encoding="utf-8"))["accelerators"]
    return {key: Accelerator(key=key, name=str(e["name"]), bandwidth_gbs=float(e["bandwidth_gbs"]),
                             bf16_tflops=float(e["bf16_tflops"]), memory_gb=float(e["memory_gb"]),
                             source=" ".join(str(e["source"]).split()), recorded=str(e["recorded"]),
                             verified=bool(e.get("verified", False)))
            for key, e in entries.items()}


def accelerator(key: str) -> Accelerator:
    """The accelerator ``key`` of ``accelerators.yaml``; ValueError naming the known ones."""
    known = load_accelerators()
    if key not in known:
        raise ValueError(f"unknown accelerator {key!r} (known: {', '.join(known)})")
    return known[key]


def measured_accelerator(name: str, bandwidth_gbs: float, tflops: float, source: str) -> Accelerator:
    """An accelerator from figures measured on this machine (``cost.measure.measure_memory_bandwidth``)."""
    return Accelerator(key=name, name=name, bandwidth_gbs=float(bandwidth_gbs), bf16_tflops=float(tflops),
                       source=source, verified=True)


# --------------------------------------------------------------------------------------------------
# One forward, one call, one speed-up


def roofline_forward_seconds(shape: ModelShape, device: Accelerator, rows: int, tokens: int, context: int,
                             logits: str = "last", width: int = 2, overhead_s: float = 0.0) -> float:
    """Seconds of one forward on the roofline (module docstring): max(bytes / bandwidth, FLOPs / peak) +
    ``overhead_s``. ``width``: bytes per weight and cache entry (2 in bfloat16/float16)."""
    return device.rates(overhead_s).seconds(shape, rows, tokens, context, logits, width)


def roofline_forward_costs(shape: ModelShape, device: Accelerator, shapes: Iterable[tuple[int, int, str]],
                           context: int, width: int = 2, overhead_s: float = 0.0) -> ForwardCosts:
    """The roofline's seconds at each (rows, tokens per row, logits) shape, as the ``ForwardCosts`` a calibration
    holds: :func:`spectr_repro.cost.model.seconds_per_call` prices a call from it unchanged."""
    return ForwardCosts(tuple((int(r), int(t), str(k), roofline_forward_seconds(shape, device, r, t, context, k,
                                                                                width, overhead_s))
                              for r, t, k in shapes))


def call_shapes(K: int, L: int) -> dict[str, list[tuple[int, int, str]]]:
    """The forwards ``seconds_per_call`` asks for at K drafts of L tokens (batch 1), per role, plus AR's step."""
    return {"target": [(1, 1, "last"), (K, L + 1, "all")], "draft": [(1, 2, "last"), (K, 1, "last")]}


def roofline_call_costs(target: ModelShape, draft: ModelShape, device: Accelerator, K: int, L: int, context: int,
                        width: int = 2, overhead_s: float = 0.0) -> tuple[ForwardCosts, ForwardCosts]:
    """(target, draft) ``ForwardCosts`` on the roofline at the shapes of one call at (K, L)."""
    shapes = call_shapes(K, L)
    return (roofline_forward_costs(target, device, shapes["target"], context, width, overhead_s),
            roofline_forward_costs(draft, device, shapes["draft"], context, width, overhead_s))


def roofline_seconds_per_call(target: ForwardCosts, draft: ForwardCosts, K: int, L: int) -> float:
    """Seconds of one call at (K, L) from roofline costs, by ``seconds_per_call`` (our engine's call layout: the
    K rows each carry the last emitted token, so one target forward per call, as an ideal implementation)."""
    return seconds_per_call(target, draft, K, L)


def allowed_speedup(target_shape: ModelShape, draft_shape: ModelShape, device: Accelerator, K: int, L: int,
                    block_efficiency: float, context: int, width: int = 2, overhead_s: float = 0.0) -> float:
    """The speed-up over AR the roofline allows at batch 1: AR's seconds per token (one target forward, 1 x 1)
    over the call's seconds per token (:func:`roofline_seconds_per_call` / ``block_efficiency``). ``overhead_s``
    is added to every forward, AR's included (0: none)."""
    target, draft = roofline_call_costs(target_shape, draft_shape, device, K, L, context, width, overhead_s)
    ar_per_token = target.seconds(1, 1)
    return ar_per_token * block_efficiency / roofline_seconds_per_call(target, draft, K, L)


def allowed_tokens_per_s(target_shape: ModelShape, draft_shape: ModelShape, device: Accelerator, K: int, L: int,
                         block_efficiency: float, context: int, width: int = 2, overhead_s: float = 0.0) -> float:
    """Decoding tokens/s the roofline allows at batch 1: block efficiency / seconds per call (no prefill)."""
    target, draft = roofline_call_costs(target_shape, draft_shape, device, K, L, context, width, overhead_s)
    return block_efficiency / roofline_seconds_per_call(target, draft, K, L)


def forwards_per_call(K: int, L: int) -> int:
    """Model forwards in one call, as ``seconds_per_call`` counts them: the target's call, the draft's pending
    tokens, L-1 draft steps (K does not change the count: the K rows go through each forward together)."""
    return L + 1


def implied_overhead_s(target_shape: ModelShape, draft_shape: ModelShape, device: Accelerator, K: int, L: int,
                       block_efficiency: float, context: int, speedup: float, width: int = 2) -> float | None:
    """The fixed per-forward overhead o (on AR's forward and every forward of a call alike) at which the roofline
    gives ``speedup``: BE (ar + o) / (call + n o) = speedup, n = :func:`forwards_per_call`, solved for o. As o grows
    the speed-up moves from the roofline's towards BE / n; None when ``speedup`` is not between the two (no o >= 0
    gives it)."""
    target, draft = roofline_call_costs(target_shape, draft_shape, device, K, L, context, width)
    ar, call = target.seconds(1, 1), roofline_seconds_per_call(target, draft, K, L)
    n = forwards_per_call(K, L)
    denominator = block_efficiency - speedup * n
    if denominator == 0:
        return None
    overhead = (speedup * call - block_efficiency * ar) / denominator
    return overhead if overhead >= 0 else None


def implied_overhead_from_tokens_per_s(target_shape: ModelShape, draft_shape: ModelShape, device: Accelerator, K: int,
                                       L: int, block_efficiency: float, context: int, tokens_per_s: float,
                                       width: int = 2) -> float | None:
    """The per-forward overhead o at which the roofline gives ``tokens_per_s``: BE / (call + n o) = tokens/s
    (None when the rate is above the roofline's)."""
    target, draft = roofline_call_costs(target_shape, draft_shape, device, K, L, context, width)
    call = roofline_seconds_per_call(target, draft, K, L)
    overhead = (block_efficiency / tokens_per_s - call) / forwards_per_call(K, L)
    return overhead if overhead >= 0 else None


# --------------------------------------------------------------------------------------------------
# The paper's reported speed-ups against the roofline


def experiment_setting(path: Path) -> tuple[dict[str, int], int]:
    """(method -> K, L) of an experiment config's grid: the K each method runs at, and the experiment's L."""
    experiment = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    method_K = {str(m): int(entry["K"][0]) for entry in experiment["grid"] for m in entry["method"]}
    return method_K, int(experiment["L"])


def paper_setting(path: Path = PAPER_MAIN_YAML) -> tuple[dict[str, int], int]:
    """(method -> K, L) of the paper's main setting: ``experiment=paper_main``'s K for the multi-draft rules (3), K=1
    for the single-draft ones (sd, bv, gbv), its L (12, which the paper states for the 33B pair and we use for both).
    From the registry and the experiment's K and L, not its grid: the grid holds only the cells that check the
    predictions, not every method of the paper's table."""
    experiment = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    K, L = int(experiment["K"]), int(experiment["L"])
    return {name: 1 if spec.single_draft else K for name, spec in VERIFIERS.items()}, L


def _priced_rows(numbers: pd.DataFrame, index: Sequence[str], metrics: tuple[str, str], method_K: dict[str, int],
                 default_dtype: str) -> Iterator[tuple[Any, ModelShape, ModelShape, int, int]]:
    """(row, target shape, draft shape, K, bytes per weight) for each (``index``..., method) of reported numbers
    (``paper.load_paper_numbers``'s long form) that has both ``metrics`` and a method of ``method_K``: the row's
    fields are ``index``, ``method`` and the metrics. The pair's dtype, else ``default_dtype``, sets the width."""
    from spectr_repro.models import pair_config  # models: report imports cost without them

    wide = numbers.pivot_table(index=[*index, "method"], columns="metric", values="value", aggfunc="first")
    if not set(metrics) <= set(wide.columns):
        return
    for row in wide.dropna(subset=list(metrics)).reset_index().itertuples(index=False):
        if row.method in method_K:
            pair = pair_config(row.model_pair)
            yield (row, model_shape(pair, "target"), model_shape(pair, "draft"), method_K[row.method],
                   width_of(str(pair.get("dtype") or default_dtype)))


def paper_speedups_against_roofline(paper: pd.DataFrame | None = None,
                                    accelerators: Sequence[str] = PAPER_ACCELERATORS,
                                    context: int = PAPER_CONTEXT) -> pd.DataFrame:
    """For each (pair, dataset, method) of the paper with both a block efficiency and a speed-up: the paper's K and
    L, its block efficiency, its reported speed-up, and the speed-up the roofline allows with that block efficiency
    on each accelerator at batch 1 (columns ``allowed_<key>``; no overhead; an ideal call layout), reported /
    allowed, the per-forward overhead that would make the roofline give the reported speed-up
    (``implied_overhead_ms_<key>``).
    A model: ``MODEL_LABEL``."""
    paper = load_paper_numbers() if paper is None else paper
    method_K, L = paper_setting()
    devices = [accelerator(key) for key in accelerators]
    rows = []
    for row, target, draft, K, width in _priced_rows(paper[paper["model_pair"] != ""], ["model_pair", "dataset"],
                                                     ("block_efficiency", "speedup"), method_K, "bfloat16"):
        record = {"model_pair": row.model_pair, "dataset": row.dataset, "method": row.method, "K": K, "L": L,
                  "paper_block_efficiency": float(row.block_efficiency), "paper_speedup": float(row.speedup)}
        for device in devices:
            allowed = allowed_speedup(target, draft, device, K, L, float(row.block_efficiency), context, width)
            record[f"allowed_{device.key}"] = allowed
            record[f"reported_over_allowed_{device.key}"] = float(row.speedup) / allowed
            implied = implied_overhead_s(target, draft, device, K, L, float(row.block_efficiency), context,
                                         float(row.speedup), width)
            record[f"implied_overhead_ms_{device.key}"] = None if implied is None else 1e3 * implied
        rows.append(record)
    return pd.DataFrame(rows)


def release_tokens_per_s_against_roofline(paper: pd.DataFrame | None = None, device_key: str = RELEASE_ACCELERATOR,
                                          context: int = RELEASE_CONTEXT) -> pd.DataFrame:
    """The authors' code release's reported tokens/s (one H20, ``experiment=release_humaneval``: K=7 SpecTr-GBV,
    K=1 GBV, L=6, float16) beside the tokens/s the roofline of ``device_key`` allows with the release's own block
    efficiency (no overhead, no prefill), the roofline's AR tokens/s, and the per-forward overhead that would
    bring the roofline down to the reported rate. Its block efficiency counts tokens
    generated before truncation (not ours), so "allowed" is for that count. MCSD's tree drafts are not priced."""
    paper = load_paper_numbers() if paper is None else paper
    method_K, L = experiment_setting(RELEASE_YAML)
    device = accelerator(device_key)
    rows = []
    for row, target, draft, K, width in _priced_rows(release_numbers(paper), ["model_pair"],
                                                     ("block_efficiency", "tokens_per_s"), method_K, "float16"):
        allowed = allowed_tokens_per_s(target, draft, device, K, L, float(row.block_efficiency), context, width)
        ar = 1.0 / roofline_forward_seconds(target, device, 1, 1, context, width=width)
        implied = implied_overhead_from_tokens_per_s(target, draft, device, K, L, float(row.block_efficiency),
                                                     context, float(row.tokens_per_s), width)
        rows.append({"model_pair": row.model_pair, "method": row.method, "K": K, "L": L, "device": device.key,
                     "release_block_efficiency": float(row.block_efficiency),
                     "release_tokens_per_s": float(row.tokens_per_s), "allowed_tokens_per_s": allowed,
                     "allowed_ar_tokens_per_s": ar, "reported_over_allowed": float(row.tokens_per_s) / allowed,
                     "implied_overhead_ms": None if implied is None else 1e3 * implied})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# This machine: the roofline beside its calibrated forwards


def roofline_against_calibration(calibration: Calibration, device: Accelerator, context: int = 64,
                                 pair_name: str | None = None) -> pd.DataFrame:
    """Every shape a calibration measured, beside the roofline of ``device`` (this machine's measured bandwidth and
    matmul rate) at the same shape: calibrated / roofline is how far the roofline is from a real forward here.
    ``context``: the cached tokens under the calibration's forwards (``cost.measure.CONTEXT_TOKENS``)."""
    from spectr_repro.models import pair_config  # models: report imports cost without them

    pair = pair_config(pair_name or calibration.model_pair)
    width = width_of(calibration.dtype)
    rows = []
    for role in ("target", "draft"):
        shape = model_shape(pair, role)
        role_width = width_of(str(pair.get("draft_dtype") or calibration.dtype)) if role == "draft" else width
        for r, t, logits, seconds in calibration.costs(role).points:
            roofline = roofline_forward_seconds(shape, device, r, t, context, logits, role_width)
            rows.append({"role": role, "rows": r, "tokens": t, "logits": logits, "calibrated_s": seconds,
                         "roofline_s": roofline, "calibrated_over_roofline": seconds / roofline})
    return pd.DataFrame(rows)


__all__ = ["ACCELERATORS_YAML", "ARCHITECTURE_CONFIGS", "MODEL_LABEL", "PAPER_ACCELERATORS", "PAPER_CONTEXT",
           "RELEASE_ACCELERATOR", "RELEASE_CONTEXT", "experiment_setting", "forwards_per_call",
           "implied_overhead_from_tokens_per_s", "implied_overhead_s",
           "Accelerator", "ModelShape", "accelerator", "allowed_speedup", "allowed_tokens_per_s", "call_shapes",
           "load_accelerators", "measured_accelerator", "model_shape", "pair_shapes", "paper_setting",
           "paper_speedups_against_roofline", "release_tokens_per_s_against_roofline",
           "roofline_against_calibration", "roofline_call_costs",
           "roofline_forward_costs", "roofline_forward_seconds", "roofline_seconds_per_call", "shape_from_config",
           "width_of"]
