"""Verifier.expected_emitted: the exact E[tau + 1 | drafts] in closed form, checked against the exact law.

On random toy blocks (float64) the closed form must equal sum(probability * len(tokens)) over ``law()``'s
outcomes to 1e-9 (both are exact; observed ~1e-16). Negative control: the same closed form on a perturbed
target differs from the original law by far more than 1e-9 (the check can fail). At Qwen's vocabulary the
closed form runs on the device with the host reads each rule states (none for most) and returns a 0-dim float64
tensor in [1, L + 1]; the multi-draft rules (spectr, rbv, sbv) are also checked on blocks with shared prefixes and
identical drafts, on every draft tuple of a toy pair, and at K = 7, L = 12 on Qwen's vocabulary (a stated number
of host reads). sbv is also checked on its large-vocabulary path (tail tokens) against its law, and against the
Monte-Carlo mean of its sampler at Qwen's vocabulary; sbvf (whose fallback changes the law) has none.
"""

from __future__ import annotations

import math

import pytest
import torch

from spectr_repro.bench.blocks import synthetic_block
from spectr_repro.bench.counters import count_ops
from spectr_repro.sampling import sample
from spectr_repro.theory.toy import block_tensors, draft_tuples, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier, validate_inputs
from spectr_repro.verify import rbv as rbv_module
from tests.verify.verify_helpers import EXACT_TV

from .test_sbv import CAPPED, padded_pair

# The rules that must have a closed form (others may return None: sbvf, whose fallback changes its law).
CLOSED_FORM = ("sd", "bv", "gbv", "spectr", "rbv", "spectr_gbv", "mpbv", "sbv")
MULTI_DRAFT = ("spectr", "rbv", "spectr_gbv", "mpbv", "sbv")


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


# Host reads of one K = 1 call at Qwen's vocabulary: none, except the rules whose closed form is a scan on the
# host: spectr_gbv reads the tokens and its h table; mpbv the path's tokens and ratios, then its 2L count
# masses; sbv's walk reads the draft tokens and, on the CPU, two for its one batch of rules (the ranked set
# read off the threshold; a GPU takes a top-k).
READS_AT_K1 = {"spectr_gbv": 2, "mpbv": 2, "sbv": 3}


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_closed_form_at_qwen_vocabulary_reads_nothing(name):
    L = 12
    block = synthetic_block(1, L, 151_936, seed=3, draft_noise=1.0)
    verifier = get_verifier(name, check_inputs=False)
    with count_ops() as counts:
        value = verifier.expected_emitted(*block)
    assert counts.host_reads <= READS_AT_K1.get(name, 0)
    assert value.dtype == torch.float64 and value.dim() == 0 and value.device == block[1].device
    assert 1.0 - EXACT_TV <= float(value) <= L + 1 + EXACT_TV  # exact bounds, with round-off's slack


# rbv computes its masses H(w, c) by one pass per query ("direct") or from sorted rows ("sorted"), chosen by
# the number of queries: each path is forced in turn, and both must give the law's mean.
RULE_PATHS = [pytest.param("spectr", None, id="spectr"), pytest.param("rbv", "direct", id="rbv-direct"),
              pytest.param("rbv", "sorted", id="rbv-sorted"), pytest.param("spectr_gbv", None, id="spectr_gbv"),
              pytest.param("mpbv", None, id="mpbv"), pytest.param("sbv", None, id="sbv")]


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
# survivor group (<= 3 groups a depth: <= 36 rows, <= 2 batches of _PIECE_ELEMENTS); rbv reads the tokens only;
# sbv reads the tokens, the scan's events at each prefix shared by >= 2 drafts the walk reaches (12 when the drafts
# agree to the end) and, on the CPU, two per batch of rules (the shared prefixes, then each draft's lone depths).
MULTI_DRAFT_READS = {"spectr": 3, "rbv": 1, "spectr_gbv": 2, "mpbv": 2, "sbv": 15}


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
    # E[τ + 1] lies in [1, L + 1] exactly; the float64 sum over the law's branches may overshoot by round-off
    # (13.000000000000004 at L = 12 on one CI CPU), so the bounds carry EXACT_TV's slack.
    assert torch.isfinite(value) and 1.0 - EXACT_TV <= float(value) <= L + 1 + EXACT_TV


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


