"""A block's support (replay/support.py): the rules judged on the tokens that carry the block's mass give the values
they give on the whole vocabulary.

The blocks are float64 and peaked like a real pair's at T = 0.4 (rows of one context sharing logits with a standard
deviation of 10, divided by 0.4: most of the 4,000 tokens lie far below 1e-12), so the only difference between the two
computations is the pooling itself, not float32 rounding. Pooling at most ``tail_mass`` of a row moves every mass a
rule computes (sum_x (w p - c q)+, min(p, q), ...) by at most that, and a value (tokens per call, 1 .. L + 1) sums
such terms over at most K (L + 1) stops: the check allows 1e-6 with tail_mass = 1e-9 (K = 3, L = 4 give a bound of
~2e-8; the margin absorbs the rules' own float64 rounding). Negative control: pooling 5 % of a row moves some value by
more than 1e-4.
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.replay import block_estimates
from spectr_repro.replay.driver import main
from spectr_repro.replay.support import compact_block
from spectr_repro.verify import VERIFIERS

V, K, L = 4000, 3, 4


def peaked_block(seed: int, dtype=torch.float64):
    """(draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L + 1, V]): drafts drawn from q."""
    generator = torch.Generator().manual_seed(seed)
    # One context's rows share most of their shape (a real block's rows are neighbouring positions of one text).
    shared = 10 * torch.randn(V, generator=generator, dtype=dtype)
    target_logits = shared + 2 * torch.randn(K, L + 1, V, generator=generator, dtype=dtype)
    draft_logits = target_logits[:, :L] + 1.0 * torch.randn(K, L, V, generator=generator, dtype=dtype)
    target_probs, draft_probs = (torch.softmax(x / 0.4, -1) for x in (target_logits, draft_logits))
    tokens = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=generator).view(K, L)
    return tokens, draft_probs, target_probs


def test_the_support_keeps_each_rows_mass_and_the_drafted_tokens():
    tokens, q, p = peaked_block(0)
    small_tokens, small_q, small_p, support = compact_block(tokens, q, p, tail_mass=1e-9)
    assert support.vocabulary == V and support.kept < V // 10  # the point: far fewer tokens
    assert small_q.shape == (K, L, support.kept + 1) and small_p.shape == (K, L + 1, support.kept + 1)
    torch.testing.assert_close(small_q.sum(-1), q.sum(-1), atol=1e-13, rtol=0)  # the tail token holds what left
    torch.testing.assert_close(small_p.sum(-1), p.sum(-1), atol=1e-13, rtol=0)
    assert small_p[..., -1].max() <= support.dropped_mass <= 1e-9 and small_q[..., -1].max() <= 1e-9
    drawn, small_drawn = tokens.unsqueeze(-1), small_tokens.unsqueeze(-1)
    assert torch.equal(small_q.gather(-1, small_drawn), q.gather(-1, drawn))  # the same token, by name
    assert torch.equal(small_p[:, :L].gather(-1, small_drawn), p[:, :L].gather(-1, drawn))


def test_a_drafted_token_far_below_the_threshold_is_kept_by_name():
    tokens, q, p = peaked_block(4)
    rare = int(torch.maximum(q.amax((0, 1)), p.amax((0, 1))).argmin())  # no row gives it more than ~1e-100
    tokens = tokens.clone()
    tokens[1, 2] = rare
    small_tokens, small_q, small_p, _ = compact_block(tokens, q, p, tail_mass=1e-9)
    assert small_q[1, 2, small_tokens[1, 2]] == q[1, 2, rare] and small_p[1, 2, small_tokens[1, 2]] == p[1, 2, rare]
    assert small_tokens[1, 2] != small_q.shape[-1] - 1  # not the tail token


def test_the_threshold_is_the_largest_power_of_ten_that_keeps_every_row_within_the_tail_mass():
    tokens, q, p = peaked_block(1)
    support = compact_block(tokens, q, p, tail_mass=1e-9)[3]
    largest = torch.maximum(q.amax((0, 1)), p.amax((0, 1)))
    rows = torch.cat([q.reshape(-1, V), p.reshape(-1, V)])

    def dropped(threshold: float) -> float:  # brute force, without the drafted tokens kept by name
        return float((rows * (largest <= threshold)).sum(-1).max())

    assert dropped(support.threshold) <= 1e-9 < dropped(10 * support.threshold)


def test_a_block_with_nothing_worth_pooling_is_returned_as_it_is():
    tokens, q, p = peaked_block(2)
    flat_q, flat_p = torch.full_like(q, 1 / V), torch.full_like(p, 1 / V)  # every token 2.5e-4: no tail at all
    out = compact_block(tokens, flat_q, flat_p, tail_mass=1e-9)
    assert out[0] is tokens and out[1] is flat_q and out[2] is flat_p and out[3].kept == V


@pytest.mark.parametrize("bad", [0.0, -1e-9, float("nan")])
def test_a_tail_mass_that_is_not_positive_is_refused(bad):
    tokens, q, p = peaked_block(3)
    with pytest.raises(ValueError, match="tail_mass must be > 0"):
        compact_block(tokens, q, p, tail_mass=bad)


def values(seed: int, support_mass):
    tokens, q, p = peaked_block(seed)
    estimates = block_estimates(tokens, q, p, list(VERIFIERS), [1, 3], [2, 4], draws=4,
                                generator=torch.Generator().manual_seed(seed), support_mass=support_mass)
    return {(e.method, e.K, e.L): (e.tokens, e.estimator) for e in estimates}


@pytest.mark.parametrize("seed", [10, 11])
def test_every_rules_value_on_the_support_is_its_value_on_the_whole_vocabulary(seed):
    whole, support = values(seed, None), values(seed, 1e-9)
    assert whole.keys() == support.keys()
    compared = 0
    for cell, (value, estimator) in whole.items():
        assert support[cell][1] == estimator
        if estimator in ("exact", "control_variate"):  # Monte-Carlo draws see the same law in another stream
            assert abs(support[cell][0] - value) <= 1e-6, cell
            compared += 1
    assert compared >= 25  # every rule of the registry has a closed form or a control variate here


def test_pooling_five_percent_of_a_row_moves_the_values_negative_control():
    whole, pooled = values(10, None), values(10, 0.05)
    moved = max(abs(pooled[cell][0] - value) for cell, (value, estimator) in whole.items() if estimator == "exact")
    assert moved > 1e-4


@pytest.mark.parametrize("value", ["0", "1", "-1e-9", "a", "true"])
def test_a_bad_support_mass_is_one_message_and_exit_2_before_loading(tmp_path, capsys, value):
    argv = ["model_pair=tiny_random", "dataset=humaneval", "logger=disabled", "method=sd", "K=1", "L=2",
            "replay.reference_K=1", "replay.reference_L=2", "num_prompts=1", f"replay.support_mass={value}",
            f"output_dir={tmp_path / 'out'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "replay.support_mass must be a number in (0, 1)" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
