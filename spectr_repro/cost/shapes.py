"""What a forward of a decoder-only transformer reads and computes, and the seconds that costs at given rates.

One forward of ``rows`` sequences, each feeding ``tokens`` new tokens on top of ``context`` cached ones, does

    dense FLOPs     = 2 x body params x rows x tokens + 2 x vocab x hidden x positions scored
    attention FLOPs = 4 x layers x heads x head_dim x rows x tokens x (context + (tokens + 1) / 2)
    bytes           = weight bytes (read once, whatever the rows) + rows x (context + tokens) x KV bytes per token

(:class:`ModelShape`, from the model's ``config.json``). :class:`Rates` turns that work into seconds in one of two
ways, and every use names which:

- ``max`` (a roofline: spec-sheet peaks, ideal kernels, ``cost.roofline``): max(bytes / bandwidth, FLOPs / peak);
- ``sum`` (the calibrated estimate of a machine, ``hardware.estimate``): overhead + bytes / bandwidth + dense FLOPs
  / matmul rate + attention FLOPs / attention rate. On a CPU the two overlap little, and attention's kernels run
  far below the matmuls' rate (softmax, masks and small per-head products): ``attention_tflops`` is its own rate.

Attention is what makes a long context cost more in every forward (prefill chunk, draft step, verify): its FLOPs and
its KV bytes grow with ``context``, the dense part does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The architecture configs the random-weight check builds from (package data of spectr_repro.check, read as
# files: the cost model sits below the commands and imports none of them).
ARCHITECTURE_CONFIGS = Path(__file__).resolve().parent.parent / "check" / "configs"

@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer's forward reads and computes: the numbers of its ``config.json``."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # the output head is the input embedding
    attention_bias: bool = False  # biases on q, k, v (Qwen2)

    @property
    def layer_params(self) -> int:
        """One layer: q, k, v, o projections (+ q/k/v biases), the gated MLP's three matrices, two norms."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.attention_bias else 0
        return self.hidden * (q + 2 * kv) + q * self.hidden + bias + 3 * self.hidden * self.intermediate \
            + 2 * self.hidden

    @property
    def body_params(self) -> int:
        """Parameters every token multiplies through: the layers and the final norm (not embedding, not head)."""
        return self.layers * self.layer_params + self.hidden

    @property
    def params(self) -> int:
        """All parameters: embedding, body, and the head when it is not tied to the embedding."""
        embedding = self.vocab * self.hidden
        return embedding + self.body_params + (0 if self.tied else embedding)

    @property
    def streamed_params(self) -> int:
        """Parameters a forward reads: all but an untied input embedding (a lookup reads a few rows of it)."""
        return self.params - (0 if self.tied else self.vocab * self.hidden)

    def weight_bytes(self, width: int) -> int:
        return self.streamed_params * width

    def kv_bytes_per_token(self, width: int) -> int:
        """Keys and values of one token in every layer (the cache a later forward reads back)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * width

    def dense_flops(self, rows: int, tokens: int, logits: str = "last") -> float:
        """FLOPs of the weight matmuls: 2 per multiply-add of the body over every new token, and of the head over
        the positions scored (``logits`` "all": every new token; "last": one per row)."""
        new = rows * tokens
        scored = new if logits == "all" else rows
        return 2.0 * self.body_params * new + 2.0 * self.vocab * self.hidden * scored

    def attention_flops(self, rows: int, tokens: int, context: int) -> float:
        """FLOPs of attention: each new token's query against the ``context`` cached keys and the new ones before
        it (scores and the weighted sum of values: 4 x heads x head_dim per (query, key) pair, every layer). It
        grows with the context: a 16K-token cache costs each new token 16x a 1K one's."""
        return 4.0 * self.layers * self.heads * self.head_dim * rows * tokens * (context + (tokens + 1) / 2)

    def flops(self, rows: int, tokens: int, context: int, logits: str = "last") -> float:
        """FLOPs of one forward: the weight matmuls and attention over the cached and new keys."""
        return self.dense_flops(rows, tokens, logits) + self.attention_flops(rows, tokens, context)

    def kv_read_bytes(self, rows: int, tokens: int, context: int, width: int) -> int:
        """Bytes of keys and values a forward reads: each row's cache of ``context`` tokens plus its new ones."""
        return rows * (context + tokens) * self.kv_bytes_per_token(width)


def shape_from_config(name: str, config: dict) -> ModelShape:
    """A :class:`ModelShape` from a HuggingFace ``config.json`` dict (Llama and Qwen2 families)."""
    heads = int(config["num_attention_heads"])
    return ModelShape(
        name=name, layers=int(config["num_hidden_layers"]), hidden=int(config["hidden_size"]),
        intermediate=int(config["intermediate_size"]), heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads), vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")))


def model_shape(pair: dict, role: str) -> ModelShape:
    """The shape of the ``role`` ("target" or "draft") model of a resolved pair config
    (``spectr_repro.models.pair_config``): for an offline pair the converted folder's ``config.json`` when
    ``make models`` made it, else the shipped ``config.json`` of its hub id; the tiny pair's code defaults.
    ValueError when no architecture of it is shipped."""
    if pair["source"] == "tiny":
        # transformers (~1 s): refusals and light commands exit before any model loads
        from spectr_repro.models.tiny import make_byte_tokenizer, tiny_config

        vocab = len(make_byte_tokenizer()) + (5 if role == "target" else 0)  # make_tiny_pair's head padding
        return shape_from_config(f"tiny_random {role}", tiny_config(vocab).to_dict())
    spec = pair.get(role) or {}
    if pair["source"] == "offline":  # what `make models` converted is what runs here (its head may be untied)
        from spectr_repro.models.offline import models_dir  # models: report imports cost without them

        converted = models_dir() / str(spec.get("offline")) / "config.json"
        if converted.is_file():
            return shape_from_config(str(spec.get("offline")), json.loads(converted.read_text(encoding="utf-8")))
    hub_id = str(spec.get("hub_id"))
    path = ARCHITECTURE_CONFIGS / (hub_id.replace("/", "__") + ".json")
    if not path.is_file():
        raise ValueError(f"model pair {pair.get('name')}: no architecture of the {role} {hub_id!r} shipped "
                         f"(add its config.json as {path})")
    return shape_from_config(hub_id, json.loads(path.read_text(encoding="utf-8")))