# ---------------------------------------------------------------------------------------------- sbv and sbvf
@pytest.mark.parametrize("options", [CAPPED, {**CAPPED, "count_posterior": False}, {}], ids=["capped", "conditional",
                                                                                            "defaults"])
def test_sbv_closed_form_on_the_large_vocabulary_path(options):
    """V = 100 (> sbv's toy memo size: the batched rules of the walk, no memo) with rank_size = head_size = 2 of the
    3 real tokens, so one token is in the tail on every row (the exact Z matters): still the law's mean, on drafts
    that share prefixes at every depth, agree to the end, or part at once."""
    target, draft = padded_pair()
    verifier = get_verifier("sbv", **options)
    drafts = ([[0, 1, 2], [0, 1, 0], [0, 2, 1]], [[2, 1, 0], [2, 1, 0], [2, 1, 0]], [[0, 0, 1], [1, 2, 2], [2, 0, 0]])
    for rows in drafts:
        tokens = torch.tensor(rows)
        block = (tokens, *block_tensors(target, draft, (), tokens))
        assert abs(float(verifier.expected_emitted(*block)) - _law_mean(verifier, block)) < EXACT_TV


def test_sbvf_has_no_closed_form():
    """sbvf's fallback changes the law after an early stop: it must not inherit sbv's expectation. With
    fallback=False it is sbv itself, and so is its expectation."""
    block = _random_block(3, 3, 2, torch.Generator().manual_seed(8))
    assert get_verifier("sbvf").expected_emitted(*block) is None
    plain = get_verifier("sbvf", fallback=False).expected_emitted(*block)
    assert abs(float(plain) - float(get_verifier("sbv").expected_emitted(*block))) < EXACT_TV
    assert abs(float(plain) - _law_mean(get_verifier("sbvf", fallback=False), block)) < EXACT_TV


SBV_DRAWS = 400


@pytest.mark.slow  # ~60 s on the loaded 2-core machine (400 sampler calls at V = 151,936)
def test_sbv_closed_form_is_the_sampler_mean_at_qwen_vocabulary():
    """K = 3, L = 6, V = 151,936 (float32 rows with a tail past rank_size): the mean of tau + 1 over SBV_DRAWS
    fixed-seed draws of the sampler lies within 4 standard errors of expected_emitted (2.84 here: tau is spread
    over 0..L). The rows are one shared synthetic row per depth (valid for any drafts); draft 1 repeats draft 0's
    first 2 tokens (it shares 3), draft 2 is drawn apart: the walk meets a shared prefix, splits and lone drafts."""
    K, L = 3, 6
    tokens, draft_probs, target_probs = synthetic_block(K, L, 151_936, agreement="shared", seed=5, draft_noise=0.5)
    tokens = tokens.clone()
    generator = torch.Generator().manual_seed(6)
    for k in (1, 2):
        tokens[k] = sample(draft_probs[0], generator)
    tokens[1, :2] = tokens[0, :2]
    validate_inputs(tokens, draft_probs, target_probs)
    verifier = get_verifier("sbv", check_inputs=False)
    exact = float(verifier.expected_emitted(tokens, draft_probs, target_probs))
    lengths = [verifier(tokens, draft_probs, target_probs, generator=generator).num_accepted + 1
               for _ in range(SBV_DRAWS)]
    mean = sum(lengths) / SBV_DRAWS
    spread = math.sqrt(sum((x - mean) ** 2 for x in lengths) / (SBV_DRAWS - 1))
    assert spread > 0  # the block is neither always rejected nor always accepted: the check can fail
    print(f"sbv at Qwen vocabulary: exact {exact:.4f}, sampler mean {mean:.4f}, sd {spread:.3f}")
    assert abs(mean - exact) < 4 * spread / math.sqrt(SBV_DRAWS), (mean, exact, spread)
