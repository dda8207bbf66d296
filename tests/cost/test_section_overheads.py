"""The per-call overheads of the cost model: fitted per engine section on real decodes, refitted from the decodes'
raw seconds when the model changes, and read from calibrations written before the fit had its terms."""

from __future__ import annotations

import pytest

from spectr_repro.cost.calibration import Calibration, ForwardCosts
from spectr_repro.cost.model import CallCosts, SectionOverheads, section_forward_seconds, section_residual

CORNERS = [(1, 2), (1, 24), (7, 2), (7, 24)]
# A draft that spends 30 ms a drafted position whatever K, a cache copy of 0.1 ms per row per 100 context tokens.
# (fixed, per drafted position, per row, per verified token, per row and context token, per context token)
TRUE = {"draft": (0.004, 0.030, 0.001, 0.0, 1e-6, 0.0), "target": (0.002, 0.0, 0.0, 0.0005, 0.0, 2e-6),
        "verify": (0.0, 0.0, 0.0, 0.0002, 0.0, 0.0), "other": (0.0001, 0.0, 0.0, 0.0, 0.0, 0.0)}


def _truth(section: str, K: int, L: int, context: int) -> float:
    fixed, per_position, per_row, per_token, per_row_context, per_context = TRUE[section]
    return (fixed + per_position * L + per_row * K + per_token * K * (L + 1) + per_row_context * K * context
            + per_context * context)


def _decodes(contexts) -> list[dict]:
    rows = [{"K": K, "L": L, "context": c, **{s: _truth(s, K, L, c) for s in TRUE}}
            for c in contexts for K, L in CORNERS]
    return rows + [{"K": 0, "L": 0, "target": 0.01, "other": 0.0}]


def test_four_corners_at_two_contexts_pin_every_term_and_price_shapes_between_them():
    fitted = SectionOverheads.fit(_decodes([200, 600]))
    for section in TRUE:
        for K, L in [(3, 6), (3, 12), (1, 16), (7, 8)]:
            for c in (200, 400, 600):
                assert fitted.seconds(section, K, L, c) == pytest.approx(_truth(section, K, L, c), abs=1e-9)
    assert fitted.ar == {"target": 0.01, "other": 0.0}


def test_a_line_in_the_verified_tokens_alone_misses_a_cost_per_drafted_position():
    """Negative control: the fit before 2026-12-03 (fixed + per_token x K(L+1)) through the same corners."""
    import numpy as np

    decodes = [r for r in _decodes([200]) if r["K"]]
    sizes = np.array([r["K"] * (r["L"] + 1) for r in decodes], dtype=float)
    per_token, fixed = np.polyfit(sizes, [r["draft"] for r in decodes], 1)
    old = SectionOverheads({"draft": (fixed, 0.0, 0.0, per_token)}, {})
    new = SectionOverheads.fit(_decodes([200]))
    truth = _truth("draft", 3, 6, 200)
    assert abs(old.seconds("draft", 3, 6, 200) - truth) > 0.1 * truth  # K=3 L=6 missed by more than 10 %
    assert new.seconds("draft", 3, 6, 200) == pytest.approx(truth, abs=1e-9)


def test_one_context_leaves_the_context_terms_out_rather_than_extrapolating_them():
    fitted = SectionOverheads.fit(_decodes([200]))
    assert all(coefficients[4:] == (0.0, 0.0) for coefficients in fitted.fits.values())
    assert fitted.context == 200
    assert fitted.seconds("target", 3, 6) == fitted.seconds("target", 3, 6, 200)


def test_a_calibration_of_before_is_read_and_one_with_raw_decodes_is_refitted():
    old = SectionOverheads.from_json({"fits": {"draft": [0.1, 0.002]}, "ar": {"target": 0.01}})
    assert old.seconds("draft", 3, 6) == pytest.approx(0.1 + 0.002 * 21)  # (fixed, per verified token)
    assert SectionOverheads.from_json(old.to_json()) == old

    target = ForwardCosts(((1, 1, "last", 0.3), (3, 7, "all", 0.45), (7, 7, "all", 0.75)))
    draft = ForwardCosts(((1, 1, "last", 0.1), (1, 2, "last", 0.12), (3, 1, "last", 0.12)))
    measured = {"draft": 1.0, "target": 0.5, "verify": 0.01, "other": 0.001}
    decode = {"K": 3, "L": 6, "calls": 5, "rule": "spectr", "context": None, "measured": measured,
              # residuals under some older model: ignored when the raw seconds are there
              "draft": 9.0, "target": 9.0, "verify": 9.0, "other": 9.0}
    calibration = Calibration(hardware="cpu", model_pair="tiny_random", dtype="float32", device="x", date="d",
                              random_weights=True, target=target, draft=draft,
                              extra={"section_residuals": [decode], "rule_seconds": {"spectr/3/6": 0.004},
                                     "section_overheads": {"fits": {"draft": [9.0, 9.0]}, "ar": {}}})
    costs = CallCosts.from_calibration(calibration)
    forwards = section_forward_seconds(target, draft, 3, 6)
    expected = section_residual(measured, target, draft, {("spectr", 3, 6): 0.004}, "spectr", 3, 6, None)
    assert expected["target"] == pytest.approx(0.5 - forwards["target"])
    for section, value in expected.items():
        assert costs.overheads.seconds(section, 3, 6) == pytest.approx(value)
    # the call is then the decode's measured seconds, forwards and rule included
    assert costs.call_seconds("spectr", 3, 6) == pytest.approx(sum(measured.values()))


