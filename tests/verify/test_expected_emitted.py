"""Verifier.expected_emitted: the exact E[tau + 1 | drafts] in closed form, checked against the exact law.

On random toy blocks (float64) the closed form must equal sum(probability * len(tokens)) over ``law()``'s
outcomes to 1e-9 (both are exact; observed ~1e-16). Negative control: the same closed form on a perturbed
target differs from the original law by far more than 1e-9 (the check can fail). At Qwen's vocabulary the
closed form runs on the device with no host read and returns a 0-dim float64 tensor in [1, L + 1]; the
multi-draft rules (spectr, rbv) are also checked on blocks with shared prefixes and identical drafts, on every
draft tuple of a toy pair, and at K = 7, L = 12 on Qwen's vocabulary (a stated number of host reads).
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.bench.blocks import synthetic_block
from spectr_repro.bench.counters import count_ops
from spectr_repro.toy import block_tensors, draft_tuples, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier
from spectr_repro.verify import rbv as rbv_module

from .conftest import EXACT_TV

CLOSED_FORM = ("sd", "bv", "gbv", "spectr", "rbv", "spectr_gbv", "mpbv")  # the rules that must have one (others may return None)
MULTI_DRAFT = ("spectr", "rbv", "spectr_gbv", "mpbv")


def _random_block(V: int, K: int, L: int, generator: torch.Generator):
    """Drafts sharing the context: K drafts of L tokens drawn from q, rows tied along shared prefixes."""
    rows: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def row_pair(prefix):
        if prefix not in rows:
            p = torch.rand(V, generator=generator, dtype=torch.float64) ** 3 + 1e-3
            q = torch.rand(V, generator=generator, dtype=torch.float64) ** 3 + 1e-3
            rows[prefix] = (p / p.sum(), q / q.sum())
        return rows[prefix]

    tokens = torch.zeros(K, L, dtype=torch.long)
    draft_probs = torch.zeros(K, L, V, dtype=torch.float64)
    target_probs = torch.zeros(K, L + 1, V, dtype=torch.float64)
    for k in range(K):
        for i in range(L + 1):
            p, q = row_pair(tuple(tokens[k, :i].tolist()))
            target_probs[k, i] = p
            if i < L:
                draft_probs[k, i] = q
                tokens[k, i] = torch.multinomial(q, 1, generator=generator)[0]
    return tokens, draft_probs, target_probs


def _tied_block(V: int, tokens: torch.Tensor, generator: torch.Generator):
    """Verifier inputs for given drafts ``tokens`` [K, L]: random p, q rows, one pair per distinct prefix (so
    rows of drafts sharing a prefix agree, as the contract requires). q >= 1e-3 / V: every token is drawable."""
    K, L = tokens.shape
    rows: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
    draft_probs = torch.zeros(K, L, V, dtype=torch.float64)
    target_probs = torch.zeros(K, L + 1, V, dtype=torch.float64)
    for k in range(K):
        for i in range(L + 1):
            prefix = tuple(tokens[k, :i].tolist())
            if prefix not in rows:
                p = torch.rand(V, generator=generator, dtype=torch.float64) ** 3 + 1e-3
                q = torch.rand(V, generator=generator, dtype=torch.float64) ** 3 + 1e-3
                rows[prefix] = (p / p.sum(), q / q.sum())
            target_probs[k, i] = rows[prefix][0]
            if i < L:
                draft_probs[k, i] = rows[prefix][1]
    return tokens, draft_probs, target_probs


def _shared_prefix_cases(seed: int):
    """Blocks whose drafts share prefixes by construction: every V in {2, 3, 4}, K in {2, 3}, L in {1..4}, with
    draft 1 a copy of draft 0 cut at a random depth (0 = unrelated, L = identical) and, for K = 3, draft 2
    identical to draft 0 or to draft 1."""
    generator = torch.Generator().manual_seed(seed)
    for V in (2, 3, 4):
        for K in (2, 3):
            for L in (1, 2, 3, 4):
                tokens = torch.randint(V, (K, L), generator=generator)
                cut = int(torch.randint(L + 1, (1,), generator=generator))
                tokens[1, :cut] = tokens[0, :cut]
                if K == 3:
                    tokens[2] = tokens[int(torch.randint(2, (1,), generator=generator))]
                yield _tied_block(V, tokens, generator)


def _law_mean(verifier, block, state=None) -> float:
    return sum(o.probability * len(o.tokens) for o in verifier.law(*block, state=state))


def _cases(name: str):
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    Ks = [1] if VERIFIERS[name].single_draft else [1, 2, 3]
    for index in range(24):
        V = 2 + index % 4
        K = Ks[index % len(Ks)]
        L = 1 + index % 4
        yield _random_block(V, K, L, generator)


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_closed_form_is_the_law_mean(name):
    verifier = get_verifier(name)
    blocks = list(_cases(name))
    values = [verifier.expected_emitted(*block) for block in blocks]
    if name not in CLOSED_FORM and values[0] is None:
        assert all(v is None for v in values)  # no closed form: the rule says so on every block
        return
    for block, value in zip(blocks, values):
        assert value is not None and value.dtype == torch.float64 and value.dim() == 0
        assert abs(float(value) - _law_mean(verifier, block)) < EXACT_TV


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_negative_control_perturbed_target(name):
    """The closed form on a target mixed with the uniform law no longer matches the original law's mean."""
    verifier = get_verifier(name)
    gaps = []
    for tokens, dp, tp in _cases(name):
        perturbed = 0.7 * tp + 0.3 / tp.shape[-1]
        value = float(verifier.expected_emitted(tokens, dp, perturbed))
        gaps.append(abs(value - _law_mean(verifier, (tokens, dp, tp))))
    assert max(gaps) > 1e-3  # a thousand times above the 1e-9 threshold of the real check


