"""Where a loaded pair sits: is any module offloaded to the CPU or disk, its bytes, the accelerator's memory, and
the one message that refuses to time a pair that does not fit (``spectr_repro.models`` re-exports these)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spectr_repro.models.loading import ModelPair

_OFF_ACCELERATOR = ("cpu", "disk", "meta")


def _is_accelerator(device) -> bool:
    if isinstance(device, int):  # accelerate's device maps name GPUs by index
        return True
    return str(device).split(":")[0] not in _OFF_ACCELERATOR


def placement(model: torch.nn.Module) -> dict[str, str]:
    """Module (or parameter) name -> device: accelerate's ``hf_device_map`` when the model was spread by
    ``device_map``, else every parameter's and buffer's device ("meta" = offloaded to disk by hooks)."""
    device_map = getattr(model, "hf_device_map", None)
    if isinstance(device_map, Mapping) and device_map:
        placed = {str(name): str(device) if not isinstance(device, int) else f"cuda:{device}"
                  for name, device in device_map.items()}
    else:
        placed = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device.type == "meta":  # disk-offloaded weights stay on meta until their hook loads them
            placed[name] = "meta"
    if not placed:
        placed = {name: str(tensor.device) for name, tensor in model.named_parameters()}
    return placed


def offloaded_modules(model: torch.nn.Module) -> list[str]:
    """Modules on cpu/disk/meta while others sit on an accelerator, or any module on disk/meta (weights
    read back for every forward). A model entirely on the CPU (hardware=cpu) is not offloaded: [].
    """
    placed = placement(model)
    on_disk = [name for name, device in placed.items() if device.split(":")[0] in ("disk", "meta")]
    if any(_is_accelerator(device) for device in placed.values()):
        return sorted(f"{name} ({device})" for name, device in placed.items() if not _is_accelerator(device))
    return sorted(f"{name} ({placed[name]})" for name in on_disk)


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters and buffers, wherever they sit (meta tensors included)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def accelerator_memory() -> list[tuple[int, int]] | None:
    """(free, total) bytes of each visible CUDA device, None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return [torch.cuda.mem_get_info(index) for index in range(torch.cuda.device_count())]


def with_placement(pair: ModelPair, free: list[tuple[int, int]] | None) -> ModelPair:
    offloaded = {role: found for role, model in (("target", pair.target), ("draft", pair.draft))
                 if (found := offloaded_modules(model))}
    return replace(pair, offloaded=offloaded, memory_bytes=model_bytes(pair.target) + model_bytes(pair.draft),
                   memory_free=free)


def offload_message(pair: ModelPair, option: str = "hardware.allow_offload=true") -> str:
    """One message: which pair, which modules, the memory it needs and the memory that was free."""
    gib = 1024**3
    parts = []
    for role, modules in pair.offloaded.items():
        shown = ", ".join(modules[:4]) + (f", ... ({len(modules) - 4} more)" if len(modules) > 4 else "")
        parts.append(f"{len(modules)} {role} module(s) on cpu/disk: {shown}")
    if pair.memory_free:
        free = ", ".join(f"cuda:{i} {f / gib:.1f} of {t / gib:.1f} GiB free" for i, (f, t) in
                         enumerate(pair.memory_free))
    else:
        free = "accelerator memory unknown"
    return (f"model pair {pair.name} does not fit on the accelerator: {'; '.join(parts)}. It needs "
            f"{pair.memory_bytes / gib:.1f} GiB of weights ({free} before loading). Timing it would measure "
            f"transfers from the CPU, not decoding: use a device with more memory (or several GPUs), or set "
            f"{option} to time it anyway (its speed-ups are then marked not comparable)")
