"""Property-based fuzzing of the verifier contract (``verify/base.py``), for every registered rule.

Valid blocks (random, sparse, one-hot and p == q rows; float32 and float64; rows normalised only to the
contract's tolerance) must be handled exactly: a well-formed result that the rule's own exact law gives
positive probability, and a law that sums to 1. Every way of breaking the contract (NaN/inf, negative or
unnormalised probabilities, zero rows, mismatched shapes or vocabularies, wrong dtypes, out-of-range or
impossible draft tokens, non-tensors, empty blocks) must be refused with one ValueError that names the
rule. Examples are derandomised (the same ones every run) and few, so this stays a fast test;
``SPECTR_FUZZ_EXAMPLES=2000`` explores more, randomly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectr_repro.verify import VERIFIERS, get_verifier

_EXPLORE = os.environ.get("SPECTR_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=int(_EXPLORE) if _EXPLORE else 40,
    derandomize=not _EXPLORE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
RULES = list(VERIFIERS)
KINDS = ("random", "sparse", "one_hot", "equal")


def _rows(generator: torch.Generator, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    """float64 probability rows of ``shape`` ([..., V]) of one kind, every row with positive mass."""
    if kind == "one_hot":
        index = torch.randint(shape[-1], shape[:-1], generator=generator)
        return torch.nn.functional.one_hot(index, shape[-1]).double()
    raw = torch.rand(shape, generator=generator, dtype=torch.float64) ** 3  # peaked, as a real LM is
    if kind == "sparse":
        raw = raw * (torch.rand(shape, generator=generator) < 0.5)
        raw[..., 0] += (raw.sum(-1) == 0).double()  # no empty row
    return raw / raw.sum(-1, keepdim=True)


@st.composite
def blocks(draw, rule: str):
    """(draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V]) satisfying the contract: the
    drafts form a tree (drafts sharing a prefix share its rows, so some drafts coincide in part)."""
    K = 1 if VERIFIERS[rule].single_draft else draw(st.integers(1, 3))
    L, V = draw(st.integers(1, 3)), draw(st.integers(2, 5))
    kind = draw(st.sampled_from(KINDS))
    q_dtype, p_dtype = (draw(st.sampled_from([torch.float32, torch.float64])) for _ in range(2))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q_rows, p_rows = {}, {}  # prefix -> row: one context, one row
    tokens = torch.zeros(K, L, dtype=torch.long)
    q = torch.zeros(K, L, V, dtype=torch.float64)
    p = torch.zeros(K, L + 1, V, dtype=torch.float64)
    for k in range(K):  # a loop over drafts and positions is fine in a test's input builder
        for i in range(L + 1):
            prefix = tuple(tokens[k, :i].tolist())
            if prefix not in p_rows:
                q_row = _rows(generator, (V,), "random" if kind == "equal" else kind)
                q_rows[prefix] = q_row
                p_rows[prefix] = q_row if kind == "equal" and i < L else _rows(generator, (V,), kind)
            p[k, i] = p_rows[prefix]
            if i < L:
                q[k, i] = q_rows[prefix]
                tokens[k, i] = torch.multinomial(q[k, i], 1, generator=generator)
    if draw(st.booleans()):  # off by less than the tolerance of the contract (1e-3 float32, 1e-8 float64)
        slack = 4e-4 if q_dtype == torch.float32 else 4e-9
        q = q * (1 + slack * (2 * torch.rand(1, L, 1, generator=generator, dtype=torch.float64) - 1))
    return tokens, q.to(q_dtype), p.to(p_dtype)


def _law_probability(outcomes, tokens: tuple[int, ...]) -> float:
    return sum(o.probability for o in outcomes if tuple(int(t) for t in o.tokens) == tokens)


@pytest.mark.parametrize("rule", RULES)
@FUZZ
@given(data=st.data())
def test_valid_blocks_are_handled_exactly(rule, data):
    draft_tokens, draft_probs, target_probs = data.draw(blocks(rule))
    K, L = draft_tokens.shape
    V = draft_probs.shape[-1]
    verify = get_verifier(rule)
    seed = data.draw(st.integers(0, 2**31 - 1))
    result = verify(draft_tokens, draft_probs, target_probs, generator=torch.Generator().manual_seed(seed))
    tokens = result.tokens
    assert tokens.dim() == 1 and tokens.dtype == torch.long and len(tokens) == result.num_accepted + 1
    assert 0 <= result.num_accepted <= L and 0 <= result.draft_index < K
    assert torch.equal(tokens[:-1], draft_tokens[result.draft_index, : result.num_accepted].long())
    assert 0 <= int(tokens[-1]) < V
    law = verify.law(draft_tokens, draft_probs, target_probs)
    probabilities = torch.tensor([o.probability for o in law], dtype=torch.float64)
    exact = draft_probs.dtype == target_probs.dtype == torch.float64  # normalised to 4e-9
    assert bool((probabilities >= (-1e-12 if exact else -1e-6)).all())
    assert abs(float(probabilities.sum()) - 1) < (1e-7 if exact else 5e-3)
    assert _law_probability(law, tuple(tokens.tolist())) > 0, "sampled an outcome outside the rule's law"


# ---- breaking the contract -----------------------------------------------------------------------
def _mutate(kind: str, tokens, q, p, generator: torch.Generator):
    """One way of breaking the contract; returns the broken (tokens, q, p)."""
    K, L, V = q.shape
    k, i = int(torch.randint(K, (1,), generator=generator)), int(torch.randint(L, (1,), generator=generator))
    q, p, tokens = q.clone(), p.clone(), tokens.clone()
    which = p if int(torch.randint(2, (1,), generator=generator)) else q
    if kind == "nan":
        which[k, i, 0] = float("nan")
    elif kind == "inf":
        which[k, i, -1] = float("inf")
    elif kind == "negative":
        which[k, i, 1] += which[k, i, 0] + 0.25  # the row still sums to 1
        which[k, i, 0] = -0.25
    elif kind == "unnormalised":
        which[k, i] *= 1.5
    elif kind == "zero_row":
        which[k, i] = 0
    elif kind == "half_precision":
        return tokens, q.half(), p
    elif kind == "bfloat16":
        return tokens, q, p.bfloat16()
    elif kind == "integer_probs":
        return tokens, q, (p > 0.5).long()
    elif kind == "float_tokens":
        return tokens.double(), q, p
    elif kind == "bool_tokens":
        return tokens > 0, q, p
    elif kind == "token_too_large":
        tokens[k, i] = V
    elif kind == "token_negative":
        tokens[k, i] = -1
    elif kind == "impossible_token":  # a draft token the draft gave probability 0
        token = int(tokens[k, i])
        q[k, i, token] = 0
        q[k, i, (token + 1) % V] = 1 - q[k, i].sum() + q[k, i, (token + 1) % V]
    elif kind == "target_vocab_larger":
        p = torch.cat([p, torch.zeros(K, L + 1, 1, dtype=p.dtype)], dim=-1)
    elif kind == "draft_vocab_larger":
        q = torch.cat([q, torch.zeros(K, L, 1, dtype=q.dtype)], dim=-1)
    elif kind == "target_one_row_short":
        p = p[:, :L]
    elif kind == "draft_one_row_short":
        q = q[:, : L - 1] if L > 1 else q[:, :0]
    elif kind == "target_more_drafts":
        p = torch.cat([p, p[:1]], dim=0)
    elif kind == "tokens_1d":
        tokens = tokens[0]
    elif kind == "tokens_3d":
        tokens = tokens.unsqueeze(-1)
    elif kind == "probs_2d":
        q = q[0]
    elif kind == "empty_block":
        return tokens[:, :0], q[:, :0], p[:, :1]
    elif kind == "no_drafts":
        return tokens[:0], q[:0], p[:0]
    elif kind == "empty_vocabulary":
        return tokens, q[..., :0], p[..., :0]
    elif kind == "list_probs":
        return tokens, q.tolist(), p
    elif kind == "numpy_probs":
        return tokens, q, p.numpy()
    elif kind == "list_tokens":
        return tokens.tolist(), q, p
    elif kind == "none_target":
        return tokens, q, None
    elif kind == "inconsistent_prefix":  # a second copy of draft k whose target row 0 differs: two contexts
        other = p[k : k + 1].clone()
        other[0, 0] = other[0, 0].roll(1)
        other[0, 0, 0] += 0.25
        other[0, 0] /= other[0, 0].sum()
        return torch.cat([tokens, tokens[k : k + 1]]), torch.cat([q, q[k : k + 1]]), torch.cat([p, other])
    else:
        raise AssertionError(kind)
    return tokens, q, p


MUTATIONS = (
    "nan", "inf", "negative", "unnormalised", "zero_row", "half_precision", "bfloat16", "integer_probs",
    "float_tokens", "bool_tokens", "token_too_large", "token_negative", "impossible_token",
    "target_vocab_larger", "draft_vocab_larger", "target_one_row_short", "draft_one_row_short",
    "target_more_drafts", "tokens_1d", "tokens_3d", "probs_2d", "empty_block", "no_drafts", "empty_vocabulary",
    "list_probs", "numpy_probs", "list_tokens", "none_target", "inconsistent_prefix",
)


@pytest.mark.parametrize("rule", RULES)
@FUZZ
@given(data=st.data(), kind=st.sampled_from(MUTATIONS))
def test_broken_contracts_are_one_clear_value_error(rule, data, kind):
    tokens, q, p = data.draw(blocks(rule))
    tokens, q, p = _mutate(kind, tokens, q, p, torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1))))
    verify = get_verifier(rule)
    with pytest.raises(ValueError, match=rf"^{rule}\b") as caught:
        verify(tokens, q, p, generator=torch.Generator().manual_seed(0))
    assert "\n" not in str(caught.value)  # one message, one line
    with pytest.raises(ValueError, match=rf"^{rule}\b"):
        verify.law(tokens, q, p)


@pytest.mark.parametrize("rule", [name for name, spec in VERIFIERS.items() if spec.single_draft])
def test_single_draft_rules_refuse_two_drafts(rule):
    generator = torch.Generator().manual_seed(0)
    q = _rows(generator, (2, 2, 3), "random")
    p = _rows(generator, (2, 3, 3), "random")
    tokens = torch.multinomial(q.reshape(-1, 3), 1, generator=generator).reshape(2, 2)
    with pytest.raises(ValueError, match=f"{rule} verifies a single draft; got K=2"):
        get_verifier(rule)(tokens, q, p)


def test_mutations_break_what_they_say():
    # Negative control for the fuzz above: each mutation really changes a valid block (and numpy stays numpy).
    generator = torch.Generator().manual_seed(0)
    q = _rows(generator, (2, 2, 3), "random")
    p = _rows(generator, (2, 3, 3), "random")
    tokens = torch.multinomial(q.reshape(-1, 3), 1, generator=generator).reshape(2, 2)
    for kind in MUTATIONS:
        broken = _mutate(kind, tokens, q, p, torch.Generator().manual_seed(1))
        same = all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                   and a.shape == b.shape and torch.equal(a, b) for a, b in zip(broken, (tokens, q, p)))
        assert not same, kind
    assert isinstance(_mutate("numpy_probs", tokens, q, p, generator)[2], np.ndarray)
