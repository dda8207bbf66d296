"""Speed-up against batch size (issue 50): the cost model's price of a batch, the paired summary, and a run of the
timed groups on the tiny random pair."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from spectr_repro.bench import cli, tables
from spectr_repro.bench import preset as preset_module
from spectr_repro.bench.batches import interval, summarise
from spectr_repro.cost.batch_speedup import batch_decode_seconds
from spectr_repro.cost.calibration import ForwardCosts
from spectr_repro.cost.model import CallCosts, section_forward_seconds
from spectr_repro.errors import UsageError


def linear_costs(fixed: float, per_token: float) -> ForwardCosts:
    """A forward costs fixed + per_token x rows x tokens (two measured sizes: interpolation is exact)."""
    return ForwardCosts(tuple((1, n, kind, fixed + per_token * n) for n in (1, 1000) for kind in ("last", "all")))


COSTS = CallCosts(linear_costs(0.1, 0.001), linear_costs(0.02, 0.0005), {("sd", 1, 4): 0.003})


def test_ar_batch_is_its_prefills_and_one_forward_over_the_batch_per_token():
    seconds = batch_decode_seconds(COSTS, "ar", 1, 1, [100, 300], [8, 8], new_tokens=8)
    prefill = (0.1 + 0.001 * 100) + (0.1 + 0.001 * 300)
    assert seconds == pytest.approx(prefill + 8 * (0.1 + 0.001 * 2))


def test_a_speculative_batch_prices_each_call_at_the_prompts_still_running():
    """Calls per prompt [3, 1]: call 1 at two prompts, calls 2 and 3 at one; the rule once per prompt a call."""
    seconds = batch_decode_seconds(COSTS, "sd", 1, 4, [100, 100], [3, 1], new_tokens=8)
    prefill = 2 * ((0.1 + 0.001 * 100) + (0.02 + 0.0005 * 100))
    def call(active):
        return sum(section_forward_seconds(COSTS.target, COSTS.draft, 1, 4, None, active).values()) + active * 0.003
    assert seconds == pytest.approx(prefill + call(2) + 2 * call(1))
    # the same calls made by prompts one after the other would cost more forwards: the batch shares weight reads
    alone = sum(batch_decode_seconds(COSTS, "sd", 1, 4, [100], [c], new_tokens=8) for c in (3, 1))
    assert seconds < alone


def test_a_batch_is_priced_on_its_longest_prompt_the_width_every_row_reads():
    """The engine left-pads every row to the longest prompt: a batch of a 100- and a 700-token prompt reads a
    ~700-token cache on every row. Forwards measured at two widths, 10x dearer on the wider: the batch costs what
    two rows on the wide cache cost, not what two on the mean width (400) would."""
    def at_widths(cheap: float, dear: float) -> ForwardCosts:
        points = tuple((rows, n, kind, cost * rows * n) for cost in (cheap, dear) for rows in (1, 2)
                       for n in (1, 2, 5) for kind in ("last", "all"))
        return ForwardCosts(points, tuple(w for w in (100, 704) for _ in range(12)))

    costs = CallCosts(at_widths(0.001, 0.01), at_widths(0.0005, 0.005), {("sd", 1, 4): 0.0})
    mixed = batch_decode_seconds(costs, "sd", 1, 4, [100, 700], [2, 2], new_tokens=8, prefill=False)
    wide = batch_decode_seconds(costs, "sd", 1, 4, [700, 700], [2, 2], new_tokens=8, prefill=False)
    narrow = batch_decode_seconds(costs, "sd", 1, 4, [400, 400], [2, 2], new_tokens=8, prefill=False)
    assert mixed == pytest.approx(wide)
    assert mixed > 1.5 * narrow  # the mean width's price, which the model used before 2026-12-07


def test_section_residuals_of_a_batch_of_one_are_measured_on_generate_batch(monkeypatch):
    """A batch bench's overheads come from the path it times, with its own accounting: the first block scored in
    the target section (per call over every call) and the draft's first pending feed put back."""
    import torch

    from spectr_repro.cost import measure

    seen = []

    class Out:
        def __init__(self, calls):
            self.outputs = [type("O", (), {"target_calls": calls})()]
            self.target_calls = calls
            self.stats = {"time_s": {"draft": 1.0, "target": 2.0, "verify": 0.5, "prefill": 3.0, "total": 7.0}}

    def fake_batch(*args, **kwargs):
        seen.append("batch")
        return Out(4)

    def fake_alone(*args, **kwargs):
        seen.append("alone")
        return Out(4)

    monkeypatch.setattr(measure, "generate_batch", fake_batch)
    monkeypatch.setattr(measure, "generate", fake_alone)
    forward = ForwardCosts(tuple((r, n, k, 0.0) for r in (1, 2) for n in (1, 2, 5) for k in ("last", "all")))
    draft = ForwardCosts(tuple((r, n, k, 0.1 if (r, n) == (1, 2) else 0.0) for r in (1, 2) for n in (1, 2, 5)
                               for k in ("last", "all")))
    prompt = torch.arange(10)
    batched = measure.measure_section_residuals(None, None, prompt, [(1, 4)], forward, draft, {}, 0.4,
                                                batched=True, ar=False)[0]
    alone = measure.measure_section_residuals(None, None, prompt, [(1, 4)], forward, draft, {}, 0.4, ar=False)[0]
    assert seen == ["batch", "alone"]
    assert batched["measured"]["target"] == pytest.approx(2.0 / 4)  # every call's block scored in "target"
    assert alone["measured"]["target"] == pytest.approx(2.0 / 3)  # the first in the prefill
    assert batched["measured"]["draft"] == pytest.approx((1.0 + 0.1) / 4)
    assert alone["measured"]["draft"] == pytest.approx(1.0 / 4)


