"""Measuring instruments: wall time (CUDA-synchronised), peak memory, and forwards per model.

Spec-Bench style: contenders run side by side in one process, on the same prompts, after a warm-up,
alternating their order between rounds; each figure is the median over rounds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
from tqdm.auto import tqdm

from spectr_repro.engine.timing import SectionTimer


class PeakMemory:
    """Peak resident memory (bytes) of this process while the block runs; CUDA: peak allocated.

    On Linux the kernel keeps the resident high-water mark (``VmHWM``): it is reset on entry (``clear_refs``, which
    any process may do to itself) and read on exit, so a peak that lasts microseconds counts. Elsewhere a thread
    samples the resident size every ``interval_s`` (a shorter peak can be missed)."""

    def __init__(self, device: torch.device, interval_s: float = 0.02) -> None:
        self.device, self.interval_s, self.peak = device, interval_s, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            self._stop.wait(self.interval_s)

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not _reset_resident_peak():
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self._thread is None:
            self.peak = resident_bytes("VmHWM")
        else:
            self._stop.set()
            self._thread.join()


def resident_bytes(field: str = "VmRSS") -> int:
    """This process's ``VmRSS`` (resident now) or ``VmHWM`` (its high-water mark) in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def _reset_resident_peak() -> bool:
    """Linux: set this process's high-water mark to its resident size now. False where there is no such file."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        resident_bytes("VmHWM")
        return True
    except OSError:
        return False


def timed(device: torch.device, fn):
    """(seconds, result) of ``fn()``, CUDA-synchronised through the engine's timer."""
    timer = SectionTimer(device, ("run",))
    with timer("run"):
        result = fn()
    return timer.seconds["run"], result


class ForwardMeter:
    """Counts the forwards of some models and the seconds spent inside them while the block runs.

    The profile that bounds the ratios: two loops driving the same models can differ only in how many
    forwards they run, on what shapes, and in what they do between forwards.
    """

    def __init__(self, device: torch.device, **models: torch.nn.Module) -> None:
        self.device, self.models = device, models
        self.stats = {name: {"calls": 0, "tokens_fed": 0, "seconds": 0.0} for name in models}
        self._handles: list = []

    def __enter__(self):
        for name, model in self.models.items():
            self._handles.append(model.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self._handles.append(model.register_forward_hook(self._post(name), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _pre(self, name):
        def hook(module, args, kwargs):
            self._sync()
            module._bench_started = time.perf_counter()
        return hook

    def _post(self, name):
        def hook(module, args, kwargs, output):
            self._sync()
            entry = self.stats[name]
            ids = kwargs.get("input_ids", args[0] if args else None)
            entry["calls"] += 1
            entry["tokens_fed"] += int(ids.numel()) if ids is not None else 0
            entry["seconds"] += time.perf_counter() - module._bench_started
        return hook


# A contender: fn(round) -> (seconds, tokens, iterations); round -1 is the short warm-up; iterations None
# means one per target forward (transformers' loops).
Contender = Callable[[int], tuple[float, int, int | None]]


def rounds(label: str, pair, contenders: dict[str, Contender], repeats: int) -> dict[str, dict]:
    """Run every contender once as a warm-up, then ``repeats`` rounds in rotating order.

    Round r seeds prompt i with 1000 r + i for every contender, so the rounds also average over the
    sampling luck of the block efficiency. Returns per contender: median tokens/s, all rates, peak
    memory, and the forward-level profile over every timed round.
    """
    for fn in contenders.values():
        fn(-1)
    names = list(contenders)
    rates = {name: [] for name in names}
    profiles = {name: _empty_profile() for name in names}
    peaks = {name: 0 for name in names}
    for r in tqdm(range(repeats), desc=label, leave=False):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            with PeakMemory(pair.device) as mem, ForwardMeter(pair.device, target=pair.target,
                                                              draft=pair.draft) as meter:
                seconds, tokens, iterations = contenders[name](r)
            rates[name].append(tokens / seconds)
            peaks[name] = max(peaks[name], mem.peak)
            _add_profile(profiles[name], seconds, tokens, meter.stats,
                         meter.stats["target"]["calls"] if iterations is None else iterations)
    return {name: {"tokens_per_s": statistics.median(rates[name]), "all": rates[name],
                   "peak_memory_mb": peaks[name] / 2**20, "profile": _finish_profile(profiles[name])}
            for name in names}


def _empty_profile() -> dict:
    return {"seconds": 0.0, "tokens": 0, "iterations": 0, "forwards": {}}


def _add_profile(profile: dict, seconds: float, tokens: int, forwards: dict, iterations: int) -> None:
    profile["seconds"] += seconds
    profile["tokens"] += tokens
    profile["iterations"] += iterations
    for model, entry in forwards.items():
        total = profile["forwards"].setdefault(model, {"calls": 0, "tokens_fed": 0, "seconds": 0.0})
        for key in total:
            total[key] += entry[key]


def _finish_profile(profile: dict) -> dict:
    """Per generated token: forwards of each model, ms inside them, and ms outside every forward."""
    tokens = max(profile["tokens"], 1)
    inside = sum(entry["seconds"] for entry in profile["forwards"].values())
    out = {"tokens": profile["tokens"], "seconds": profile["seconds"],
           "block_efficiency": profile["tokens"] / max(profile["iterations"], 1),
           "ms_per_token": 1e3 * profile["seconds"] / tokens,
           "ms_per_token_outside_forwards": 1e3 * (profile["seconds"] - inside) / tokens,
           "fraction_inside_forwards": inside / profile["seconds"] if profile["seconds"] else None}
    for model, entry in profile["forwards"].items():
        if entry["calls"]:
            out[f"{model}_forwards_per_token"] = entry["calls"] / tokens
            out[f"{model}_ms_per_forward"] = 1e3 * entry["seconds"] / entry["calls"]
            out[f"{model}_ms_per_token"] = 1e3 * entry["seconds"] / tokens
    return out


__all__ = ["Contender", "ForwardMeter", "PeakMemory", "resident_bytes", "rounds", "timed"]
