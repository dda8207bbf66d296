"""engine.generate_batch: B prompts at once give each prompt exactly what engine.generate gives it.

The tiny pair is float32, so batched and batch-1 forwards differ by rounding only (~1e-7): greedy
tokens are equal, and so are sampled tokens with the same seeds (a draw flips only when its uniform
lands within ~1e-7 of a boundary; the seeds below are fixed, so this is deterministic). The law
tests per row are in test_law.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import spectr_repro.engine.batch_cache as batch_cache
from spectr_repro.engine import generate, generate_batch
from spectr_repro.engine.batch_cache import BatchCache
from spectr_repro.engine.forward import forward_logits
from spectr_repro.verify import get_verifier
from tests.engine.engine_helpers import ALL_METHODS, SPECULATIVE, VOCAB, RecordingRule, draft_count

L = 4


@pytest.fixture(scope="module")
def prompts(prompt_ids):
    """Four prompts of different lengths (21 to 95 tokens), one of them a single token."""
    return [*prompt_ids, torch.tensor([256])]


def batch_one(tiny, prompts, method, budgets, seeds, **kwargs):
    target, draft, _ = tiny
    return [generate(target, draft, prompt, method=method, K=draft_count(method), L=L, max_new_tokens=budget,
                     seed=seed, vocab_size=VOCAB, **kwargs) for prompt, budget, seed in zip(prompts, budgets, seeds)]


def batched(tiny, prompts, method, budgets, seeds, **kwargs):
    target, draft, _ = tiny
    return generate_batch(target, draft, prompts, method=method, K=draft_count(method), L=L, max_new_tokens=budgets,
                          seeds=seeds, vocab_size=VOCAB, **kwargs)


def assert_same_decoding(alone, together):
    assert len(alone) == len(together.outputs)
    for a, b in zip(alone, together.outputs):
        assert b.new_tokens == a.new_tokens
        assert b.target_calls == a.target_calls and b.block_efficiency == a.block_efficiency
        for key in ("accepted_lengths", "block_lengths", "acceptance_by_position", "num_iterations"):
            assert b.stats[key] == a.stats[key], key
        assert b.stats["batch_prompts"] == len(together.outputs)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_greedy_batched_equals_batch_one(tiny, prompts, method):
    """Different prompt lengths in one batch, prompts ending at different times (budgets 17, 3, 12, 9: the
    batch shrinks as they finish, and the short last blocks of lossless rules differ per prompt)."""
    budgets, seeds = [17, 3, 12, 9], [0, 1, 2, 3]
    alone = batch_one(tiny, prompts, method, budgets, seeds, temperature=0.0)
    together = batched(tiny, prompts, method, budgets, seeds, temperature=0.0)
    assert_same_decoding(alone, together)
    if method != "ar":  # drafts were rejected on the way, so holes were masked
        assert any(tau < L for out in together.outputs for tau in out.stats["accepted_lengths"])


@pytest.mark.parametrize("method", SPECULATIVE)
def test_sampled_batched_equals_batch_one_with_the_same_seeds(tiny, prompts, method):
    """T > 0: each prompt draws from its own generator in batch 1's order, so the tokens (and the BE) of a
    prompt do not depend on its batch mates; the verifier's input checks run on every call."""
    budgets, seeds = [14, 9, 14, 6], [21, 22, 23, 24]
    options = {"check_inputs": True}
    alone = batch_one(tiny, prompts, method, budgets, seeds, temperature=0.7, verifier_options=options)
    together = batched(tiny, prompts, method, budgets, seeds, temperature=0.7, verifier_options=options)
    assert_same_decoding(alone, together)
    # The batch mates do matter to nothing: the same prompt in another batch, another position.
    again = batched(tiny, [prompts[2], prompts[0]], method, [14, 14], [23, 21], temperature=0.7)
    assert again.outputs[0].new_tokens == together.outputs[2].new_tokens
    assert again.outputs[1].new_tokens == together.outputs[0].new_tokens