def group(method, seconds, tokens=16, B=2, g=0, K=1, L=4, calls=(4, 4), prefill_s=0.5):
    return {"B": B, "group": g, "datasets": ["humaneval"] * B, "method": method, "K": K, "L": L,
            "prompt_tokens": [100] * B, "seconds": seconds, "prefill_s": prefill_s, "tokens": tokens,
            "calls": list(calls)}


def test_summary_pairs_each_group_with_ar_at_the_same_batch():
    rows = [group("ar", 4.0, calls=(8, 8)), group("sd", 2.0), group("ar", 6.0, g=1, calls=(8, 8)),
            group("sd", 2.0, g=1)]
    (cell,) = summarise(rows, COSTS, new_tokens=8)
    assert (cell["method"], cell["B"], cell["groups"]) == ("sd", 2, 2)
    assert cell["speedup"] == pytest.approx(2.5)  # mean of 2 and 3, not 10 / 4
    assert cell["speedup_low"] < 2.5 < cell["speedup_high"]
    assert cell["tokens_per_call"] == pytest.approx(2.0)
    expected = (batch_decode_seconds(COSTS, "ar", 1, 1, [100, 100], [8, 8], 8)
                / batch_decode_seconds(COSTS, "sd", 1, 4, [100, 100], [4, 4], 8))
    assert cell["predicted"] == pytest.approx(expected)
    assert cell["error"] == pytest.approx(expected / 2.5 - 1)
    assert cell["decode_speedup"] == pytest.approx((3.5 / 1.5 + 5.5 / 1.5) / 2)  # each decode after its prefill
    decode = (batch_decode_seconds(COSTS, "ar", 1, 1, [100, 100], [8, 8], 8, prefill=False)
              / batch_decode_seconds(COSTS, "sd", 1, 4, [100, 100], [4, 4], 8, prefill=False))
    assert cell["decode_predicted"] == pytest.approx(decode) and decode > expected  # the prefill is shared work


def test_summary_refuses_decodes_of_different_lengths():
    with pytest.raises(ValueError, match="not comparable"):
        summarise([group("ar", 4.0, calls=(8, 8)), group("sd", 2.0, tokens=15)], COSTS, new_tokens=8)


def test_interval_is_a_t_interval():
    mean, low, high = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)
    assert math.isnan(interval([1.0])[1])


