"""The predicted fastest lossless configuration: interpolated costs, the per-call formula, the pick (pure)."""

from __future__ import annotations

import pandas as pd
import pytest

from spectr_repro.cost.calibration import ForwardCosts
from spectr_repro.cost.model import CallCosts, seconds_per_call
from spectr_repro.cost.predict import best_configuration, predict_tokens_per_s, read_replay_summary
from spectr_repro.verify import VERIFIERS


def linear_costs(fixed: float, per_token: float, shapes) -> ForwardCosts:
    """Costs of a model whose forward takes fixed + per_token x (rows x tokens) seconds, at ``shapes``."""
    return ForwardCosts(tuple((r, t, k, fixed + per_token * r * t) for r, t, k in shapes))


SHAPES = [(1, 1, "last"), (1, 2, "last"), (1, 64, "last"), (1, 180, "last"), (2, 1, "last"), (4, 1, "last"),
          (1, 5, "all"), (1, 9, "all"), (2, 9, "all"), (4, 9, "all"), (4, 13, "all")]
# A GPU-like machine: a target forward costs mostly its fixed part; the draft is cheap.
T0, T1, D0, D1 = 0.200, 0.0005, 0.005, 0.0001
TARGET = linear_costs(T0, T1, SHAPES)
DRAFT = linear_costs(D0, D1, SHAPES)
COSTLY_DRAFT = linear_costs(0.1, 0.002, SHAPES)  # a draft step about as dear as a target call

# A replay summary as `python -m spectr_repro replay` writes it (the columns its issue promises).
REPLAY = pd.DataFrame([
    # method, K, L, blocks, prompts, tokens_per_call, ci_low, ci_high
    ("sd", 1, 4, 400, 8, 3.0, 2.8, 3.2),
    ("sd", 1, 8, 400, 8, 3.6, 3.3, 3.9),
    ("sbv", 2, 8, 400, 8, 3.5, 3.2, 3.8),  # more tokens a call than sd at L=8, not enough to pay K rows here
    ("sbv", 4, 12, 400, 8, 4.2, 3.9, 4.5),
    ("spectr_gbv", 4, 12, 400, 8, 9.0, 8.5, 9.5),  # not lossless: must never be picked, however fast
], columns=["method", "K", "L", "blocks", "prompts", "tokens_per_call", "ci_low", "ci_high"])


def test_costs_are_exact_at_measured_shapes_and_linear_between():
    assert TARGET.seconds(1, 64) == pytest.approx(T0 + T1 * 64)
    # (1, 100) was not measured: between 64 and 180 tokens the line through them, i.e. the linear model
    assert TARGET.seconds(1, 100) == pytest.approx(T0 + T1 * 100)
    # beyond the largest "last" shape the slope of the last two points continues
    assert TARGET.seconds(1, 300) == pytest.approx(T0 + T1 * 300)
    # scoring every position and feeding with the last position's logits are separate curves
    scored = ForwardCosts(((1, 9, "all", 0.5), (1, 9, "last", 0.2), (1, 1, "last", 0.1)))
    assert scored.seconds(1, 9, "all") == 0.5 and scored.seconds(1, 9) == 0.2
    assert scored.seconds(1, 1, "all") == 0.1  # one token per row: the same call either way


def test_seconds_per_call_counts_every_forward_of_an_iteration():
    K, L = 4, 12
    expected = ((T0 + T1 * K * (L + 1))  # target scores K rows x (L+1)
                # no forward of the last emitted token alone: each of the K rows starts with it
                + (D0 + D1 * 2)  # the draft's 1-2 pending tokens
                + (L - 1) * (D0 + D1 * K)  # L-1 draft steps over K rows
                + 0.003)  # overhead per call
    assert seconds_per_call(TARGET, DRAFT, K, L, overhead_s=0.003) == pytest.approx(expected)
    # K = 1: the same layout over one row
    assert seconds_per_call(TARGET, DRAFT, 1, 4) == pytest.approx((T0 + T1 * 5) + (D0 + D1 * 2) + 3 * (D0 + D1))


