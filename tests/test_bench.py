"""scripts/bench.py's accounting on the tiny pair: forward counting, the side-by-side profile, and that
neither AR loop spends a forward on the prompt alone (transformers' generate does not; ours must not)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from spectr_repro.models import ModelPair
from spectr_repro.tiny import make_tiny_pair

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pair():
    target, draft, tokenizer = make_tiny_pair(seed=0)
    return ModelPair(name="tiny", target=target, draft=draft, tokenizer=tokenizer, eos_token_ids=(),
                     vocab_size=259, device=torch.device("cpu"), dtype=torch.float32)


def test_forward_meter_counts_calls_and_tokens_and_detaches(bench, pair):
    with torch.inference_mode(), bench.ForwardMeter(pair.device, target=pair.target, draft=pair.draft) as meter:
        pair.target(input_ids=torch.tensor([[256, 1, 2]]))
        pair.target(input_ids=torch.tensor([[3], [4]]))
        pair.draft(input_ids=torch.tensor([[5]]))
    assert meter.stats["target"]["calls"] == 2 and meter.stats["target"]["tokens_fed"] == 5
    assert meter.stats["draft"]["calls"] == 1 and meter.stats["draft"]["tokens_fed"] == 1
    assert meter.stats["target"]["seconds"] > 0
    with torch.inference_mode():
        pair.target(input_ids=torch.tensor([[7]]))
    assert meter.stats["target"]["calls"] == 2  # hooks removed on exit


def test_ar_side_by_side_reports_one_forward_per_token_for_both_loops(bench, pair):
    prompt = torch.tensor([256, *b"def add(a, b):"])
    result = bench.bench_ar_vs_hf(pair, [prompt], temperature=0.7, max_new_tokens=6, repeats=2)
    assert result["ratio"] == pytest.approx(result["ours_tokens_per_s"] / result["hf_tokens_per_s"])
    assert len(result["ours_all"]) == len(result["hf_all"]) == 2
    for who in ("ours", "hf"):
        profile = result[f"{who}_profile"]
        assert profile["tokens"] == 12
        assert profile["target_forwards_per_token"] == 1.0  # the prompt rides on the first forward
        assert profile["block_efficiency"] == 1.0
        assert "draft_forwards_per_token" not in profile
        assert 0 < profile["fraction_inside_forwards"] <= 1


def test_hf_generation_config_disables_the_models_own_eos(bench, pair):
    """Both contenders must emit exactly max_new_tokens: an EOS the model's config declares is ignored."""
    target = pair.target
    prompt = torch.tensor([[256, *b"def f():"]])
    free = target.generate(prompt, do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = int(free[0, prompt.shape[1] + 2])  # the run's third token
    try:
        config = bench.hf_generation_config(target, 0.7, 12)
        config.do_sample = False
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    finally:
        target.generation_config.eos_token_id = saved
    assert out.shape[1] - prompt.shape[1] == 12
