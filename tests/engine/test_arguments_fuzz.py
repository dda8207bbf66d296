"""Property-based fuzzing of ``engine.generate``'s argument checks on the tiny random pair.

Valid calls (every method, K, L, temperature, budget, seed, prompt form, vocabulary size, prefill chunk) must
decode: exactly ``max_new_tokens`` tokens (no EOS given), every token inside the vocabulary, block
efficiency = tokens / target calls. Each argument replaced by a bad value (wrong type, bool for an integer,
NaN/inf, negative, zero, out of range, wrong shape or dtype of the prompt, unknown method or verifier
option) must be refused with one ValueError before anything is decoded. Derandomised and few examples;
``SPECTR_FUZZ_EXAMPLES=500`` explores more.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectr_repro.engine import generate
from spectr_repro.verify import VERIFIERS
from tests.engine.engine_helpers import ALL_METHODS, draft_count

_EXPLORE = os.environ.get("SPECTR_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=int(_EXPLORE) if _EXPLORE else 30,
    derandomize=not _EXPLORE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TOKENIZER_VOCAB = 259  # make_tiny_pair: byte tokenizer; draft head 259 rows, target head 264


@st.composite
def valid_calls(draw) -> dict:
    method = draw(st.sampled_from(ALL_METHODS))
    K = draft_count(method, draw(st.integers(1, 3)))
    ids = draw(st.lists(st.integers(0, TOKENIZER_VOCAB - 1), min_size=1, max_size=6))
    form = draw(st.sampled_from(["list", "1d", "2d", "int32"]))
    prompt = {"list": ids, "1d": torch.tensor(ids), "2d": torch.tensor([ids]),
              "int32": torch.tensor(ids, dtype=torch.int32)}[form]
    return dict(
        input_ids=prompt,
        method=method,
        K=K,
        L=draw(st.integers(1, 3)),
        temperature=draw(st.one_of(st.just(0.0), st.just(0), st.floats(0.05, 2.0))),
        max_new_tokens=draw(st.integers(0, 3)),
        seed=draw(st.integers(-(2**63), 2**64 - 1)),
        vocab_size=draw(st.one_of(st.none(), st.integers(2, TOKENIZER_VOCAB))),
        prefill_chunk=draw(st.one_of(st.none(), st.integers(1, 4))),
    )


@settings(FUZZ, max_examples=int(_EXPLORE) if _EXPLORE else 12)  # each decodes: fewer examples
@given(call=valid_calls())
def test_valid_arguments_decode(tiny, call):
    target, draft, _ = tiny
    out = generate(target, draft, **call)
    vocab = call["vocab_size"] or TOKENIZER_VOCAB
    assert len(out.new_tokens) == call["max_new_tokens"]
    assert all(isinstance(t, int) and 0 <= t < vocab for t in out.new_tokens)
    if out.new_tokens:
        assert out.target_calls >= 1 and out.block_efficiency == len(out.new_tokens) / out.target_calls
    else:
        assert out.target_calls == 0 and out.block_efficiency == 0.0


# ---- one argument broken --------------------------------------------------------------------------
NOT_A_COUNT = [0, -1, 1.5, "3", None, True, float("nan"), float("inf"), [2]]  # K, L
BAD = {
    "K": NOT_A_COUNT,
    "L": NOT_A_COUNT,
    "temperature": [-0.1, float("nan"), float("inf"), -float("inf"), "0.5", None, True, [0.5]],
    "max_new_tokens": [-1, 2.0, "4", None, True, float("nan")],
    "method": ["spectr-gbv", "", "AR", None, 3, "sd ", "verify"],
    "seed": [1.5, "0", None, True, 2**64, -(2**63) - 1],
    "input_ids": [
        [], torch.tensor([], dtype=torch.long), [[1, 2], [3, 4]], torch.ones(1, 1, 3, dtype=torch.long),
        torch.tensor([1.5, 2.0]), [1.0, 2.0], torch.tensor([True]), [-1, 5], [5, 10**6], torch.tensor([[264]]),
        "hello", None, np.array([1.5]),
    ],
    "vocab_size": [0, -1, 10**6, 1.5, "259", True, 265],
    "prefill_chunk": [0, -2, 1.5, True, "8"],
    "eos_token_ids": [None, ["a"], [1.5], "3", [-1], [True]],
    "verifier_options": [{"bogus": 1}, {"carry_over": True, "check_input": False}, ["check_inputs"], "x"],
}
CASES = [(name, value) for name, values in BAD.items() for value in values]


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v!r}"[:40] for n, v in CASES])
def test_each_bad_argument_is_one_value_error(tiny, name, value):
    target, draft, _ = tiny
    call = dict(input_ids=[1, 2, 3], method="gbv" if name == "verifier_options" else "spectr", K=2, L=2,
                temperature=0.7, max_new_tokens=2, seed=0)
    if call["method"] == "gbv":
        call["K"] = 1
    call[name] = value
    with pytest.raises(ValueError) as caught:
        generate(target, draft, **call)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400, str(caught.value)


@FUZZ
@given(data=st.data())
def test_random_bad_arguments_are_refused(tiny, data):
    # Several bad arguments at once, on a random valid call: still one ValueError, never another exception.
    target, draft, _ = tiny
    call = data.draw(valid_calls())
    broken = data.draw(st.lists(st.sampled_from(sorted(BAD)), min_size=1, max_size=3, unique=True))
    for name in broken:
        call[name] = data.draw(st.sampled_from(BAD[name]))
    if "method" in broken or call["method"] == "ar":
        call.pop("verifier_options", None)  # AR takes no verifier: its options are never read
    if call.get("method") == "ar" and set(broken) <= {"K", "L", "verifier_options"} and "K" not in broken \
            and "L" not in broken:
        return
    with pytest.raises(ValueError):
        generate(target, draft, **call)


def test_speculative_method_without_a_draft(tiny):
    target, _, _ = tiny
    for method in VERIFIERS:
        with pytest.raises(ValueError, match="needs a draft model"):
            generate(target, None, [1, 2], method=method, K=draft_count(method), L=2, max_new_tokens=2)


def test_numpy_integers_are_integers(tiny):
    target, draft, _ = tiny
    out = generate(target, draft, np.array([1, 2, 3]), method="sd", K=np.int64(1), L=np.int64(2),
                   temperature=np.float32(0.5), max_new_tokens=np.int64(3), seed=np.int64(4))
    assert len(out.new_tokens) == 3 and not math.isnan(out.block_efficiency)
