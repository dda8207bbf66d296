"""The cost model prices long contexts and batches of prompts as the work they are (issue 48 item 7).

The forwards of ``hardware.estimate`` (no calibration here) are priced from the pair's shapes: attention's FLOPs and
KV bytes over the cached context grow with it, a prefill is charged chunk by chunk on the growing cache, and a batch
of B prompts reads the weights once for B x K rows. The two recorded runs of this CPU are the check:

- the context replay (docs/context.md, 2026-12-04): seconds a prompt per bucket, 128 new tokens, K_max x L_max = 7 x 6;
- the grid replay (docs/replay.md, 2026-12-04): 42 s a prompt at four prompts a batch, 8 blocks a prompt of 7 x 24,
  the rules 2.66 s a block.

No calibration of this machine is in the repository: the test calibration is ``hardware=cpu``'s estimate, whose
attention rate was fitted to the context replay's seconds (conf/hardware/cpu.yaml says so), so the context check is
of the model's shape (each bucket and the total within 1.5x with one rate), and the grid check is independent of
that fit (its prompts are short: attention is a few per cent of its forwards).
"""

from __future__ import annotations

import math

import pytest

from spectr_repro.cost import Calibration, CellSpec, ForwardCosts
from spectr_repro.cost.model import (
    batch_prompt_seconds,
    calibrated_prompt_seconds,
    chunked_prefill_seconds,
    estimate_forward_costs,
    prompt_seconds,
)
from spectr_repro.cost.shapes import ModelledForwardCosts
from spectr_repro.launch.pairs import pair_config_of
from spectr_repro.replay.driver import parse

# docs/context.md, 2026-12-04: bucket -> (seconds a prompt, lowest and highest; blocks a prompt, lowest and highest)
CONTEXT_RUN = {"longcode_1k": ((48, 68), (23, 32)), "longcode_4k": ((143, 171), (22, 27)),
               "longcode_8k": ((375, 414), (23, 31)), "longcode_16k": ((748, 961), (20, 28))}
# docs/replay.md, 2026-12-04: the grid's four HumanEval prompts in one batch
GRID_SECONDS_A_PROMPT, GRID_BLOCKS_A_PROMPT, GRID_RULES_A_BLOCK = 42.0, 8, 2.66


def _groups(experiment: str, *extra: str):
    return {group.dataset: (group.run, group.settings) for group in parse([f"experiment={experiment}", *extra])}


@pytest.fixture(scope="module")
def context_groups():
    return _groups("context_qwen")


def _mid(low: float, high: float) -> float:
    return math.sqrt(low * high)


def test_a_forward_on_16k_cached_tokens_costs_more_than_on_1k_by_the_attention_term(context_groups):
    cfg, _ = context_groups["longcode_16k"]
    target, draft = estimate_forward_costs(CellSpec.of(cfg), pair_config_of(cfg))
    assert isinstance(target, ModelledForwardCosts)
    shape, rates = target.shape, target.rates
    for rows, tokens, logits in ((7, 7, "all"), (1, 1, "last"), (1, 256, "last")):
        extra = target.seconds(rows, tokens, logits, context=16384) - target.seconds(rows, tokens, logits, context=1024)
        attention = (shape.attention_flops(rows, tokens, 16384) - shape.attention_flops(rows, tokens, 1024)) / (
            rates.attention_tflops * 1e12)
        kv = (shape.kv_read_bytes(rows, tokens, 16384, 2) - shape.kv_read_bytes(rows, tokens, 1024, 2)) / (
            rates.bandwidth_gbs * 1e9)
        assert extra == pytest.approx(attention + kv, rel=1e-9)
        assert attention > 0 and kv > 0
    # a 16K prefill is more than 16 1K prefills: each chunk attends over the cache the earlier ones left
    assert chunked_prefill_seconds(target, 16384, 256) > 16 * chunked_prefill_seconds(target, 1024, 256) * 1.5
    # negative control: without attention's growth (every chunk priced on an empty cache) it is just 16x
    flat_16k = sum(target.seconds(1, 256, context=0) for _ in range(64))
    flat_1k = sum(target.seconds(1, 256, context=0) for _ in range(4))
    assert flat_16k == pytest.approx(16 * flat_1k)
    assert chunked_prefill_seconds(target, 16384, 256) > 1.5 * flat_16k