def test_predictions_are_lossless_only_sorted_and_inside_their_interval():
    predictions = predict_tokens_per_s(REPLAY, CallCosts(TARGET, DRAFT))
    assert set(predictions["method"]) == {"sd", "sbv"}
    assert all(VERIFIERS[m].lossless for m in predictions["method"])
    assert list(predictions["tokens_per_s"]) == sorted(predictions["tokens_per_s"], reverse=True)
    assert (predictions["tokens_per_s_low"] <= predictions["tokens_per_s"]).all()
    assert (predictions["tokens_per_s"] <= predictions["tokens_per_s_high"]).all()
    row = predictions.set_index(["method", "K", "L"]).loc[("sbv", 2, 8)]
    assert row["tokens_per_s"] == pytest.approx(3.5 / seconds_per_call(TARGET, DRAFT, 2, 8))


def test_the_pick_follows_the_costs_of_this_machine():
    """The same replay, two machines: where drafting is cheap the longer draft wins (sd L=8); where a draft
    step costs about a target call, the short one does (sd L=4): the pick is not fixed by the replay alone
    (negative control). The rule run as published (spectr_gbv) would be the fastest, and is never picked."""
    cheap_draft = best_configuration(predict_tokens_per_s(REPLAY, CallCosts(TARGET, DRAFT)))
    assert (cheap_draft["method"], cheap_draft["K"], cheap_draft["L"]) == ("sd", 1, 8)
    costly_draft = best_configuration(predict_tokens_per_s(REPLAY, CallCosts(TARGET, COSTLY_DRAFT)))
    assert (costly_draft["method"], costly_draft["K"], costly_draft["L"]) == ("sd", 1, 4)
    for best, draft in ((cheap_draft, DRAFT), (costly_draft, COSTLY_DRAFT)):
        assert best["tokens_per_s"] == predict_tokens_per_s(REPLAY, CallCosts(TARGET, draft))["tokens_per_s"].max()
    unfiltered = 9.0 / seconds_per_call(TARGET, DRAFT, 4, 12)  # spectr_gbv's rate, were it a candidate
    assert unfiltered > cheap_draft["tokens_per_s"]


def test_prefill_is_charged_to_the_completion():
    decode_only = predict_tokens_per_s(REPLAY, CallCosts(TARGET, DRAFT))
    with_prompt = predict_tokens_per_s(REPLAY, CallCosts(TARGET, DRAFT), prompt_tokens=180, new_tokens=64)
    merged = decode_only.merge(with_prompt, on=["method", "K", "L"], suffixes=("", "_prompt"))
    assert (merged["tokens_per_s_prompt"] < merged["tokens_per_s"]).all()
    row = merged.set_index(["method", "K", "L"]).loc[("sd", 1, 4)]
    # the last call is cut at 64 tokens: half a block more than 64 / 3.0 calls (renewal theory's lower bound)
    seconds = TARGET.seconds(1, 180) + DRAFT.seconds(1, 180) + (64 / 3.0 + 0.5) * seconds_per_call(TARGET, DRAFT, 1, 4)
    assert row["tokens_per_s_prompt"] == pytest.approx(64 / seconds)
    with pytest.raises(ValueError, match="together"):
        predict_tokens_per_s(REPLAY, CallCosts(TARGET, DRAFT), prompt_tokens=180)


def test_reading_a_replay_summary(tmp_path):
    path = tmp_path / "replay_summary.csv"
    table = pd.concat([REPLAY.assign(temperature=0.4), REPLAY.assign(temperature=0.7, tokens_per_call=1.5)])
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match="several rows per"):
        read_replay_summary(path)
    chosen = read_replay_summary(path, {"temperature": 0.7})
    assert len(chosen) == len(REPLAY) and set(chosen["tokens_per_call"]) == {1.5}
    REPLAY.drop(columns=["ci_low"]).to_csv(path, index=False)
    with pytest.raises(ValueError, match="lacks the column"):
        read_replay_summary(path)
    with pytest.raises(ValueError, match="no lossless configuration"):
        best_configuration(predict_tokens_per_s(REPLAY[REPLAY["method"] == "spectr_gbv"], CallCosts(TARGET, DRAFT)))
