"""The bench's peak-memory meter on the CPU: a peak that lasts far less than the sampling interval still counts."""

from __future__ import annotations

import torch

from spectr_repro.bench.measure import PeakMemory, resident_bytes

MIB = 2**20


def _brief_peak(megabytes: int) -> None:
    block = torch.ones(megabytes * MIB // 4)  # written, so resident; freed at once
    del block


def test_a_brief_peak_is_measured_and_a_quiet_block_is_not_charged_with_it():
    """512 MiB allocated and freed in a few ms (well under the 20 ms sampling interval a thread would need): the peak
    is at least 500 MiB above the resident size before. Negative control: the next block, which allocates nothing,
    is not charged with the earlier peak (the high-water mark was reset), so the meter does not just keep a maximum
    forever. Threshold: 500 of 512 MiB, since the allocator may reuse a few MiB freed before."""
    before = resident_bytes()
    with PeakMemory(torch.device("cpu")) as brief:
        _brief_peak(512)
    assert brief.peak - before >= 500 * MIB
    with PeakMemory(torch.device("cpu")) as quiet:
        pass
    assert quiet.peak - resident_bytes() < 64 * MIB