def test_gbv_closed_form_with_a_carried_state():
    """gbv with the state a previous iteration returns (its carry-over frames) still matches its law."""
    verifier = get_verifier("gbv")
    generator = torch.Generator().manual_seed(5)
    checked = 0
    for _ in range(6):
        first = _random_block(3, 1, 3, generator)
        states = [o.state for o in verifier.law(*first) if o.state is not None and o.state.frames]
        for state in states[:3]:
            block = _random_block(3, 1, 3, generator)
            assert abs(float(verifier.expected_emitted(*block, state=state)) - _law_mean(verifier, block, state)) \
                < EXACT_TV
            checked += 1
    assert checked > 0


# Host reads at K = 1: none, except the rules whose closed form is a scan on the host (spectr_gbv reads the
# tokens and its h table; mpbv the path's tokens and ratios, then its 2L count masses).
READS_AT_K1 = {"spectr_gbv": 2, "mpbv": 2}


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_closed_form_at_qwen_vocabulary_reads_nothing(name):
    L = 12
    block = synthetic_block(1, L, 151_936, seed=3, draft_noise=1.0)
    verifier = get_verifier(name, check_inputs=False)
    with count_ops() as counts:
        value = verifier.expected_emitted(*block)
    assert counts.host_reads == READS_AT_K1.get(name, 0)
    assert value.dtype == torch.float64 and value.dim() == 0 and value.device == block[1].device
    assert 1.0 <= float(value) <= L + 1


# rbv computes its masses H(w, c) by one pass per query ("direct") or from sorted rows ("sorted"), chosen by
# the number of queries: each path is forced in turn, and both must give the law's mean.
RULE_PATHS = [pytest.param("spectr", None, id="spectr"), pytest.param("rbv", "direct", id="rbv-direct"),
              pytest.param("rbv", "sorted", id="rbv-sorted"), pytest.param("spectr_gbv", None, id="spectr_gbv"),
              pytest.param("mpbv", None, id="mpbv")]


def _force_excess_path(monkeypatch, excess_path: str | None) -> None:
    if excess_path is not None:
        monkeypatch.setattr(rbv_module, "SORT_ABOVE_QUERIES_PER_ROW", 10**9 if excess_path == "direct" else 0)


@pytest.mark.parametrize("name, excess_path", RULE_PATHS)
def test_multi_draft_closed_form_on_shared_prefixes(name, excess_path, monkeypatch):
    """Shared prefixes and identical drafts (the survivor groups of spectr, the skipped / re-scanned drafts of
    rbv) on 24 blocks of every V in {2, 3, 4}, K in {2, 3}, L in 1..4."""
    _force_excess_path(monkeypatch, excess_path)
    verifier = get_verifier(name)
    checked = 0
    for block in _shared_prefix_cases(seed=11):
        assert abs(float(verifier.expected_emitted(*block)) - _law_mean(verifier, block)) < EXACT_TV
        checked += 1
    assert checked == 24