def pair_shapes(pair_name: str) -> tuple[ModelShape, ModelShape]:
    """(target, draft) shapes of a packaged pair."""
    from spectr_repro.models import pair_config  # models: report imports cost without them

    pair = pair_config(pair_name)
    return model_shape(pair, "target"), model_shape(pair, "draft")


def width_of(dtype: str) -> int:
    """Bytes per weight and cache entry of a dtype name."""
    return 4 if dtype == "float32" else 2


@dataclass(frozen=True)
class Rates:
    """The rates a forward's work runs at: bandwidth (GB/s), matmul and attention FLOP/s (TFLOP/s), a fixed overhead
    per forward, and how memory and compute combine (``max``: a roofline; ``sum``: a machine's fitted estimate)."""

    bandwidth_gbs: float
    compute_tflops: float
    attention_tflops: float
    overhead_s: float = 0.0
    combine: str = "max"
    label: str = ""

    @classmethod
    def from_estimate(cls, estimate: dict[str, Any]) -> Rates:
        """``hardware.estimate`` (conf/hardware/*.yaml): summed terms; attention at ``attention_tflops`` (else the
        matmul rate)."""
        compute = float(estimate["compute_tflops"])
        return cls(float(estimate["bandwidth_gbs"]), compute, float(estimate.get("attention_tflops") or compute),
                   float(estimate.get("overhead_ms") or 0.0) / 1e3, "sum", str(estimate.get("device", "")))

    def seconds(self, shape: ModelShape, rows: int, tokens: int, context: int, logits: str = "last",
                width: int = 2) -> float:
        """Seconds of one forward of ``shape`` (module docstring)."""
        moved = shape.weight_bytes(width) + shape.kv_read_bytes(rows, tokens, context, width)
        memory = moved / (self.bandwidth_gbs * 1e9)
        dense = shape.dense_flops(rows, tokens, logits) / (self.compute_tflops * 1e12)
        attention = shape.attention_flops(rows, tokens, context) / (self.attention_tflops * 1e12)
        if self.combine == "max":
            return max(memory, dense + attention) + self.overhead_s
        return self.overhead_s + memory + dense + attention

    def ridge_tokens(self, shape: ModelShape, width: int = 2) -> float:
        """Tokens a forward must carry before its weight matmuls take longer than reading its weights (the
        roofline's ridge point, context aside): weight bytes / bandwidth = 2 x params x tokens / peak."""
        return (shape.weight_bytes(width) / (self.bandwidth_gbs * 1e9)) * (self.compute_tflops * 1e12) \
            / (2.0 * shape.streamed_params)


@dataclass(frozen=True)
class ModelledForwardCosts:
    """Seconds of one model's forwards from its shape and :class:`Rates`, with the interface of a calibration's
    ``ForwardCosts`` (``seconds(rows, tokens, logits, context)``), so that every price of a call, a prompt or a
    batch goes through the same formulas whether the forwards are measured or modelled. ``context`` None: the
    ``context`` it was built for."""

    shape: ModelShape
    rates: Rates
    width: int = 2
    context: int = 0
    spread: float = 0.0

    def seconds(self, rows: int, tokens: int, logits: str = "last", context: int | None = None) -> float:
        at = self.context if context is None else int(context)
        return self.rates.seconds(self.shape, int(rows), int(tokens), at, logits, self.width)


def batch_memory_bytes(target: ModelShape, draft: ModelShape, prompt_tokens: int, new_tokens: int, K: int, L: int,
                       batch: int, width: int = 2) -> int:
    """Bytes a decode of ``batch`` prompts at K drafts of L tokens holds at its longest: both models' weights; both KV
    caches on B x (K + 1) rows (the engine repeats each prompt's committed cache over its K drafts beside the
    original) at prompt + new tokens + L + 1 positions; one target call's logits over B x K x (L + 1) positions in
    float32 and its widest activation (the MLP's, B x K x (L + 1) x intermediate) in ``width``."""
    positions = int(prompt_tokens) + int(new_tokens) + int(L) + 1
    weights = (target.params + draft.params) * width
    caches = batch * (K + 1) * positions * (target.kv_bytes_per_token(width) + draft.kv_bytes_per_token(width))
    verified = batch * K * (L + 1)
    activations = verified * target.vocab * 4 + verified * target.intermediate * width * 2
    return int(weights + caches + activations)


def largest_batch(fits, limit: int = 4096) -> int:
    """The largest B >= 1 with ``fits(B)`` (memory grows with B: a doubling search, then bisection); 0 when none."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


__all__ = ["ARCHITECTURE_CONFIGS", "batch_memory_bytes", "largest_batch", "ModelShape", "ModelledForwardCosts",
           "Rates", "model_shape", "pair_shapes",
           "shape_from_config", "width_of"]