@pytest.mark.parametrize("method", ["ar", "sd", "spectr", "gbv"])
def test_eos_mid_batch_ends_that_prompt_only(tiny, prompts, method):
    """A token that prompt 0 emits at position 5 is declared EOS: prompt 0 stops right after it, the others
    go on (and stop at their own first occurrence, if any), each as at batch 1."""
    budgets, seeds = [16, 16, 16, 16], [5, 6, 7, 8]
    free = batched(tiny, prompts, method, budgets, seeds, temperature=0.0).outputs[0].new_tokens
    eos = (free[5],)
    alone = batch_one(tiny, prompts, method, budgets, seeds, temperature=0.0, eos_token_ids=eos)
    together = batched(tiny, prompts, method, budgets, seeds, temperature=0.0, eos_token_ids=eos)
    assert_same_decoding(alone, together)
    lengths = [len(out.new_tokens) for out in together.outputs]
    assert lengths[0] == free.index(eos[0]) + 1 < 16 and max(lengths) == 16


def test_should_stop_per_prompt(tiny, prompts):
    stops = [lambda tokens: len(tokens) >= 3, None, lambda tokens: 65 in tokens, None]
    alone = [generate(*tiny[:2], p, method="sd", L=L, temperature=0.7, max_new_tokens=12, seed=s, vocab_size=VOCAB,
                      should_stop=stop) for p, s, stop in zip(prompts, range(4), stops)]
    together = generate_batch(*tiny[:2], prompts, method="sd", L=L, temperature=0.7, max_new_tokens=12,
                              seeds=range(4), vocab_size=VOCAB, should_stop=stops)
    assert_same_decoding(alone, together)
    assert 3 <= len(together.outputs[0].new_tokens) < 12


@pytest.mark.parametrize("method", ["sd", "rbv"])
def test_compaction_keeps_every_token(tiny, prompts, method, monkeypatch):
    """Re-packing the caches after every iteration (holes gathered away) changes nothing."""
    compactions = []
    original = BatchCache.compact
    monkeypatch.setattr(batch_cache, "MIN_HOLES_TO_COMPACT", 0)
    monkeypatch.setattr(batch_cache, "HOLES_PER_TOKEN_TO_COMPACT", 0.0)
    monkeypatch.setattr(BatchCache, "compact", lambda self: compactions.append(1) or original(self))
    budgets, seeds = [14, 9, 14, 6], [31, 32, 33, 34]
    alone = batch_one(tiny, prompts, method, budgets, seeds, temperature=0.7)
    together = batched(tiny, prompts, method, budgets, seeds, temperature=0.7)
    assert_same_decoding(alone, together)
    assert len(compactions) >= 4


def test_finished_prompts_leave_the_batch(tiny, prompts):
    """Rows of finished prompts are dropped from both caches: later forwards have fewer rows."""
    target, draft, _ = tiny
    rows = {"target": [], "draft": []}
    hooks = [model.register_forward_hook(lambda m, a, kw, o, name=name: rows[name].append(kw["input_ids"].shape[0]),
                                         with_kwargs=True) for name, model in (("target", target), ("draft", draft))]
    try:
        out = generate_batch(target, draft, prompts[:3], method="spectr", K=2, L=3, temperature=0.7,
                             max_new_tokens=[1, 20, 5], seeds=[0, 1, 2], vocab_size=VOCAB)
    finally:
        for hook in hooks:
            hook.remove()
    assert [len(o.new_tokens) for o in out.outputs] == [1, 20, 5]
    batched_target = rows["target"][3:]  # after the three batch-1 prefills
    assert batched_target[0] == 3 * 2  # every prompt's K rows
    assert batched_target[-1] == 2  # the one prompt left
    assert batched_target == sorted(batched_target, reverse=True)