def test_the_context_plan_lands_within_1_5x_of_the_recorded_run(context_groups):
    total_predicted = total_measured = 0.0
    for bucket, ((low, high), blocks) in CONTEXT_RUN.items():
        cfg, settings = context_groups[bucket]
        blocks_a_prompt = _mid(*blocks)
        predicted = prompt_seconds(CellSpec.of(cfg), pair_config_of(cfg), None, settings.K_max, settings.L_max,
                                   blocks_a_prompt)
        assert 1 / 1.5 <= predicted / _mid(low, high) <= 1.5, (bucket, predicted, low, high)
        total_predicted += settings.num_prompts * predicted
        total_measured += settings.num_prompts * _mid(low, high)
    assert 1 / 1.5 <= total_predicted / total_measured <= 1.5
    # the seconds grow faster than the input: 16K costs more than 16x 1K's prefill and calls together
    cfg1, s1 = context_groups["longcode_1k"]
    cfg16, s16 = context_groups["longcode_16k"]
    one = prompt_seconds(CellSpec.of(cfg1), pair_config_of(cfg1), None, 7, 6, 25)
    sixteen = prompt_seconds(CellSpec.of(cfg16), pair_config_of(cfg16), None, 7, 6, 25)
    assert sixteen > 12 * one


def test_the_grid_plan_at_four_prompts_a_batch_lands_within_1_5x_of_the_recorded_run():
    cfg, settings = _groups("replay_qwen_grid", "replay.datasets=[humaneval]", "replay.temperatures=[0.4]")[
        "humaneval"]
    assert settings.batch_prompts == 4
    pair = pair_config_of(cfg)
    batch = prompt_seconds(CellSpec.of(cfg), pair, None, settings.K_max, settings.L_max, GRID_BLOCKS_A_PROMPT, batch=4)
    per_prompt = batch / 4 + GRID_BLOCKS_A_PROMPT * GRID_RULES_A_BLOCK
    assert 1 / 1.5 <= per_prompt / GRID_SECONDS_A_PROMPT <= 1.5, per_prompt
    # a batch reads the weights once for its B x K rows: four prompts together cost less than four alone
    alone = prompt_seconds(CellSpec.of(cfg), pair, None, settings.K_max, settings.L_max, GRID_BLOCKS_A_PROMPT)
    assert batch < 4 * alone
    # negative control: pricing each prompt as if alone (the plan before) misses the run by more
    alone_per_prompt = alone + GRID_BLOCKS_A_PROMPT * GRID_RULES_A_BLOCK
    assert abs(math.log(alone_per_prompt / GRID_SECONDS_A_PROMPT)) > abs(math.log(per_prompt / GRID_SECONDS_A_PROMPT))


def test_a_calibrated_prefill_is_priced_chunk_by_chunk_at_the_context_it_runs_on(context_groups):
    """A calibration measured at two contexts: the long prefill's later chunks cost what a forward on their cache
    costs, not what one on the shortest context does."""
    cfg, _ = context_groups["longcode_16k"]
    points = [(1, 256, "last", 1.0), (1, 256, "last", 3.0), (7, 7, "all", 1.0), (7, 7, "all", 2.0),
              (1, 2, "last", 0.1), (1, 2, "last", 0.2), (7, 1, "last", 0.1), (7, 1, "last", 0.2)]
    contexts = (0, 16384, 0, 16384, 0, 16384, 0, 16384)
    costs = ForwardCosts(tuple(points), contexts)
    calibration = Calibration("cpu", "qwen25coder_1.5b_0.5b", "bfloat16", "test", "2026-12-05", False, costs, costs)
    seconds = calibrated_prompt_seconds(CellSpec.of(cfg), calibration, 7, 6, 10)
    prefill = 2 * sum(1.0 + 2.0 * start / 16384 for start in range(0, 16384, 256))
    call = costs.seconds(1, 2, context=16448) + 5 * costs.seconds(7, 1, context=16448) + costs.seconds(
        7, 7, "all", context=16448)
    assert seconds == pytest.approx(prefill + 10 * call)
    assert seconds == pytest.approx(batch_prompt_seconds(costs, costs, 16384, 256, 128, 7, 6, 10))
    assert seconds > 2 * 64 * 1.0 + 10 * (0.1 + 5 * 0.1 + 1.0)  # more than the shortest context's prices
