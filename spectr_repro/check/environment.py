"""``check``'s environment and memory items: device, dtypes, torch.compile, the sandbox; whether the pair fits."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import torch

import spectr_repro.check.architectures as architectures  # a module: tests swap its configs for small ones
from spectr_repro.check.checker import Checker
from spectr_repro.environment import environment
from spectr_repro.models import as_dtype
from spectr_repro.quality.sandbox import SandboxUnavailable, find_sandbox

CONTEXT_TOKENS = 1024  # KV context the memory check provisions per row (a long prompt plus its completion)


def environment_items(checker: Checker, base) -> dict[str, Any]:
    device = torch.device(str(base.hardware.device))
    env = environment(str(device))
    free, total = free_memory(device)
    checker.add("environment", "device", "info", f"{env['device_name']} ({device}), torch {env['torch']}, "
                f"transformers {env['transformers']}, {env['num_threads']} threads")
    checker.add("environment", "memory free", "info", f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB")
    for dtype in (torch.bfloat16, torch.float16):
        checker.run("environment", f"{str(dtype).removeprefix('torch.')} matmul", lambda dtype=dtype: _dtype_works(
            device, dtype), required=False)
    quick = bool(base.group("check").get("quick"))
    if quick and not base.hardware.compile:  # inductor's first build takes ~30 s on a small CPU
        checker.add("environment", "torch.compile", "skip", "not checked in quick mode (hardware.compile is false)")
    else:
        checker.run("environment", "torch.compile", lambda: _compile_works(device),
                    required=bool(base.hardware.compile))
    checker.run("environment", "sandbox", _sandbox_mode, required=False)
    return env | {"memory_free_bytes": free, "memory_total_bytes": total}


def free_memory(device: torch.device) -> tuple[int, int]:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def _dtype_works(device, dtype):
    a = torch.ones(64, 64, device=device, dtype=dtype)
    value = float((a @ a)[0, 0])
    native = ""
    if device.type == "cpu" and dtype == torch.bfloat16:
        flags = _cpu_flags()
        # Without them every bf16 product is emulated: on a 2-core AMD EPYC (AVX2 only, 2026-12-06) a Qwen 1.5B
        # forward over 32 tokens took 17.4 s in bf16 against 4.6 s in float32 (conf/hardware/cpu.yaml)
        native = (", native (avx512_bf16/amx)" if {"avx512_bf16", "amx_bf16"} & flags
                  else ", emulated (slow: no avx512_bf16/amx; hardware.dtype=float32 is faster on this CPU)")
    if device.type == "cuda" and dtype == torch.bfloat16:
        native = ", native" if torch.cuda.is_bf16_supported() else ", not native"
    return value == 64.0, f"runs{native}", None


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compile_works(device):
    start = time.perf_counter()
    compiled = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1)
    x = torch.randn(8, device=device)
    ok = torch.allclose(compiled(x), torch.nn.functional.silu(x) * 2 + 1)
    return ok, f"compiles and matches eager ({time.perf_counter() - start:.1f} s)", None


def _sandbox_mode():
    try:
        return None, find_sandbox("auto").describe(), None
    except SandboxUnavailable as error:
        return None, f"none isolates here: HumanEval pass@1 will refuse to run ({str(error)[:160]})", None


def memory_item(checker: Checker, base, pair_cfg: dict, shapes: dict[str, Any], free: int) -> bool:
    """Whether target and draft, their KV caches at the largest rows and the logits fit in ``free`` bytes."""
    dtype = pair_dtype(base, pair_cfg)
    width = torch.tensor([], dtype=dtype).element_size()
    rows = max(shapes["Ks"]) * max(shapes["batch_sizes"])
    tokens = max(shapes["Ls"]) + 1
    if pair_cfg["source"] == "tiny":
        checker.add("memory", "fits without offload", "pass", "tiny pair (a few MB)")
        return True
    need = 0
    parts = []
    for role in ("target", "draft"):
        config = architectures.architecture_config(pair_cfg, role)
        weights = architectures.parameter_count(config) * width
        cache = architectures.kv_cache_bytes(config, rows, CONTEXT_TOKENS, width)
        logits = 3 * rows * tokens * int(config.vocab_size) * 4  # logits, float32 probabilities, a copy
        need += weights + cache + logits
        parts.append(f"{role} {weights / 2**30:.1f} GiB + KV {cache / 2**30:.2f} + logits {logits / 2**30:.2f}")
    need = int(need * 1.1)  # allocator slack and activations
    fits = need <= free
    checker.add("memory", "fits without offload", "pass" if fits else "fail",
                f"needs ~{need / 2**30:.1f} GiB at {rows} rows x {tokens} tokens ({'; '.join(parts)}), "
                f"{free / 2**30:.1f} GiB free", required=False)
    return fits


def pair_dtype(base, pair_cfg: dict) -> torch.dtype:
    """The dtype the pair runs in here: ``hardware.dtype``, else the pair's own (float32 by default)."""
    return as_dtype(base.hardware.dtype or pair_cfg.get("dtype") or "float32")


__all__ = ["CONTEXT_TOKENS", "environment_items", "free_memory", "memory_item", "pair_dtype"]
