"""End-to-end tests of engine.generate on the tiny random Llama pair (float32, CPU)."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.engine import acceptance_by_position, generate, shared_vocab_size
from spectr_repro.models.tiny import make_byte_tokenizer, make_tiny_pair
from tests.engine.engine_helpers import ALL_METHODS, SPECULATIVE, draft_count

VOCAB = 259  # the byte tokenizer's length; the target head has 264 rows


def greedy_reference(target, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding via transformers (padded head ids suppressed)."""
    head = target.lm_head.weight.shape[0]
    out = target.generate(prompt.unsqueeze(0), do_sample=False, max_new_tokens=max_new_tokens,
                          suppress_tokens=list(range(VOCAB, head)), eos_token_id=None, pad_token_id=None)
    return out[0, prompt.numel():].tolist()


@pytest.mark.parametrize("method", ALL_METHODS)
def test_temperature_zero_equals_target_greedy(tiny, prompt_ids, method):
    target, draft, _ = tiny
    for prompt in prompt_ids:
        reference = greedy_reference(target, prompt, 20)
        out = generate(target, draft, prompt, method=method, K=draft_count(method), L=3, temperature=0.0,
                       max_new_tokens=20, seed=0, vocab_size=VOCAB)
        assert out.new_tokens == reference
    # The draft does differ from the target, so some drafted tokens were rejected on the way.
    if method != "ar":
        assert any(tau < 3 for tau in out.stats["accepted_lengths"])


@pytest.mark.parametrize("method", ["sd", "bv", "spectr", "rbv"])
def test_draft_equal_to_target_accepts_every_block(method):
    target, draft, _ = make_tiny_pair(seed=1, draft_noise=0.0)  # same weights (draft head = target[:259])
    L, K = 4, draft_count(method)
    prompt = torch.tensor([256, *b"Once upon a time"])
    out = generate(target, draft, prompt, method=method, K=K, L=L, temperature=0.7,
                   max_new_tokens=4 * (L + 1), seed=3, vocab_size=VOCAB)
    assert out.stats["accepted_lengths"] == [L] * 4
    assert out.block_efficiency == L + 1
    assert out.target_calls == 4


@pytest.mark.parametrize("method", SPECULATIVE)
def test_inputs_pass_the_verifier_checks_and_seed_is_reproducible(tiny, prompt_ids, method):
    """The hot loop skips the verifier's input checks; here they run on every call, at T > 0."""
    target, draft, _ = tiny
    kwargs = dict(method=method, K=draft_count(method), L=3, temperature=0.7, max_new_tokens=24,
                  vocab_size=VOCAB, verifier_options={"check_inputs": True})
    first = generate(target, draft, prompt_ids[0], seed=11, **kwargs)
    again = generate(target, draft, prompt_ids[0], seed=11, **kwargs)
    other = generate(target, draft, prompt_ids[0], seed=12, **kwargs)
    assert first.new_tokens == again.new_tokens
    assert first.stats["accepted_lengths"] == again.stats["accepted_lengths"]
    assert first.new_tokens != other.new_tokens
    assert len(first.new_tokens) == 24 and max(first.new_tokens) < VOCAB
    stats = first.stats
    assert first.target_calls == stats["num_iterations"] == len(stats["accepted_lengths"])
    assert first.block_efficiency == pytest.approx(24 / first.target_calls)
    assert stats["acceptance_by_position"] == acceptance_by_position(stats["accepted_lengths"], 3,
                                                                     stats["block_lengths"])
    assert set(stats["time_s"]) == {"prefill", "draft", "target", "verify", "total"}
    parts = sum(v for k, v in stats["time_s"].items() if k != "total")
    assert 0 < parts <= stats["time_s"]["total"]


def test_ar_sampling_is_reproducible_and_counts_one_call_per_token(tiny, prompt_ids):
    target, _, _ = tiny
    kwargs = dict(method="ar", temperature=0.7, max_new_tokens=15, seed=5)
    out = generate(target, None, prompt_ids[1], **kwargs)
    again = generate(target, None, prompt_ids[1][None], **kwargs)  # [1, T] input
    assert out.new_tokens == again.new_tokens and len(out.new_tokens) == 15
    assert out.target_calls == 15 and out.block_efficiency == 1.0
    assert out.stats["time_s"]["draft"] == 0.0 and out.stats["time_s"]["verify"] == 0.0


def _first_emitted_position(tokens: list[int], candidates: set[int]) -> int:
    return next(i for i, t in enumerate(tokens) if t in candidates)


