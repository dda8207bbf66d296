"""The replay's shared work (issue 35) computes what each rule computes on its own, on fixed blocks.

``block_estimates`` takes K = 1 values from the single-draft rule each rule reduces to, shares sbv's rules and
mpbv's sorted rows across row groups, draws and lengths (``shared_block``), walks sbv's events once for every L
and draws sbvf's control variate and its sbv control from one run (``paired_draw``). The reference below asks
every rule alone, as the replay did before: each sub-block through the rule's own ``expected_emitted`` (at K = 1 the
lossless rules' reductions'), sbvf as sbv's exact value plus the mean of (sbvf draw - sbv draw) over the same seeds, a
rule with no closed form (hsd_rrs) as the mean of its draws over the same seeds. Exact values agree to float32
round-off (the blocks are float32; rules normalise in float64 in different orders: measured <= 2e-7 here), and
the control variate to the same: its paired draws are the very same draws. Negative control: the reference of
another prompt's block is far outside that tolerance (the test has the power to see a wrong block).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from spectr_repro.replay import block_estimates
from spectr_repro.replay.core import single_draft_reductions
from spectr_repro.theory.toy import block_tensors, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier
from spectr_repro.verify import rbv as rbv_module

METHODS = list(VERIFIERS)
K_VALUES, L_VALUES, DRAWS = [1, 2, 4], [2, 5], 4
TOLERANCE = 1e-6  # float32 rows (1.2e-7 relative) over tau + 1 <= 6 tokens
VOCABULARY = 300  # above sbv's toy memo (64 tokens): the large-vocabulary code paths the replay runs


def _rows(prefix: tuple[int, ...], prompt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) after ``prefix``: a function of the prefix (drafts that agree share their rows, as the contract asks),
    peaked (Zipf 1.5 over a random order: the top token has ~0.4, so the drafts often agree) and q != p."""
    generator = torch.Generator().manual_seed(zlib.crc32(repr((prompt, prefix)).encode()))
    logits = -1.5 * (torch.randperm(VOCABULARY, generator=generator).double() + 1).log()
    noise = 0.7 * torch.randn(VOCABULARY, generator=generator, dtype=torch.float64)
    return torch.softmax(logits, -1).float(), torch.softmax(logits + noise, -1).float()


