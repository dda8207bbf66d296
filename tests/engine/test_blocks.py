"""``engine.drafted_blocks``: the decoding a step at a time, the rule left to the caller (what the replay drives).

Its promise: a caller that verifies every block with a rule gets the blocks and the tokens that ``generate`` (one
prompt) and ``generate_batch`` (several) give the same rule when it is not lossless (whole blocks, same seeds), so
the replay's blocks are the engine's, whichever way they are asked for.
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.engine import drafted_blocks, generate, generate_batch
from tests.engine.engine_helpers import VOCAB, RecordingRule

L = 4


@pytest.fixture(scope="module")
def prompts(prompt_ids):
    return [*prompt_ids, torch.tensor([256])]


def drive(decoding, rules):
    """Verify each step's blocks with each prompt's rule, as generate does; returns the decoding's outputs."""
    for step in decoding:
        for i, block in enumerate(step.blocks):
            step.results[i] = rules[block.prompt](block.draft_tokens, block.draft_probs, block.target_probs,
                                                  generator=block.generator, state=block.state)
    return decoding.outputs


@pytest.mark.parametrize("count", [1, 4])
def test_the_callers_rule_gets_the_blocks_generate_gives_a_rule_that_is_not_lossless(tiny, prompts, count):
    target, draft, _ = tiny
    budgets, seeds = 11, [41, 42, 43, 44][:count]
    driven, engine = [RecordingRule(False) for _ in range(count)], [RecordingRule(False) for _ in range(count)]
    decoding = drafted_blocks(target, draft, prompts[:count], K=2, L=L, temperature=0.7, max_new_tokens=budgets,
                              seeds=seeds, vocab_size=VOCAB)
    outputs = drive(decoding, driven)
    if count == 1:
        expected = [generate(target, draft, prompts[0], method=engine[0], K=2, L=L, temperature=0.7,
                             max_new_tokens=budgets, seed=seeds[0], vocab_size=VOCAB)]
    else:
        expected = generate_batch(target, draft, prompts, method=engine, K=2, L=L, temperature=0.7,
                                  max_new_tokens=budgets, seeds=seeds, vocab_size=VOCAB).outputs
    assert [o.new_tokens for o in outputs] == [o.new_tokens for o in expected]
    assert [o.target_calls for o in outputs] == [o.target_calls for o in expected]
    assert [d.blocks for d in driven] == [e.blocks for e in engine]
    assert all(len(tokens[0]) == L for rule in driven for tokens, _ in rule.blocks)  # whole blocks, to the end
    for out, want in zip(outputs, expected):
        for key in ("accepted_lengths", "block_lengths", "acceptance_by_position", "num_iterations"):
            assert out.stats[key] == want.stats[key], key
    if count > 1:  # power: the prompts' blocks differ from one another, so the comparisons above could fail
        assert driven[0].blocks != driven[1].blocks


def test_each_block_knows_where_in_its_output_it_sits(tiny, prompts):
    target, draft, _ = tiny
    positions, emitted = [], []
    decoding = drafted_blocks(target, draft, prompts[:2], K=2, L=L, temperature=0.7, max_new_tokens=9,
                              seeds=[1, 2], vocab_size=VOCAB)
    rule = RecordingRule(False)
    for step in decoding:
        for i, block in enumerate(step.blocks):
            positions.append((block.prompt, block.output_position))
            step.results[i] = rule(block.draft_tokens, block.draft_probs, block.target_probs,
                                   generator=block.generator, state=block.state)
            emitted.append((block.prompt, int(step.results[i].num_accepted) + 1))
    for prompt in (0, 1):
        starts = [p for b, p in positions if b == prompt]
        sizes = [n for b, n in emitted if b == prompt]
        assert starts[0] == 0 and starts[1:] == [sum(sizes[:j]) for j in range(1, len(sizes))]


def test_a_block_left_unverified_is_named(tiny, prompts):
    target, draft, _ = tiny
    decoding = drafted_blocks(target, draft, prompts[:2], K=2, L=L, temperature=0.7, max_new_tokens=9,
                              seeds=[1, 2], vocab_size=VOCAB)
    with pytest.raises(RuntimeError, match=r"prompt\(s\) \[0, 1\] were not verified"):
        for _ in decoding:
            pass


@pytest.mark.parametrize("count", [1, 2])
def test_the_engine_holds_inference_mode_only_for_its_own_work(tiny, prompts, count):
    """The caller verifies in its own mode, and one that stops early leaves no mode behind (a generator that held
    the mode across its yields would leave it on until it was collected)."""
    target, draft, _ = tiny
    decoding = drafted_blocks(target, draft, prompts[:count], K=2, L=L, temperature=0.7, max_new_tokens=9,
                              seeds=[1, 2][:count], vocab_size=VOCAB)
    modes = []
    for step in decoding:
        modes.append(torch.is_inference_mode_enabled())
        assert all(block.target_probs.is_inference() for block in step.blocks)  # made by the engine, in the mode
        break  # the caller gives up after one step
    assert modes == [False]
    assert not torch.is_inference_mode_enabled()
    with torch.inference_mode():  # a caller that wants the mode for its rules (the replay) sets it itself
        outputs = drive(drafted_blocks(target, draft, prompts[:count], K=2, L=L, temperature=0.7, max_new_tokens=9,
                                       seeds=[1, 2][:count], vocab_size=VOCAB), [RecordingRule(False)] * count)
    assert len(outputs) == count and all(out.new_tokens for out in outputs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[]), "non-empty"),
    (dict(seeds=[1]), "as many seeds"),
    (dict(seeds=[1, 2.5]), "seeds must be integers"),
    (dict(should_stop=[None]), "should_stop"),
    (dict(K=0), "K must be"),
    (dict(temperature=-1), "temperature"),
    (dict(draft=None), "draft model"),
])
def test_bad_arguments_raise_value_error_before_any_forward(tiny, kwargs, message):
    target, draft, _ = tiny
    arguments = dict(target=target, draft=draft, prompts=[[256, 65], [256]], K=2, L=2, temperature=0.5,
                     max_new_tokens=4, seeds=[1, 2])
    with pytest.raises(ValueError, match=message):
        drafted_blocks(**{**arguments, **kwargs})