def test_the_batch_bench_runs_on_the_tiny_pair(tmp_path, monkeypatch):
    """End to end through the command: the tiny preset cut to a pool of 2 prompts (one per dataset), B = 1, 2."""

    monkeypatch.chdir(tmp_path)
    preset, hardware = preset_module.compose_preset("batch_tiny", "cpu")
    preset.batches.prompts_per_dataset, preset.max_new_tokens = 1, 4
    preset.batches.contenders = [["sd", 1, 2], ["spectr", 2, 2]]
    results = preset_module.run(preset, hardware, "cpu", None)
    cells = results["batches"]["cells"]
    assert {(c["method"], c["B"], c["groups"]) for c in cells} == {("sd", 1, 2), ("sd", 2, 1), ("spectr", 1, 2),
                                                                   ("spectr", 2, 1)}
    assert all(c["speedup"] > 0 and c["predicted"] > 0 and c["tokens_per_call"] >= 1 for c in cells)
    groups = results["batches"]["groups"]
    assert len(groups) == 3 * (2 + 1) and {len(g["calls"]) for g in groups} == {1, 2}
    assert {tuple(g["datasets"]) for g in groups if g["B"] == 2} == {("humaneval", "gsm8k")}
    assert "| spectr | 2 | 2 | 2 |" in tables.markdown(results)
    # the calibration decoded at B = 1 and 2: its overheads are split into per call and per prompt, and kept
    overheads = results["batches"]["costs"]["overheads"]
    assert set(overheads["per_call"]) == {"draft", "target", "verify", "other"} and "per_prompt" in overheads["ar"]
    # the preset times each group's forwards again just before it, on the group's width: kept on its AR row
    for row in groups:
        if row["method"] == "ar":
            widths = {p["context"] for role in ("target", "draft") for p in row["forwards"][role]}
            assert widths == {max(row["prompt_tokens"]) + 4 // 2}
            assert any(p["rows"] == 2 * row["B"] for p in row["forwards"]["target"])  # spectr's K = 2 rows
        else:
            assert "forwards" not in row
    assert all("calibration_predicted" in c for c in cells)
    assert "From the calibration alone" in tables.markdown(results)
    # each decode's seconds by engine section, kept: a miss can be traced to a section from the file
    for row in groups:
        sections = row["sections_s"]
        assert {"prefill", "draft", "target", "verify", "total"} <= set(sections)
        assert sections["prefill"] == row["prefill_s"] and sections["total"] <= row["seconds"]
        assert sum(v for k, v in sections.items() if k != "total") <= sections["total"]
        assert (sections["draft"] > 0) == (row["method"] != "ar")
    # where the error is, kept with the run: per B for AR and the rules, and the forwards' drift since the calibration
    found = results["batches"]["seconds_against_prediction"]
    assert set(found["ar"]) == set(found["rules"]) == {1, 2} and all(v > 0 for v in found["rules"].values())
    assert found["target_drift"][1] > 0
    assert "Measured over predicted seconds after the prefill" in tables.markdown(results)


def test_a_batch_that_does_not_fit_is_refused_before_any_model_loads(tmp_path, monkeypatch, capsys):
    """The Qwen preset's B = 8 on a machine with 5.55 GiB free (bf16: ~4.5 GiB at B = 1, ~4.85 at B = 8, 85 % usable):
    exit 2, the largest B that fits named, nothing written."""
    from spectr_repro.launch import fit

    monkeypatch.setattr(fit, "free_bytes", lambda device=None: int(5.55 * 2**30))
    monkeypatch.setattr(preset_module, "run", lambda *a, **k: pytest.fail("a model was about to load"))
    out = tmp_path / "bench_batch.json"
    assert cli.main(["--preset", "batch_qwen", "--device", "cpu", "--out", str(out), "--logger", "disabled"]) == 2
    message = capsys.readouterr().err
    assert "bench.batches.B (preset batch_qwen)=8 does not fit" in message
    largest = re.search(r"the largest that fits is bench.batches.B \(preset batch_qwen\)=(\d+)", message)
    assert largest and 1 < int(largest.group(1)) < 8
    assert not out.exists()
    monkeypatch.setattr(fit, "free_bytes", lambda device=None: 64 * 2**30)  # the same preset fits with 64 GiB free
    assert preset_module.compose_preset("batch_qwen", "cpu")[0].batches.B == [1, 2, 4, 8]


def test_call_costs_survive_json():
    """The checkpoint keeps the calibration as JSON: every price the summary uses is the same after the trip."""
    from spectr_repro.cost.model import SectionOverheads

    overheads = SectionOverheads({"other": (0.01, 0.002, 0.003, 0.0001, 0.0, 0.0)}, {"target": 0.004}, 100)
    costs = CallCosts(COSTS.target, COSTS.draft, {("sd", 1, 4): 0.003, ("spectr", 3, 6): 0.02}, overheads, "here")
    back = CallCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert back.rule_seconds == costs.rule_seconds and back.source == "here"
    for rule, K, L in (("sd", 1, 4), ("spectr", 3, 6), ("spectr", 3, 9)):
        assert back.call_seconds(rule, K, L, 200) == costs.call_seconds(rule, K, L, 200)
    assert back.ar_token_seconds(300) == costs.ar_token_seconds(300)
    assert batch_decode_seconds(back, "spectr", 3, 6, [20, 30], [5, 6], 12) == \
        batch_decode_seconds(COSTS.__class__(**{**costs.__dict__}), "spectr", 3, 6, [20, 30], [5, 6], 12)


def test_an_interrupted_batch_bench_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """Killed after its calibration and one finished group, the same command resumes: no new calibration, the kept
    group not decoded again, every group in the result once. A checkpoint of other settings is set aside."""
    from spectr_repro.bench import batches

    monkeypatch.chdir(tmp_path)
    preset, hardware = preset_module.compose_preset("batch_tiny", "cpu")
    preset.batches.prompts_per_dataset, preset.max_new_tokens = 1, 4
    preset.batches.contenders = [["sd", 1, 2]]
    checkpoint = tmp_path / "bench.partial.json"
    decode, decoded, interrupt = batches.decode_group, [], [True]

    def interrupted_after_one_group(pair, prompts, contender, temperature, new_tokens, seed, chunk=None):
        if seed != 10**6:  # not a warm-up
            decoded.append((len(prompts), seed, contender))
            # the second group's first decode: the first group is finished
            if len(decoded) == 3 and interrupt and interrupt.pop():
                raise KeyboardInterrupt
        return decode(pair, prompts, contender, temperature, new_tokens, seed, chunk)

    monkeypatch.setattr(batches, "decode_group", interrupted_after_one_group)
    with pytest.raises(KeyboardInterrupt):
        preset_module.run(preset, hardware, "cpu", None, checkpoint=checkpoint)
    kept = json.loads(checkpoint.read_text())
    assert kept["costs"] is not None and len(kept["rows"]) == 2  # one group: AR and SD

    decoded.clear()
    monkeypatch.setattr(batches, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
    results = preset_module.run(preset, hardware, "cpu", None, checkpoint=checkpoint)["batches"]
    assert len(decoded) == 4  # the two groups not kept (B = 1's second, B = 2's one), AR and SD each
    groups = results["groups"]
    assert sorted((g["B"], g["group"], g["method"]) for g in groups) == \
        [(1, 0, "ar"), (1, 0, "sd"), (1, 1, "ar"), (1, 1, "sd"), (2, 0, "ar"), (2, 0, "sd")]
    assert groups[:2] == kept["rows"]  # the kept group, as it was timed

    preset.max_new_tokens = 5  # another measurement: its checkpoint is not resumed
    assert "max_new_tokens" in batches.BatchCheckpoint(checkpoint, {**kept["identity"], "max_new_tokens": 5}).note
    assert not checkpoint.exists() and len(list(tmp_path.glob("bench.partial.set-aside-*.json"))) == 1
    # a second mismatch sets its own file aside beside the first, overwriting nothing
    checkpoint.write_text(json.dumps(kept))
    assert "max_new_tokens" in batches.BatchCheckpoint(checkpoint, {**kept["identity"], "max_new_tokens": 6}).note
    assert len(list(tmp_path.glob("bench.partial.set-aside-*.json"))) == 2


def test_a_split_overhead_is_charged_once_per_call_and_per_prompt_in_a_batch():
    """With overheads fitted at two batch sizes, AR's step over B prompts costs its forward + per call + B x per
    prompt, and a speculative call its forwards + the rule and per-prompt part per running prompt + the per-call part
    once."""
    from spectr_repro.cost.model import SECTIONS, SectionOverheads

    zero = (0.0,) * 6
    overheads = SectionOverheads({s: ((0.002,) + zero[1:]) if s == "target" else zero for s in SECTIONS},
                                 {"target": 0.0, "other": 0.0, "per_call": 0.05, "per_prompt": 0.01}, 100,
                                 {s: ((0.03,) + zero[1:]) if s == "draft" else zero for s in SECTIONS})
    costs = CallCosts(COSTS.target, COSTS.draft, {("sd", 1, 4): 0.003}, overheads)
    ar = batch_decode_seconds(costs, "ar", 1, 1, [100] * 4, [8] * 4, new_tokens=8, prefill=False)
    assert ar == pytest.approx(8 * ((0.1 + 0.001 * 4) + 0.05 + 4 * 0.01))
    sd = batch_decode_seconds(costs, "sd", 1, 4, [100, 100], [3, 1], new_tokens=8, prefill=False)

    def call(active):
        forwards = sum(section_forward_seconds(COSTS.target, COSTS.draft, 1, 4, None, active).values())
        return forwards + active * (0.003 + 0.002) + 0.03
    assert sd == pytest.approx(call(2) + 2 * call(1))


def test_the_group_plan_gives_large_batches_their_own_count_of_groups():
    """A pool of 16: by default every whole group (16 at B = 1); with ``groups`` the small B take the pool's start
    and B = 8 two groups, the only way a one-hour run gives B = 8 an interval."""
    from spectr_repro.bench.batches import group_plan

    assert group_plan(16, [1, 8]) == [(1, g) for g in range(16)] + [(8, 0), (8, 1)]
    assert group_plan(16, [1, 2, 8], {1: 8, 2: 4, 8: 2}) == ([(1, g) for g in range(8)] + [(2, g) for g in range(4)]
                                                               + [(8, 0), (8, 1)])
    with pytest.raises(ValueError, match="3 group.* of 8 need 24 prompts; the pool has 16"):
        group_plan(16, [8], {8: 3})
    with pytest.raises(ValueError, match="groups are asked at B = 16, which is not among B = 1, 8"):
        group_plan(16, [1, 8], {16: 1})


def test_groups_the_pool_cannot_hold_are_refused_at_the_door():
    """``bench.batches.groups`` is checked when the preset composes, before any model loads: a pool of 2 × 8 cannot
    give B = 8 three groups, and a B the preset does not time is named. The shipped presets pass (negative control)."""
    from omegaconf import OmegaConf

    spec = {"B": [1, 8], "prompts_per_dataset": 8, "datasets": ["humaneval", "gsm8k"]}
    preset_module.check_groups(OmegaConf.create(spec | {"groups": {1: 8, 8: 2}}), "ok")
    with pytest.raises(UsageError, match=r"bench.batches.groups \(preset bad\): 3 group\(s\) of 8 need 24 prompts"):
        preset_module.check_groups(OmegaConf.create(spec | {"groups": {8: 3}}), "bad")
    with pytest.raises(UsageError, match="not among B = 1, 8"):
        preset_module.check_groups(OmegaConf.create(spec | {"groups": {4: 1}}), "bad")
    for name in ("batch_tiny", "batch_qwen", "batch_qwen_short"):
        batches = OmegaConf.load(Path(preset_module.__file__).parents[1] / "conf" / "bench" / f"{name}.yaml").batches
        preset_module.check_groups(batches, name)


def test_a_group_whose_forwards_were_timed_again_is_priced_from_them_and_from_the_calibration():
    """The AR row of a group carries the forwards timed just before it: ``predicted`` prices the group from them,
    ``calibration_predicted`` from the calibration alone. Negative control: a group without them has no
    calibration_ fields, and its prediction is the calibration's."""
    fast_draft = linear_costs(0.002, 0.0001)  # the draft 10x cheaper now than when calibrated
    forwards = {"target": COSTS.target.to_json(), "draft": fast_draft.to_json()}

    def rows(with_forwards: bool):
        ar = {"B": 2, "group": 0, "method": "ar", "K": 1, "L": 1, "prompt_tokens": [50, 60], "seconds": 4.0,
              "prefill_s": 1.0, "tokens": 16, "calls": [8, 8]}
        if with_forwards:
            ar["forwards"] = forwards
        sd = {"B": 2, "group": 0, "method": "sd", "K": 1, "L": 4, "prompt_tokens": [50, 60], "seconds": 3.0,
              "prefill_s": 1.2, "tokens": 16, "calls": [3, 4]}
        return [ar, sd]

    def speedup(costs):
        return (batch_decode_seconds(costs, "ar", 1, 1, [50, 60], [8, 8], 8)
                / batch_decode_seconds(costs, "sd", 1, 4, [50, 60], [3, 4], 8))

    [retimed] = summarise(rows(True), COSTS, 8)
    now = CallCosts(COSTS.target, fast_draft, COSTS.rule_seconds)
    assert retimed["predicted"] == pytest.approx(speedup(now))
    assert retimed["calibration_predicted"] == pytest.approx(speedup(COSTS))
    assert retimed["predicted"] > 1.05 * retimed["calibration_predicted"]  # a cheaper draft: a larger speed-up
    assert retimed["calibration_error"] == pytest.approx(retimed["calibration_predicted"] / retimed["speedup"] - 1)
    [static] = summarise(rows(False), COSTS, 8)
    assert "calibration_predicted" not in static and static["predicted"] == pytest.approx(speedup(COSTS))