@pytest.mark.parametrize("method", ["ar", "sd", "spectr"])
def test_eos_ends_generation_exactly(tiny, prompt_ids, method):
    """Declaring a token that the free run emits as EOS cuts the output right after it."""
    target, draft, _ = tiny
    kwargs = dict(method=method, K=draft_count(method), L=4, temperature=0.0, max_new_tokens=30,
                  vocab_size=VOCAB)
    free = generate(target, draft, prompt_ids[2], **kwargs).new_tokens
    eos = free[7]
    stop = _first_emitted_position(free, {eos})
    out = generate(target, draft, prompt_ids[2], eos_token_ids=(eos, 10_000), **kwargs)
    assert out.new_tokens == free[: stop + 1]
    if method == "ar":
        assert out.target_calls == stop + 1


@pytest.mark.parametrize("method", ["ar", "sd", "spectr", "rbv"])
@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 7])
def test_max_new_tokens_is_exact(tiny, prompt_ids, method, max_new_tokens):
    target, draft, _ = tiny
    L = 4
    out = generate(target, draft, prompt_ids[0], method=method, K=draft_count(method), L=L, temperature=0.7,
                   max_new_tokens=max_new_tokens, seed=2, vocab_size=VOCAB)
    assert len(out.new_tokens) == max_new_tokens
    # Every target call emitted at least one token; the last block may have been truncated.
    assert out.target_calls == len(out.stats["accepted_lengths"])
    assert out.target_calls <= max_new_tokens
    emitted_before_last = sum(tau + 1 for tau in out.stats["accepted_lengths"][:-1])
    assert emitted_before_last < max_new_tokens or max_new_tokens == 0
    longer = generate(target, draft, prompt_ids[0], method=method, K=draft_count(method), L=L,
                      temperature=0.7, max_new_tokens=max_new_tokens + 9, seed=2, vocab_size=VOCAB)
    # Truncation, not a different run: identical up to the first block drafted shorter than L (which
    # draws fewer random numbers), i.e. everywhere for AR.
    same = len(out.new_tokens)
    if method != "ar":
        blocks = out.stats["block_lengths"]
        full = next((i for i, b in enumerate(blocks) if b < L), len(blocks))
        same = min(same, sum(tau + 1 for tau in out.stats["accepted_lengths"][:full]))
    assert longer.new_tokens[:same] == out.new_tokens[:same]


def test_should_stop_is_checked_after_each_iteration(tiny, prompt_ids):
    target, draft, _ = tiny
    seen = []

    def stop_after_five(tokens):
        seen.append(len(tokens))
        return len(tokens) >= 5

    out = generate(target, draft, prompt_ids[0], method="sd", L=3, temperature=0.7, max_new_tokens=50,
                   seed=0, should_stop=stop_after_five, vocab_size=VOCAB)
    assert 5 <= len(out.new_tokens) <= 5 + 3
    assert seen == sorted(seen) and seen[-1] == len(out.new_tokens) and len(seen) == out.target_calls


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(K=0), "K must"),
        (dict(L=0), "L must"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(method="specter"), "unknown method"),
        (dict(method="sd", K=2), "single draft"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(input_ids=[]), "empty"),
        (dict(input_ids=[[1, 2], [3, 4]]), "1-D or"),
        (dict(vocab_size=300), "vocab_size"),
    ],
)
def test_bad_arguments_raise_value_error(tiny, kwargs, message):
    target, draft, _ = tiny
    arguments = dict(input_ids=[256, 65], method="spectr", K=2, L=2, temperature=0.5, max_new_tokens=4)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        generate(target, draft, **arguments)


def test_speculative_method_without_draft_is_an_error(tiny):
    target, _, _ = tiny
    with pytest.raises(ValueError, match="needs a draft"):
        generate(target, None, [256, 65], method="sd", L=2, max_new_tokens=3)


def test_vocabulary_defaults_to_the_smaller_head(tiny, prompt_ids):
    target, draft, _ = tiny
    explicit = generate(target, draft, prompt_ids[0], method="sd", L=2, temperature=0.7, max_new_tokens=10,
                        seed=4, vocab_size=VOCAB)
    default = generate(target, draft, prompt_ids[0], method="sd", L=2, temperature=0.7, max_new_tokens=10,
                       seed=4)
    assert default.new_tokens == explicit.new_tokens


def test_shared_vocab_size_rejects_different_tokenizers():
    from transformers import PreTrainedTokenizerFast

    byte_tokenizer = make_byte_tokenizer()
    assert shared_vocab_size(byte_tokenizer, make_byte_tokenizer()) == 259
    bigger = make_byte_tokenizer()
    bigger.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    with pytest.raises(ValueError, match="tokenizers differ"):
        shared_vocab_size(byte_tokenizer, bigger)
    swapped = PreTrainedTokenizerFast(tokenizer_object=make_byte_tokenizer().backend_tokenizer,
                                      eos_token="<|bos|>", bos_token="<|eos|>")
    with pytest.raises(ValueError, match="EOS"):
        shared_vocab_size(byte_tokenizer, swapped)


