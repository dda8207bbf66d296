"""Stop strings: the checker (transformers' StopStringCriteria, fed the tokens of each iteration) stops where the
decoded text first contains a stop string, on a byte tokenizer and on a BPE one whose tokens overhang the stop
strings; the completion is cut before the earliest stop string."""

from __future__ import annotations

import random

import pytest

from spectr_repro.data.humaneval import CODE_STOPS
from spectr_repro.launch.stops import stop_checker, truncate_at_stop

STOP_SETS = [("\ndef ",), ("Question:", "\n\n\n"), ("\n### ",), ("\n",), CODE_STOPS, ("é—",), ("x", "\ndef ")]
PIECES = ["    return x\n", "def f(a):\n", "Question: how many?\n", "\n\n", "### Response", "print(1)\n", "#",
          "if a:\n", "class C", "café — ", "answer is 42. ", "\ndef", " ", "\n\n\n", "xé—y", "de", "f "]


def decoded_text_stop(tokenizer, stops):
    """The oracle (the runner's former checker): decode all the tokens so far and look for a stop string."""
    def should_stop(new_tokens):
        text = tokenizer.decode(new_tokens, skip_special_tokens=True)
        return any(stop in text for stop in stops)
    return should_stop


def first_stop(should_stop, tokens: list[int], blocks: list[int]) -> int | None:
    """The number of tokens emitted when generation ends, the engine appending ``blocks[i]`` tokens per call."""
    emitted, start = [], 0
    for size in blocks:
        emitted.extend(tokens[start:start + size])
        start += size
        if should_stop(emitted):
            return len(emitted)
        if start >= len(tokens):
            return None
    return None


def bpe_tokenizer():
    """A byte-level BPE trained here with merges across spaces and newlines: its tokens start and end inside
    the stop strings (``"x\\nde"``, ``"f "``...), the overhangs the criteria must catch."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(["".join(random.Random(i).choices(PIECES, k=30)) for i in range(200)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|eos|>")


def byte_tokenizer():
    from spectr_repro.models.tiny import make_byte_tokenizer

    return make_byte_tokenizer()


@pytest.mark.parametrize("make_tokenizer", [byte_tokenizer, bpe_tokenizer])
def test_generation_stops_where_the_decoded_text_first_holds_a_stop_string(make_tokenizer):
    tokenizer = make_tokenizer()
    rng = random.Random(0)
    compared = stopped = 0
    for stops in STOP_SETS:
        for _ in range(40):
            text = "".join(rng.choices(PIECES, k=rng.randint(1, 12)))
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
            blocks = [rng.randint(1, 6) for _ in tokens]  # AR appends 1 token a call, a verified block up to L+1
            expected = first_stop(decoded_text_stop(tokenizer, stops), tokens, blocks)
            assert first_stop(stop_checker(tokenizer, stops), tokens, blocks) == expected, (stops, text, blocks)
            compared += 1
            stopped += expected is not None
    assert stopped > compared // 3 and compared - stopped > compared // 10  # both outcomes are exercised


def test_a_stop_string_spanning_tokens_stops_at_its_last_token():
    tokenizer = byte_tokenizer()
    should_stop = stop_checker(tokenizer, ("\ndef ",))
    assert not should_stop(list(b"    return x\n"))
    assert should_stop(list(b"    return x\ndef f"))
    assert stop_checker(tokenizer, ()) is None
    tokens = list(b"ab\ndef cd")
    assert first_stop(stop_checker(tokenizer, ("\ndef ",)), tokens, [1] * len(tokens)) == len(b"ab\ndef ")


def test_a_stop_string_in_a_special_tokens_text_is_not_a_stop():
    """Special tokens are skipped in the decoded text; the criteria must not stop on their spelling either."""
    tokenizer = bpe_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|eos|>")
    oracle, checker = decoded_text_stop(tokenizer, ("eos",)), stop_checker(tokenizer, ("eos",))
    assert not oracle([eos]) and checker([eos]) == oracle([eos])


def test_the_completion_is_cut_before_the_earliest_stop_string():
    assert truncate_at_stop("a\nb\ndef g\nclass", ("\nclass", "\ndef ")) == "a\nb"
    assert truncate_at_stop("no stop here", ("\ndef ",)) == "no stop here"