def test_ars_residual_follows_the_context_when_ar_was_decoded_at_two():
    rows = [{"K": 0, "L": 0, "context": 100, "target": -0.03, "other": 0.001},
            {"K": 0, "L": 0, "context": 500, "target": 0.01, "other": 0.001}]
    fitted = SectionOverheads.fit(_decodes([100, 500])[:-1] + rows)
    assert fitted.ar["target_per_context"] == pytest.approx(1e-4)
    target = ForwardCosts(((1, 1, "last", 0.2),))
    costs = CallCosts(target, target, {}, fitted)
    assert costs.ar_token_seconds(300) == pytest.approx(0.2 - 0.01 + 0.001)
    one = SectionOverheads.fit(_decodes([100])[:-1] + rows[:1])  # one context: the mean, no slope
    assert one.ar == {"target": -0.03, "other": 0.001}


def test_a_calibration_is_fitted_once_however_often_it_is_loaded(tmp_path, monkeypatch):
    """plan, report and bench read the calibration file again for each group, section or contender (a new object
    each time): the refit runs once per calibration content. Negative control: a calibration with other measured
    seconds is fitted anew, and its overheads differ."""
    from spectr_repro.cost import model
    from spectr_repro.cost.calibration import find_calibration, write_calibration

    fits = []
    original = SectionOverheads.fit
    monkeypatch.setattr(SectionOverheads, "fit", classmethod(lambda cls, rows: fits.append(1) or original(rows)))
    monkeypatch.setattr(model, "_OVERHEAD_FITS", {})
    target = ForwardCosts(((1, 1, "last", 0.3), (3, 7, "all", 0.45)))
    draft = ForwardCosts(((1, 1, "last", 0.1), (3, 1, "last", 0.12)))

    def calibration(draft_seconds: float) -> Calibration:
        decode = {"K": 3, "L": 6, "rule": "sbv", "context": None,
                  "measured": {"draft": draft_seconds, "target": 0.5, "verify": 0.01, "other": 0.001}}
        return Calibration(hardware="cpu", model_pair="tiny_random", dtype="float32", device="x", date="d",
                           random_weights=True, target=target, draft=draft,
                           extra={"section_residuals": [decode], "rule_seconds": {"sbv/3/6": 0.004}})

    path = write_calibration(calibration(1.0), tmp_path / "calibration.json")
    loads = [find_calibration("cpu", "tiny_random", "float32", path) for _ in range(5)]
    assert len({id(loaded) for loaded in loads}) == 5  # five objects, as five readers get them
    costs = [CallCosts.from_calibration(loaded) for loaded in loads]
    assert len(fits) == 1
    assert all(c.overheads == costs[0].overheads for c in costs)
    assert costs[0].call_seconds("sbv", 3, 6) == pytest.approx(1.0 + 0.5 + 0.01 + 0.001)  # the decode, measured
    other = CallCosts.from_calibration(calibration(2.0))
    assert len(fits) == 2 and other.overheads != costs[0].overheads


def _batch_decodes(batches, per_call: dict[str, float], ar_call: float, ar_prompt: float) -> list[dict]:
    """The corners decoded at each batch size B, one context: each section's residual per call is ``per_call`` once
    plus TRUE's shape-dependent cost per prompt; AR's step is ``ar_call`` + B x ``ar_prompt``."""
    rows = [{"K": K, "L": L, "context": 300, "batch": B,
             **{s: per_call[s] + B * _truth(s, K, L, 300) for s in TRUE}} for B in batches for K, L in CORNERS]
    return rows + [{"K": 0, "L": 0, "context": 300, "batch": B, "target": ar_call + B * ar_prompt, "other": 0.0}
                   for B in batches]


def test_decodes_at_two_batch_sizes_tell_what_a_call_pays_once_from_what_it_pays_per_prompt():
    """The mask and bookkeeping a batched call pays once must not be charged B times: from decodes at B = 1 and 8
    the fit prices B = 4 exactly (per call + 4 x per prompt) and a batch-1 call as before (their sum). Negative
    control: from B = 1 alone everything is per prompt, and B = 4 is over-priced by 3 x the per-call part."""
    once = {"draft": 0.05, "target": 0.08, "verify": 0.0, "other": 0.01}
    both = SectionOverheads.fit(_batch_decodes([1, 8], once, ar_call=0.07, ar_prompt=0.01))
    for K, L in [(3, 6), (5, 12)]:
        for section in TRUE:
            at_four = once[section] + 4 * _truth(section, K, L, 300)
            assert both.batch_seconds(section, K, L, 300, batch=4) == pytest.approx(at_four, abs=1e-9)
            assert both.seconds(section, K, L, 300) == pytest.approx(once[section] + _truth(section, K, L, 300),
                                                                     abs=1e-9)
    assert both.ar_step_seconds(4) == pytest.approx(0.07 + 4 * 0.01)
    assert both.ar["target"] == pytest.approx(0.08)  # AR's batch-1 token, as ar_token_seconds reads it
    assert SectionOverheads.from_json(both.to_json()) == both

    alone = SectionOverheads.fit(_batch_decodes([1], once, ar_call=0.07, ar_prompt=0.01))
    assert alone.per_call == {} and alone.ar_step_seconds(4) is None
    over = alone.batch_seconds("target", 3, 6, 300, batch=4) - both.batch_seconds("target", 3, 6, 300, batch=4)
    assert over == pytest.approx(3 * once["target"], abs=1e-9)