def test_acceptance_by_position_profile():
    assert acceptance_by_position([0, 2, 2, 1], 2) == [0.75, 2 / 3]
    assert acceptance_by_position([0, 0], 3) == [0.0, None, None]
    assert acceptance_by_position([], 2) == [None, None]
    # A block drafted 2 long and fully accepted never reached position 3.
    assert acceptance_by_position([1, 2], 3, [3, 2]) == [1.0, 0.5, None]
    assert acceptance_by_position([3, 2], 3, [3, 2]) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="does not fit"):
        acceptance_by_position([3], 3, [2])
    with pytest.raises(ValueError, match="block lengths"):
        acceptance_by_position([1, 1], 3, [3])


@pytest.mark.parametrize("method, shortened", [("sd", True), ("rbv", True), ("spectr_gbv", False)])
@pytest.mark.parametrize("budget", [3, 11])
def test_last_block_is_drafted_only_as_long_as_needed(tiny, prompt_ids, method, shortened, budget):
    """Lossless rules draft the last block up to the tokens still wanted; the release keeps L."""
    target, draft, _ = tiny
    L = 4
    out = generate(target, draft, prompt_ids[0], method=method, K=draft_count(method), L=L, temperature=0.7,
                   max_new_tokens=budget, seed=3, vocab_size=VOCAB)
    emitted = 0
    for tau, block in zip(out.stats["accepted_lengths"], out.stats["block_lengths"]):
        expected = max(1, min(L, budget - emitted - 1)) if shortened else L
        assert block == expected
        emitted += tau + 1
    assert len(out.new_tokens) == budget
    if budget == 3:  # the first block can yield at most 3 tokens: drafted 2 long, or L for the release
        assert out.stats["block_lengths"][0] == (2 if shortened else L)


def _count_forwards(model):
    calls = []
    handle = model.register_forward_hook(lambda module, args, kwargs, output: calls.append(
        kwargs["input_ids"].shape), with_kwargs=True)
    return calls, handle


@pytest.mark.parametrize("method", ["ar", "sd", "spectr"])
@pytest.mark.parametrize("prefill_chunk", [None, 8])
def test_the_prompt_has_no_forward_of_its_own(tiny, prompt_ids, method, prefill_chunk):
    """The prompt rides on the first target call (AR, K=1) and the draft's first call, as in HF generate;
    at K > 1 the target runs it once at batch size 1. Chunking adds one forward per extra chunk."""
    target, draft, _ = tiny
    K = draft_count(method)
    prompt = prompt_ids[1]
    target_calls, target_hook = _count_forwards(target)
    draft_calls, draft_hook = _count_forwards(draft)
    try:
        out = generate(target, draft, prompt, method=method, K=K, L=3, temperature=0.7, max_new_tokens=12,
                       seed=0, vocab_size=VOCAB, prefill_chunk=prefill_chunk)
    finally:
        target_hook.remove()
        draft_hook.remove()
    chunks = 0 if prefill_chunk is None else -(-(prompt.numel() - 1) // prefill_chunk) - 1  # extra calls
    expected_target = out.target_calls + (K > 1) + chunks
    assert len(target_calls) == expected_target
    if method == "ar":
        assert draft_calls == []
    else:
        assert len(draft_calls) == sum(out.stats["block_lengths"]) + chunks
        assert draft_calls[chunks][0] == 1 and draft_calls[chunks][1] <= prompt.numel()


@pytest.mark.parametrize("method", ["ar", "sd", "spectr", "gbv"])
def test_chunked_prompt_gives_the_same_greedy_decoding(tiny, prompt_ids, method):
    target, draft, _ = tiny
    prompt = prompt_ids[1]
    reference = greedy_reference(target, prompt, 16)
    out = generate(target, draft, prompt, method=method, K=draft_count(method), L=3, temperature=0.0,
                   max_new_tokens=16, seed=0, vocab_size=VOCAB, prefill_chunk=5)
    assert prompt.numel() > 3 * 5  # several chunks
    assert out.new_tokens == reference


def test_bad_prefill_chunk_is_an_error(tiny):
    target, draft, _ = tiny
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="prefill_chunk"):
            generate(target, draft, [256, 65], method="sd", L=2, max_new_tokens=3, prefill_chunk=bad)


@pytest.mark.parametrize("method", ["spectr", "gbv"])
def test_half_precision_models_sample_in_float32(method):
    """bf16 models: logits go to float32 before the softmax, so the verifier's checks pass."""
    target, draft, _ = make_tiny_pair(seed=2, dtype=torch.bfloat16)
    out = generate(target, draft, [256, *b"half"], method=method, K=draft_count(method), L=3, temperature=0.7,
                   max_new_tokens=12, seed=0, vocab_size=VOCAB, verifier_options={"check_inputs": True})
    assert len(out.new_tokens) == 12 and max(out.new_tokens) < VOCAB