def synthetic_block(prompt: int, K: int = 4, L: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One engine-like block of K i.i.d. drafts of L tokens (draft_tokens, draft_probs, target_probs), float32."""
    generator = torch.Generator().manual_seed(prompt)
    tokens = torch.zeros(K, L, dtype=torch.long)
    draft_probs, target_probs = torch.zeros(K, L, VOCABULARY), torch.zeros(K, L + 1, VOCABULARY)
    for k in range(K):
        prefix: tuple[int, ...] = ()
        for i in range(L + 1):
            p, q = _rows(prefix, prompt)
            target_probs[k, i] = p
            if i < L:
                draft_probs[k, i] = q
                tokens[k, i] = int(torch.multinomial(q.double(), 1, generator=generator))
                prefix += (int(tokens[k, i]),)
    return tokens, draft_probs, target_probs


def _mean_accepted(rule, block, seeds) -> float:
    return sum(int(rule(*block, generator=torch.Generator().manual_seed(s)).num_accepted) for s in seeds) / len(seeds)


def reference_values(block, seed: int) -> dict[tuple[str, int, int], float]:
    """Every (method, K, L) of the grid by each rule alone on each disjoint row group (the replay before sharing)."""
    tokens, draft_probs, target_probs = block
    K_max = tokens.shape[0]
    seeds = torch.randint(0, 2**62, (DRAWS,), generator=torch.Generator().manual_seed(seed)).tolist()
    rules = {name: get_verifier(name, check_inputs=False) for name in METHODS}
    reductions = single_draft_reductions(METHODS, K_VALUES, {})
    values = {}
    for method in METHODS:
        Ks = [1] if VERIFIERS[method].single_draft else K_VALUES
        for K in Ks:
            for L in L_VALUES:
                total = 0.0
                for group in range(K_max // K):
                    rows = slice(group * K, (group + 1) * K)
                    sub = (tokens[rows, :L], draft_probs[rows, :L], target_probs[rows, :L + 1])
                    exact = rules[method].expected_emitted(*sub)
                    if exact is None and K == 1 and method in reductions:  # hsd_rrs at K = 1: BV's exact value
                        exact = rules[reductions[method]].expected_emitted(*sub)
                    control = VERIFIERS[method].shares_draws_with
                    if exact is None and control:  # sbvf: sbv's exact value + the paired draws' mean difference
                        exact = rules[control].expected_emitted(*sub) + _mean_accepted(rules[method], sub, seeds) \
                            - _mean_accepted(rules[control], sub, seeds)
                    elif exact is None:  # no closed form (hsd_rrs): the mean of its own draws, tau + 1
                        exact = _mean_accepted(rules[method], sub, seeds) + 1.0
                    total += float(exact)
                values[(method, K, L)] = total / (K_max // K)
    return values


def replay_values(block, seed: int) -> dict[tuple[str, int, int], float]:
    estimates = block_estimates(*block, METHODS, K_VALUES, L_VALUES, DRAWS, torch.Generator().manual_seed(seed))
    return {(e.method, e.K, e.L): e.tokens for e in estimates}


@pytest.fixture(scope="module")
def blocks():
    return {prompt: synthetic_block(prompt) for prompt in (1, 2)}


def test_shared_replay_equals_each_rule_alone(blocks):
    for prompt, block in blocks.items():
        replay, reference = replay_values(block, seed=7), reference_values(block, seed=7)
        assert replay.keys() == reference.keys()
        gaps = {key: abs(replay[key] - reference[key]) for key in replay}
        assert max(gaps.values()) < TOLERANCE, (prompt, {key: gap for key, gap in gaps.items() if gap >= TOLERANCE})


def test_negative_control_another_prompts_blocks_fail(blocks):
    """The reference of prompt 2's block against the replay of prompt 1's: most cells far outside the tolerance."""
    replay, other = replay_values(blocks[1], seed=7), reference_values(blocks[2], seed=7)
    far = [key for key in replay if abs(replay[key] - other[key]) > 100 * TOLERANCE]
    assert len(far) > len(replay) // 2


@pytest.mark.parametrize("toy", [False, True])
def test_sbvf_paired_draw_is_its_own_draw_and_sbvs_draw_of_the_seed(blocks, toy):
    """paired_draw(seed) = (sbvf's num_accepted, sbv's num_accepted) of separate runs with that seed, on a synthetic
    block and on a toy block where the fallback raises the mean by 0.24 tokens (tests/replay/test_block_estimates:
    some draws differ there, so the pairing is not trivially equal)."""
    if toy:
        target, draft = toy_pair(vocab_size=3, seed=1)
        tokens = torch.tensor([[0, 2], [0, 2], [0, 1]])
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    else:
        tokens, draft_probs, target_probs = blocks[1]
    sbvf, sbv = get_verifier("sbvf", check_inputs=False), get_verifier("sbv", check_inputs=False)
    differing = 0
    for seed in range(40):
        own, control = sbvf.paired_draw(tokens, draft_probs, target_probs, torch.Generator().manual_seed(seed))
        alone = [int(rule(tokens, draft_probs, target_probs, generator=torch.Generator().manual_seed(seed))
                     .num_accepted) for rule in (sbvf, sbv)]
        assert [own, control] == alone, seed
        differing += own != control
    assert differing > 0 or not toy


def test_single_draft_reductions_only_with_default_options_and_never_sampled():
    """Lossless rules only: the release keeps its own K = 1 values (the report tests its K=1 = GBV claim on them)."""
    assert single_draft_reductions(["sd", "mpbv", "sbvf", "spectr", "spectr_gbv"], [1, 3], {}) == {
        "mpbv": "bv", "sbvf": "bv", "spectr": "sd"}
    assert single_draft_reductions(["mpbv", "sbvf", "spectr"], [1, 3], {"mpbv": {"check_inputs": True}},
                                   sampled=["sbvf", "sd"]) == {}
    assert single_draft_reductions(["mpbv"], [3], {}) == {}


def test_shared_rows_are_dropped_between_blocks():
    """Two blocks in turn (the second may reuse the first's memory): each equals its own reference."""
    for prompt in (3, 4):
        block = synthetic_block(prompt, K=2, L=3)
        for e in block_estimates(*block, ["sbv", "mpbv"], [2], [3], 2, torch.Generator().manual_seed(0)):
            assert abs(e.tokens - float(get_verifier(e.method).expected_emitted(*block))) < TOLERANCE


def test_toy_blocks_are_unchanged_by_sharing():
    """A toy vocabulary (sbv's memo path) still gives each rule's own exact value at K = 1 and K = 2."""
    target, draft = toy_pair(vocab_size=3, seed=2)
    tokens = torch.tensor([[0, 1], [2, 1]])
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    for e in block_estimates(tokens, draft_probs, target_probs, ["rbv", "mpbv", "sbv"], [1, 2], [2], 2):
        groups = [slice(0, 1), slice(1, 2)] if e.K == 1 else [slice(0, 2)]
        alone = [float(get_verifier(e.method).expected_emitted(tokens[g], draft_probs[g], target_probs[g]))
                 for g in groups]
        assert abs(e.tokens - sum(alone) / len(alone)) < 1e-9, (e.method, e.K)


def test_control_variate_from_paired_draws_equals_two_separate_samplers_where_the_fallback_matters():
    """On the toy block where sbvf's fallback matters, the replay's sbvf value (one paired run per seed) equals sbv's
    exact value plus the mean of separate sbvf and sbv draws with the same seeds; control: that mean difference is
    far from 0 (the paired term carries weight here)."""
    target, draft = toy_pair(vocab_size=3, seed=1)
    tokens = torch.tensor([[0, 2], [0, 2], [0, 1]])
    block = (tokens, *block_tensors(target, draft, (), tokens))
    draws = 200
    (estimate,) = block_estimates(*block, ["sbvf"], [3], [2], draws, torch.Generator().manual_seed(5))
    seeds = torch.randint(0, 2**62, (draws,), generator=torch.Generator().manual_seed(5)).tolist()
    sbvf, sbv = get_verifier("sbvf"), get_verifier("sbv")
    difference = _mean_accepted(sbvf, block, seeds) - _mean_accepted(sbv, block, seeds)
    assert estimate.estimator == "control_variate"
    assert abs(estimate.tokens - (float(sbv.expected_emitted(*block)) + difference)) < 1e-9
    assert difference > 0.1


def test_rbv_shares_its_sorted_rows_across_row_groups_and_lengths(blocks, monkeypatch):
    """Every rbv query through sorted rows (the V-wide path of long or repeated drafts): the replay's values, whose
    sorts are made once per draft of the block and sliced for the shorter L, equal rbv alone on each sub-block."""
    monkeypatch.setattr(rbv_module, "SORT_ABOVE_QUERIES_PER_ROW", 0)
    tokens, draft_probs, target_probs = blocks[1]
    rbv = get_verifier("rbv", check_inputs=False)
    for e in block_estimates(tokens, draft_probs, target_probs, ["rbv"], [2, 4], L_VALUES, 2):
        groups = [slice(g * e.K, (g + 1) * e.K) for g in range(tokens.shape[0] // e.K)]
        alone = [float(rbv.expected_emitted(tokens[g, :e.L], draft_probs[g, :e.L], target_probs[g, :e.L + 1]))
                 for g in groups]
        assert abs(e.tokens - sum(alone) / len(alone)) < 1e-12, (e.K, e.L)