def test_batch_cache_forward_equals_a_fresh_forward(tiny):
    """Stacked caches of different lengths, a padded block, a truncation and a compaction: each row's
    logits are those of a plain forward on its own text."""
    target, _, _ = tiny
    texts = [torch.tensor([256, *b"a longer first text"]), torch.tensor([256, 7]), torch.tensor([256, *b"mid one"])]
    with torch.inference_mode():
        caches = []
        for text in texts:
            cache = DynamicCache()
            forward_logits(target, text[None], cache, VOCAB)
            caches.append(cache)
        stacked = BatchCache.from_caches(caches, torch.device("cpu"))
        block = torch.tensor([[0, 40, 41], [50, 51, 52], [0, 0, 60]])  # 2, 3 and 1 real tokens, right-aligned
        stacked.forward(target, block, [2, 3, 1], VOCAB, keep_last=3)
        stacked.truncate([len(texts[0]) + 1, len(texts[1]) + 3, len(texts[2])])  # row 2 drops its token
        stacked.compact()
        follow = torch.tensor([[70], [71], [72]])
        logits = stacked.forward(target, follow, [1, 1, 1], VOCAB, keep_last=1)[:, -1]
        kept = [[40], [50, 51, 52], []]
        for row, (text, extra) in enumerate(zip(texts, kept)):
            full = torch.cat([text, torch.tensor(extra, dtype=torch.long), follow[row]])
            fresh = target(full[None]).logits[0, -1, :VOCAB]
            torch.testing.assert_close(logits[row], fresh, atol=1e-5, rtol=1e-5)


SHARED_RULE = RecordingRule(False)  # one instance named twice in a per-prompt list: refused


def test_one_verifier_instance_per_prompt_sees_only_its_prompt(tiny, prompts):
    """method = one instance per prompt: each instance is called on its own prompt's blocks only, exactly as
    engine.generate calls a fresh instance on that prompt alone; each prompt's block lengths follow its own
    instance (not lossless: every block drafted whole, L, to the end; lossless: a short last block)."""
    target, draft, _ = tiny
    lossless = [False, True, False, True]
    budgets, seeds = [13, 3, 6, 4], [41, 42, 43, 44]  # a budget <= L: a lossless rule's first block is short
    alone, together = [RecordingRule(flag) for flag in lossless], [RecordingRule(flag) for flag in lossless]
    outputs = [generate(target, draft, prompt, method=rule, K=2, L=L, temperature=0.7, max_new_tokens=budget,
                        seed=seed, vocab_size=VOCAB)
               for prompt, rule, budget, seed in zip(prompts, alone, budgets, seeds)]
    batch = generate_batch(target, draft, prompts, method=together, K=2, L=L, temperature=0.7, max_new_tokens=budgets,
                           seeds=seeds, vocab_size=VOCAB)
    assert_same_decoding(outputs, batch)
    for a, b, out in zip(alone, together, batch.outputs):
        assert b.blocks == a.blocks and len(b.blocks) == out.target_calls
    whole = [all(length == L for length in out.stats["block_lengths"]) for out in batch.outputs]
    assert whole == [True, False, True, False]
    # Power: another prompt's recorded blocks differ from this one's.
    assert together[0].blocks != alone[1].blocks and together[2].blocks != alone[0].blocks


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompts=[]), "non-empty"),
        (dict(seeds=[1]), "seeds"),
        (dict(max_new_tokens=[4]), "max_new_tokens"),
        (dict(max_new_tokens=[4, -1]), "max_new_tokens"),
        (dict(should_stop=[None]), "should_stop"),
        (dict(method="sd", K=2), "single draft"),
        (dict(prefill_chunk=0), "prefill_chunk"),
        (dict(method=[RecordingRule(False)]), "1 verifiers"),
        (dict(method=[RecordingRule(False), "spectr"]), "sequence of Verifier"),
        (dict(method=[SHARED_RULE, SHARED_RULE]), "distinct"),
        (dict(method=[RecordingRule(False), get_verifier("sd")]), "single draft"),
    ],
)
def test_bad_arguments_raise_value_error(tiny, kwargs, message):
    target, draft, _ = tiny
    arguments = dict(prompts=[[256, 65], [256]], method="spectr", K=2, L=2, temperature=0.5, max_new_tokens=4)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        generate_batch(target, draft, **arguments)

