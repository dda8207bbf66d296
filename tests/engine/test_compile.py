"""compile=True (hardware.compile): static caches of K rows under torch.compile, AR and methods alike.

Fast tests run the static-cache path with ``torch.compile(..., disable=True)`` (the same calls and cache
bookkeeping, the forward left eager), so the rows' plumbing (prompt copied into every row, the winning
row copied into the others, padded last blocks, the draft's two re-fed tokens) is checked in seconds:
float32, so tokens equal the eager dynamic path's at T = 0 and, with the same seeds, at T > 0. The slow
test compiles for real (inductor on the CPU) and checks greedy tokens against the eager path.
"""

from __future__ import annotations

import pytest
import torch

import spectr_repro.engine.rows as rows_module
from spectr_repro.engine import generate
from tests.engine.engine_helpers import draft_count

VOCAB, L = 259, 3
NOT_COMPILED = {"disable": True}  # static caches and the compiled path's calls, eager forward


def decode(tiny, prompt, method, compile, temperature, max_new_tokens=13, seed=0):
    target, draft, _ = tiny
    return generate(target, draft, prompt, method=method, K=draft_count(method, K=2), L=L, temperature=temperature,
                    max_new_tokens=max_new_tokens, seed=seed, vocab_size=VOCAB, compile=compile)


@pytest.mark.parametrize("method", ["ar", "sd", "spectr", "gbv", "sbv"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_static_cache_path_equals_the_eager_path(tiny, prompt_ids, method, temperature):
    for index, prompt in enumerate(prompt_ids[:2]):
        eager = decode(tiny, prompt, method, False, temperature, seed=index)
        static = decode(tiny, prompt, method, NOT_COMPILED, temperature, seed=index)
        assert static.new_tokens == eager.new_tokens
        assert static.stats["accepted_lengths"] == eager.stats["accepted_lengths"]
        assert static.stats["block_lengths"] == eager.stats["block_lengths"]
    if method != "ar":
        assert any(tau < L for tau in eager.stats["accepted_lengths"])  # rows diverged and were re-joined


@pytest.mark.parametrize("method, shapes", [("ar", {(1, 2), (1, 1)}), ("spectr", {(2, 2), (2, 1), (2, L + 1)})])
def test_compiled_calls_have_three_shapes_all_met_in_the_first_iteration(tiny, prompt_ids, method, shapes,
                                                                        monkeypatch):
    """Every compiled call has one of a few shapes, so a short warm-up compiles them all before timing."""
    seen = []

    def recording(model, options):
        def forward(**kwargs):
            seen.append(tuple(kwargs["input_ids"].shape))
            return model.forward(**kwargs)

        return forward

    monkeypatch.setattr(rows_module, "compiled_forward", recording)
    first = decode(tiny, prompt_ids[0], method, NOT_COMPILED, 0.7, max_new_tokens=4)
    assert set(seen) == shapes, (first.stats, seen)
    seen.clear()
    decode(tiny, prompt_ids[1], method, NOT_COMPILED, 0.7, max_new_tokens=29)  # a shorter last block: padded
    assert set(seen) == shapes


def test_static_caches_are_reused_across_prompts(tiny, prompt_ids):
    target = tiny[0]
    decode(tiny, prompt_ids[0], "spectr", NOT_COMPILED, 0.7)
    cache = rows_module._STATIC_CACHES[target]["target", 2]
    decode(tiny, prompt_ids[2], "spectr", NOT_COMPILED, 0.7)
    assert rows_module._STATIC_CACHES[target]["target", 2] is cache  # same addresses: graphs replay


def test_bad_compile_argument(tiny):
    with pytest.raises(ValueError, match="compile"):
        decode(tiny, torch.tensor([256, 65]), "sd", "yes", 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "sd", "spectr"])
def test_compiled_greedy_tokens_equal_the_eager_path(tiny, prompt_ids, method):
    """torch.compile for real (inductor on the CPU; minutes the first time)."""
    for prompt in prompt_ids[:2]:
        eager = decode(tiny, prompt, method, False, 0.0, max_new_tokens=20)
        compiled = decode(tiny, prompt, method, True, 0.0, max_new_tokens=20)
        assert compiled.new_tokens == eager.new_tokens
