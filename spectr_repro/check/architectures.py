"""A pair's architectures without its weights: configs, random-weight models, and the memory they need.

``check.random_weights=true`` builds the target and draft from their ``config.json`` with random weights
(``AutoModelForCausalLM.from_config``): a forward costs what it costs with the real weights, so the
33B/6.7B/1.3B shapes can be timed, and their memory checked, before 83 GB are downloaded. The configs
come from the converted offline folder when there is one, else from the copies shipped in
``spectr_repro/check/configs/`` (see its README for their source), else from the local HF cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from spectr_repro.models.offline import models_dir

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
GIB = 1024**3


def shipped_config_path(hub_id: str) -> Path:
    return CONFIGS_DIR / (hub_id.replace("/", "__") + ".json")


def architecture_config(pair_cfg: dict, role: str):
    """The transformers config of the pair's ``role`` model, found offline; None for the tiny pair.
    ValueError when no copy of it is here."""
    if pair_cfg["source"] == "tiny":
        return None
    spec = pair_cfg.get(role) or {}
    if pair_cfg["source"] == "offline":
        converted = models_dir() / str(spec.get("offline")) / "config.json"
        if converted.is_file():
            return AutoConfig.from_pretrained(converted.parent)
    hub_id = str(spec.get("hub_id"))
    shipped = shipped_config_path(hub_id)
    if shipped.is_file():
        return AutoConfig.for_model(**json.loads(shipped.read_text(encoding="utf-8")))
    try:
        return AutoConfig.from_pretrained(hub_id, revision=spec.get("revision"))
    except OSError:
        raise ValueError(f"model pair {pair_cfg['name']}: no config of the {role} {hub_id!r} here (not shipped in "
                         f"{CONFIGS_DIR}, not in the HF cache); add its config.json there as "
                         f"{shipped.name}") from None


def parameter_count(config) -> int:
    """Parameters of a model of ``config``, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config, rows: int, context: int, width: int) -> int:
    """Keys and values of ``rows`` sequences of ``context`` tokens in a model of ``config``."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * rows * context * width


def build_random_model(config, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A model of ``config`` with random weights (seeded), built directly on ``device`` in ``dtype``."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


__all__ = ["CONFIGS_DIR", "GIB", "architecture_config", "build_random_model", "kv_cache_bytes", "parameter_count",
           "shipped_config_path"]
