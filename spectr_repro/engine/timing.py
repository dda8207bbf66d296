"""The one timing helper: wall-clock seconds per named section, CUDA-synchronised when on CUDA.

    timer = SectionTimer(device)
    with timer("draft"):
        ...
    timer.seconds  # {"draft": 0.012, ...}

Sections accumulate (entering "draft" twice adds both durations). On CUDA the device is
synchronised when a section ends, so the time of queued kernels is charged to the section that
launched them rather than to whichever later call happens to block.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SectionTimer:
    def __init__(self, device: torch.device | str | None = None, sections: tuple[str, ...] = ()) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        self._synchronize = device.type == "cuda"
        self._device = device
        self.seconds: dict[str, float] = dict.fromkeys(sections, 0.0)

    def sync(self) -> None:
        if self._synchronize:
            torch.cuda.synchronize(self._device)

    @contextmanager
    def __call__(self, section: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[section] = self.seconds.get(section, 0.0) + time.perf_counter() - start


__all__ = ["SectionTimer"]
