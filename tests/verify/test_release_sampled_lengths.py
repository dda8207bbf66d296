"""The release's ``sampled_lengths`` (verify/spectr_gbv.py): the tau of each draw from one shared h table, exactly
the tau its sampler draws with the same generator, draw by draw. The replay's Monte-Carlo estimate of the release
uses it (replay/core.py::_mean_draw); its values, and so the rules' fingerprint, must not move."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.replay import fingerprint
from spectr_repro.replay.fingerprint import rule_fingerprint
from spectr_repro.verify import get_verifier

SEEDS = range(40)


def toy_block(vocab: int, seed: int, K: int, L: int, dtype=torch.float64):
    return [t if t.dtype == torch.long else t.to(dtype) for t in fingerprint._toy_block(vocab, seed, K, L)]


@pytest.mark.parametrize("options", [{}, {"arithmetic": "release_bf16"}, {"clamp_h": True}])
@pytest.mark.parametrize("vocab, K, L", [(2, 7, 4), (3, 3, 6), (5, 1, 5), (3, 4, 1)])
def test_each_draw_is_the_samplers(vocab, K, L, options):
    """Small vocabularies make drafts share prefixes, so the scan's ``seen`` skips are exercised."""
    release = get_verifier("spectr_gbv", **options)
    for block_seed in range(3):
        block = toy_block(vocab, block_seed, K, L, torch.float32)
        expected = [release(*block, generator=torch.Generator().manual_seed(s)).num_accepted for s in SEEDS]
        shared = release.sampled_lengths(*block, [torch.Generator().manual_seed(s) for s in SEEDS])
        assert shared == expected


def test_a_wrong_scan_is_caught():
    """Negative control: a scan that ignores ``seen`` (tests a rejected prefix again) departs from the sampler on some
    of these blocks, so the test above can fail."""
    from spectr_repro.verify.common import uniform

    release = get_verifier("spectr_gbv")
    K, L = 7, 4

    def no_seen(h_table, draws):
        tau = 0
        for j in range(K):
            if draws[j * L + L - 1] < h_table[j][L - 1]:
                return L
            for i in range(tau, L - 1):
                if draws[j * L + i] < h_table[j][i]:
                    tau = i + 1
        return tau

    departed = 0
    for block_seed in range(6):
        block = toy_block(2, block_seed, K, L)
        effective, P, Q = release._block(*block, None)
        h_table = release._h_table(effective, block[1], P, Q, K, L)
        wrong = [no_seen(h_table, uniform(K * L, torch.Generator().manual_seed(s)).tolist()) for s in range(200)]
        departed += wrong != release.sampled_lengths(*block, [torch.Generator().manual_seed(s) for s in range(200)])
    assert departed > 0


def test_the_release_fingerprint_is_unchanged_by_the_shared_table(monkeypatch):
    """The replay's sampled values of the release are the same with the shared table as with the sampler's draws."""
    fingerprint._replayed_values.cache_clear()
    shared = rule_fingerprint("spectr_gbv", sampled=["spectr_gbv"])
    monkeypatch.delattr(type(get_verifier("spectr_gbv")), "sampled_lengths")
    fingerprint._replayed_values.cache_clear()
    assert rule_fingerprint("spectr_gbv", sampled=["spectr_gbv"]) == shared
    fingerprint._replayed_values.cache_clear()
