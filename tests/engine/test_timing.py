"""SectionTimer: wall clock on the CPU; on CUDA, event pairs read by one synchronisation per prompt.

CUDA is not needed to check the event logic: a fake backend with a fake clock stands in for the
device (``record`` stamps the clock, ``synchronize`` is counted).
"""

from __future__ import annotations

import pytest
import torch

import spectr_repro.engine.loop as loop
from spectr_repro.engine import TIME_SECTIONS, generate
from spectr_repro.engine.timing import SectionTimer


class FakeEvent:
    def __init__(self, clock: FakeDevice) -> None:
        self.time_ms = clock.now_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.time_ms - self.time_ms


class FakeDevice:
    """A device whose clock advances only when told to; counts synchronisations."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.synchronizations = 0
        self.recorded = 0

    def record(self) -> FakeEvent:
        self.recorded += 1
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.synchronizations += 1


def test_event_sections_accumulate_and_are_read_at_sync_only():
    device = FakeDevice()
    timer = SectionTimer("cpu", ("draft", "target"), backend=device)
    assert timer.uses_events
    for _ in range(3):
        with timer("draft"):
            device.now_ms += 2.0
        device.now_ms += 1.0  # time between sections belongs to no section
        with timer("target"):
            device.now_ms += 5.0
    assert device.synchronizations == 0 and device.recorded == 12
    assert timer.seconds == {"draft": 0.0, "target": 0.0}  # nothing read before sync
    timer.sync()
    assert device.synchronizations == 1
    assert timer.seconds == pytest.approx({"draft": 0.006, "target": 0.015})
    timer.sync()  # nothing pending: nothing added twice
    assert timer.seconds == pytest.approx({"draft": 0.006, "target": 0.015})


def test_a_section_that_raises_is_still_recorded():
    device = FakeDevice()
    timer = SectionTimer("cpu", backend=device)
    with pytest.raises(ValueError):
        with timer("verify"):
            device.now_ms += 3.0
            raise ValueError("boom")
    timer.sync()
    assert timer.seconds == pytest.approx({"verify": 0.003})


def test_events_change_nothing_on_the_cpu():
    timer = SectionTimer("cpu", ("a",), events=True)
    assert not timer.uses_events
    with timer("a"):
        sum(range(1000))
    assert timer.seconds["a"] > 0  # wall clock, read at once


@pytest.mark.parametrize("method", ["ar", "sd", "spectr"])
def test_generate_synchronises_twice_per_prompt_whatever_the_iterations(tiny, prompt_ids, method, monkeypatch):
    """The engine's sections use events: one synchronisation before the prompt and one after it (was two
    per section, six sections per iteration); AR and the speculative methods alike."""
    device = FakeDevice()

    def fake_cuda_timer(dev, sections, events=False):
        assert events, "the engine's sections must use events"
        return SectionTimer(dev, sections, backend=device)

    monkeypatch.setattr(loop, "SectionTimer", fake_cuda_timer)
    target, draft, _ = tiny
    out = generate(target, draft, prompt_ids[2], method=method, K=1 if method != "spectr" else 2, L=3,
                   temperature=0.7, max_new_tokens=12, seed=0, vocab_size=259)
    assert out.target_calls > 2
    assert device.synchronizations == 2
    assert set(out.stats["time_s"]) == set(TIME_SECTIONS)
    assert device.recorded >= 2 * out.target_calls  # every iteration's sections were recorded


def test_default_timer_is_wall_clock_and_synchronised_on_cuda_only():
    timer = SectionTimer(torch.device("cpu"))
    assert not timer.uses_events
    with timer("x"):
        pass
    assert timer.seconds["x"] >= 0