@pytest.mark.parametrize("name, excess_path", RULE_PATHS)
@pytest.mark.parametrize("K, L", [(2, 2), (3, 1)])
def test_multi_draft_closed_form_on_every_toy_draft_tuple(name, excess_path, K, L, monkeypatch):
    """Every draft tuple of a V = 3 toy pair (81 resp. 27 tuples: identical drafts and shared prefixes among
    them), at the toy's own conditionals."""
    _force_excess_path(monkeypatch, excess_path)
    target, draft = toy_pair(vocab_size=3, seed=2, draft_noise=0.6)
    verifier = get_verifier(name)
    gaps = []
    for _, tokens in draft_tuples(draft, (), K, L):
        block = (tokens, *block_tensors(target, draft, (), tokens))
        gaps.append(abs(float(verifier.expected_emitted(*block)) - _law_mean(verifier, block)))
    assert len(gaps) == 3 ** (K * L) and max(gaps) < EXACT_TV


@pytest.mark.parametrize("excess_path", ["direct", "sorted"])
def test_rbv_closed_form_at_a_wider_vocabulary(excess_path, monkeypatch):
    """V = 256 (many tokens per threshold of the sorted path): still the law's mean."""
    _force_excess_path(monkeypatch, excess_path)
    verifier = get_verifier("rbv")
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(256, (3, 3), generator=generator)
    tokens[1, :2] = tokens[0, :2]
    tokens[2] = tokens[0]
    block = _tied_block(256, tokens, generator)
    assert abs(float(verifier.expected_emitted(*block)) - _law_mean(verifier, block)) < EXACT_TV


# Host reads of one call at K = 7, L = 12, V = 151,936: spectr reads the tokens, then the rho* pieces of every
# survivor group (<= 3 groups a depth: <= 36 rows, <= 2 batches of _PIECE_ELEMENTS); rbv reads the tokens only.
MULTI_DRAFT_READS = {"spectr": 3, "rbv": 1, "spectr_gbv": 2, "mpbv": 2}


@pytest.fixture(scope="module", params=["independent", "shared"])
def qwen_block(request):
    """A K = 7, L = 12 block at Qwen's vocabulary, float32 like the engine's: drafts drawn independently, or
    seven identical drafts (the largest survivor groups for spectr, the most commit histories for rbv)."""
    return synthetic_block(7, 12, 151_936, agreement=request.param, seed=3, draft_noise=1.0)


@pytest.mark.parametrize("name", MULTI_DRAFT)
def test_multi_draft_closed_form_at_qwen_vocabulary(name, qwen_block):
    L = qwen_block[0].shape[1]
    verifier = get_verifier(name, check_inputs=False)
    with count_ops() as counts:
        value = verifier.expected_emitted(*qwen_block)
    assert counts.host_reads <= MULTI_DRAFT_READS[name]
    assert value.dtype == torch.float64 and value.dim() == 0 and value.device == qwen_block[1].device
    assert torch.isfinite(value) and 1.0 <= float(value) <= L + 1


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_by_length_equals_each_sub_block(name):
    """expected_emitted_by_length (mpbv shares one path across lengths) = the closed form of each sub-block."""
    generator = torch.Generator().manual_seed(8)
    K = 1 if VERIFIERS[name].single_draft else 3
    verifier = get_verifier(name)
    for _ in range(4):
        tokens, dp, tp = _random_block(4, K, 4, generator)
        values = verifier.expected_emitted_by_length(tokens, dp, tp, [1, 2, 4])
        assert sorted(values) == [1, 2, 4]
        for L, value in values.items():
            alone = verifier.expected_emitted(tokens[:, :L], dp[:, :L], tp[:, :L + 1])
            assert abs(float(value) - float(alone)) < EXACT_TV
            assert abs(float(value) - _law_mean(verifier, (tokens[:, :L], dp[:, :L], tp[:, :L + 1]))) < EXACT_TV
