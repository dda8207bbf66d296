"""The one timing helper: seconds per named section.

    timer = SectionTimer(device)                 # wall clock; on CUDA synchronised at both ends
    timer = SectionTimer(device, events=True)    # the engine's sections: CUDA events, no synchronisation
    with timer("draft"):
        ...
    timer.sync()                                 # events: one synchronisation folds them into seconds
    timer.seconds  # {"draft": 0.012, ...}

Sections accumulate (entering "draft" twice adds both durations).

- Default (``events=False``): wall clock; on CUDA the device is synchronised when a section starts
  and ends, so the time of queued kernels is charged to the section that launched them. For a
  prompt's total wall time (the runner's), where the synchronisation is the point.
- ``events=True`` on CUDA: each section records a CUDA event pair on the current stream and nothing
  waits; ``sync()`` synchronises once and adds up the elapsed times. An engine iteration entered six
  sections, i.e. twelve synchronisations, each one draining the GPU's queue while the host had the
  next kernels ready to launch; now a prompt synchronises once. An event pair measures the device's
  time from the start event to the end event, queued work and idle gaps included, so the sections
  still add up to about the prompt's wall time. On the CPU ``events`` changes nothing (wall clock,
  nothing to synchronise), so CPU timings are as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch


class EventBackend(Protocol):
    """What the event timer needs from a device (CUDA here; a fake clock in the tests)."""

    def record(self) -> Any:
        """Record an event on the device's current stream and return it; ``a.elapsed_time(b)`` is in ms."""

    def synchronize(self) -> None:
        """Wait until every recorded event has happened."""


class CudaEvents:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class SectionTimer:
    def __init__(
        self,
        device: torch.device | str | None = None,
        sections: tuple[str, ...] = (),
        events: bool = False,
        backend: EventBackend | None = None,
    ) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        self._device = device
        self._synchronize = device.type == "cuda"
        self._events = backend
        if self._events is None and events and device.type == "cuda":
            self._events = CudaEvents(device)
        self._pending: list[tuple[str, Any, Any]] = []  # (section, start event, end event) not yet read
        self.seconds: dict[str, float] = dict.fromkeys(sections, 0.0)

    @property
    def uses_events(self) -> bool:
        return self._events is not None

    def sync(self) -> None:
        """Wait for the device; with events, add every recorded section's elapsed time to ``seconds``."""
        if self._events is not None:
            self._events.synchronize()
            for section, start, end in self._pending:
                self.seconds[section] = self.seconds.get(section, 0.0) + start.elapsed_time(end) / 1000.0
            self._pending.clear()
        elif self._synchronize:
            torch.cuda.synchronize(self._device)

    @contextmanager
    def __call__(self, section: str) -> Iterator[None]:
        if self._events is not None:
            start = self._events.record()
            try:
                yield
            finally:
                self._pending.append((section, start, self._events.record()))
            return
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[section] = self.seconds.get(section, 0.0) + time.perf_counter() - start


__all__ = ["CudaEvents", "EventBackend", "SectionTimer"]
