"""The HuggingFace hub side of a pair: download sizes, what the local cache holds, free disk, revisions.

Hub pairs (``source: hub``) are loaded with ``from_pretrained(hub_id, revision=...)``; before anything is
downloaded, :func:`check_disk_for_pair` compares the missing checkpoints with the free space of the HF cache.
Nothing here loads a model. Tests point :func:`hub_cache_dir` and :func:`free_disk_bytes` at a temporary
folder through this module (``monkeypatch.setattr(models.hub, ...)``): every caller looks them up here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from huggingface_hub import constants

DISK_MARGIN_BYTES = 2 * 1024**3  # keep this much free after a download (HF writes temporary files too)


def hub_cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def checkpoint_bytes(cfg: dict, role: str) -> int | None:
    """Download size of a hub checkpoint: ``params_b`` (billions of parameters, from the model card) x
    2 bytes (the bfloat16/float16 weights these repositories ship); None when the config gives no size."""
    params = (cfg.get(role) or {}).get("params_b")
    return round(float(params) * 1e9 * 2) if params else None


def cached_bytes(hub_id: str, revision: str) -> int:
    """Bytes of weight files of ``hub_id`` at ``revision`` already in the local HF cache (0 if none)."""
    from huggingface_hub import try_to_load_from_cache  # hub/datasets: only a download pays

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


def resolved_revisions(cfg: dict) -> dict[str, dict[str, str | None]]:
    """role -> hub_id, the configured revision and the commit it resolved to in the local cache."""
    from huggingface_hub import try_to_load_from_cache  # hub/datasets: only a download pays

    out = {}
    for role in ("target", "draft"):
        spec = cfg[role]
        found = try_to_load_from_cache(spec["hub_id"], "config.json", revision=spec["revision"],
                                       cache_dir=str(hub_cache_dir()))
        commit = Path(found).parent.name if isinstance(found, str) else None
        out[role] = {"hub_id": spec["hub_id"], "revision": spec["revision"], "commit": commit}
    return out


def hub_error(cfg: dict, where: str, error: Exception) -> ValueError:
    return ValueError(
        f"model pair {cfg['name']}: could not load {where!r} ({type(error).__name__}: {error}). If the "
        "HuggingFace hub is unreachable, pre-download the checkpoints into HF_HOME, or use an offline pair "
        "(qwen25coder_1.5b_0.5b, smollm2_135m_self after `make models`, or tiny_random)"
    )


__all__ = ["DISK_MARGIN_BYTES", "cached_bytes", "check_disk_for_pair", "checkpoint_bytes", "downloads_needed",
           "free_disk_bytes", "hub_cache_dir", "hub_error", "resolved_revisions"]
