"""The benchmark's accounting on the tiny pair: forward counting, side-by-side rounds, the best-of choice,
that neither AR loop spends a forward on the prompt alone (transformers' generate does not; ours must not),
and that the presets compose through the config composer."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.bench import preset as preset_module
from spectr_repro.bench import suites, tables
from spectr_repro.bench.contenders import hf_generation_config
from spectr_repro.bench.measure import ForwardMeter
from spectr_repro.models import ModelPair
from spectr_repro.models.tiny import make_tiny_pair
from spectr_repro.verify import VERIFIERS


@pytest.fixture(scope="module")
def pair():
    target, draft, tokenizer = make_tiny_pair(seed=0)
    return ModelPair(name="tiny", target=target, draft=draft, tokenizer=tokenizer, eos_token_ids=(),
                     vocab_size=259, device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture(scope="module")
def self_pair(pair):
    """Target as its own draft: transformers' assisted generation needs equal head sizes (the tiny pair's
    heads are padded differently on purpose, to test the engine's shared-vocabulary slicing)."""
    return ModelPair(name="tiny_self", target=pair.target, draft=pair.target, tokenizer=pair.tokenizer,
                     eos_token_ids=(), vocab_size=259, device=pair.device, dtype=pair.dtype)


PROMPT = torch.tensor([256, *b"def add(a, b):"])


def test_forward_meter_counts_calls_and_tokens_and_detaches(pair):
    with torch.inference_mode(), ForwardMeter(pair.device, target=pair.target, draft=pair.draft) as meter:
        pair.target(input_ids=torch.tensor([[256, 1, 2]]))
        pair.target(input_ids=torch.tensor([[3], [4]]))
        pair.draft(input_ids=torch.tensor([[5]]))
    assert meter.stats["target"]["calls"] == 2 and meter.stats["target"]["tokens_fed"] == 5
    assert meter.stats["draft"]["calls"] == 1 and meter.stats["draft"]["tokens_fed"] == 1
    assert meter.stats["target"]["seconds"] > 0
    with torch.inference_mode():
        pair.target(input_ids=torch.tensor([[7]]))
    assert meter.stats["target"]["calls"] == 2  # hooks removed on exit


def test_ar_side_by_side_reports_one_forward_per_token_for_both_loops(pair):
    result = suites.bench_ar_vs_hf(pair, [PROMPT], temperature=0.7, max_new_tokens=6, repeats=2)
    assert result["ratio"] == pytest.approx(result["ours_tokens_per_s"] / result["hf_tokens_per_s"])
    assert len(result["ours_all"]) == len(result["hf_all"]) == 2
    for who in ("ours", "hf"):
        profile = result[f"{who}_profile"]
        assert profile["tokens"] == 12
        assert profile["target_forwards_per_token"] == 1.0  # the prompt rides on the first forward
        assert profile["block_efficiency"] == 1.0
        assert "draft_forwards_per_token" not in profile
        assert 0 < profile["fraction_inside_forwards"] <= 1


def test_hf_generation_config_disables_the_models_own_eos(pair):
    """Both contenders must emit exactly max_new_tokens: an EOS the model's config declares is ignored."""
    target = pair.target
    prompt = torch.tensor([[256, *b"def f():"]])
    free = target.generate(prompt, do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = int(free[0, prompt.shape[1] + 2])  # the run's third token
    try:
        config = hf_generation_config(target, 0.7, 12)
        config.do_sample = False
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    finally:
        target.generation_config.eos_token_id = saved
    assert out.shape[1] - prompt.shape[1] == 12


def test_best_vs_best_runs_every_contender_and_picks_the_fastest_candidate(self_pair):
    result = suites.bench_best_vs_best(self_pair, [PROMPT], temperature=0.7, max_new_tokens=8, equal_L=3,
                                       candidates=[("sd", 1, 2), ("sd", 1, 4)], repeats=1)
    assert set(result["contenders"]) == {"hf_generate", "hf_assisted_defaults", "hf_assisted_L3", "ours_sd_L3",
                                         "ours_best"}
    assert result["best"] == max(result["sweep"], key=lambda row: row["tokens_per_s"])
    for contender in result["contenders"].values():
        assert contender["profile"]["tokens"] == 8
    ratio = result["contenders"]["ours_best"]["tokens_per_s"] / result["contenders"]["hf_generate"]["tokens_per_s"]
    assert result["best_vs_hf_generate"] == pytest.approx(ratio)


def test_best_of_refuses_a_rule_that_changes_the_output(pair):
    with pytest.raises(ValueError, match="not lossless"):
        suites.choose_best(pair, [PROMPT], [("spectr_gbv", 2, 3)], 0.7, 4)


def test_presets_compose_with_the_hardware_config():
    from spectr_repro.conf import conf_dir

    names = sorted(path.stem for path in (conf_dir() / "bench").glob("*.yaml"))
    assert {"quick", "full"} <= set(names)
    for name in names:
        preset, hardware = preset_module.compose_preset(name, "cpu")
        assert preset.pair and hardware.device == "cpu" and "prefill_chunk" in hardware
        best = preset.get("best_vs_best")
        for method, K, L in [*(preset.get("methods") or []), *(best.candidates if best else [])]:
            assert K >= 1 and L >= 1 and method
        for rule in (preset.get("verification") or {}).get("rules") or []:
            assert rule in VERIFIERS
    from spectr_repro.errors import UsageError

    with pytest.raises(UsageError):
        preset_module.compose_preset("no_such_preset", "cpu")


def test_verification_rows_carry_op_and_host_read_counts(pair):
    rows = suites.bench_verification(pair, PROMPT, Ks=[1], Ls=[2], repeats=1, blocks_per_shape=1)
    names = {row["rule"] for row in rows}
    assert {"sd", "bv", "gbv", "spectr", "sbv"} <= names
    for row in rows:
        assert row["ops_per_call"] > 0 and row["host_reads_per_call"] >= 1
        assert row["fraction_of_target_call"] > 0


def test_verification_rows_of_chosen_rules_render_alone(pair):
    """A preset with the verification section only (verification_qwen): rows of the rules it names, and a report."""
    rows = suites.bench_verification(pair, PROMPT, Ks=[2], Ls=[2], repeats=1, blocks_per_shape=1, rules=["sbv", "sbvf"])
    assert sorted(row["rule"] for row in rows) == ["sbv", "sbvf"]
    text = tables.markdown({"settings": {}, "ar_vs_hf_generate": {}, "sd_vs_hf_assisted": {}, "methods": {},
                         "verification": {"target_model": "tiny", "rows": rows}})
    assert "| sbvf | 2 | 2 |" in text and "Best against best" not in text


def test_markdown_renders_a_full_result(pair, self_pair):
    fake = {"settings": {"temperature": 0.7}, "ar_vs_hf_generate": {}, "sd_vs_hf_assisted": {},
            "methods": {"tiny": suites.bench_methods(pair, [PROMPT], 0.7, 6, [("sd", 1, 3)])},
            "best_vs_best": {"tiny": suites.bench_best_vs_best(self_pair, [PROMPT], 0.7, 6, 3, [("sd", 1, 3)], 1)},
            "verification": {"target_model": "tiny", "rows": suites.bench_verification(pair, PROMPT, [1], [2], 1, 1)}}
    text = tables.markdown(fake)
    assert "Best against best on tiny" in text and "| ours_best |" in text and "| host reads |" in text


def test_best_vs_best_takes_a_predicted_pick_instead_of_its_sweep(self_pair, monkeypatch):
    """With a pick from the replay and the calibration (issue 26): no sweep runs, ours_best is the pick, and
    the result holds the measured rate over the predicted one."""
    monkeypatch.setattr(suites, "choose_best", lambda *a, **k: pytest.fail("the one-run sweep ran"))
    pick = {"method": "sbv", "K": 2, "L": 3, "tokens_per_s": 50.0}
    result = suites.bench_best_vs_best(self_pair, [PROMPT], 0.7, 8, 3, [("sd", 1, 2)], 1, pick=pick)
    assert (result["best"]["method"], result["best"]["K"], result["best"]["L"]) == ("sbv", 2, 3)
    measured = result["contenders"]["ours_best"]["tokens_per_s"]
    assert result["predicted_tokens_per_s"] == 50.0
    assert result["measured_over_predicted"] == pytest.approx(measured / 50.0)
    with pytest.raises(ValueError, match="not lossless"):
        suites.bench_best_vs_best(self_pair, [PROMPT], 0.7, 8, 3, [], 1, pick=pick | {"method": "spectr_gbv"})


def test_predicted_pick_reads_the_replay_rows_of_the_bench_dataset(tmp_path, monkeypatch):
    """A replay of several datasets (replay_qwen) holds one row per (dataset, method, K, L): the pick uses the rows
    of the preset's dataset and temperature, with costs measured in the process at the replay's shapes; without
    a dataset to select it refuses the ambiguity."""
    import types

    from omegaconf import OmegaConf

    from spectr_repro.cost import calibration
    from spectr_repro.cost.calibration import ForwardCosts
    from spectr_repro.errors import UsageError

    costs = ForwardCosts(((1, 1, "last", 0.01), (8, 8, "all", 0.05)))
    asked = []

    def calibrate(pair, shapes):
        asked.append(shapes)
        return costs, costs

    monkeypatch.setattr(calibration, "find_calibration", lambda *args, **kwargs: None)
    rows = [  # humaneval favours sd L=6, gsm8k sbv K=3 L=6; the other temperature favours bv
        ("humaneval", 0.4, "sd", 1, 6, 5.0), ("humaneval", 0.4, "sbv", 3, 6, 2.0),
        ("gsm8k", 0.4, "sd", 1, 6, 2.0), ("gsm8k", 0.4, "sbv", 3, 6, 6.5),
        ("humaneval", 0.7, "bv", 1, 6, 6.9), ("gsm8k", 0.7, "bv", 1, 6, 6.9)]
    summary = tmp_path / "replay_summary.csv"
    summary.write_text("dataset,temperature,method,K,L,blocks,prompts,tokens_per_call,ci_low,ci_high\n" + "".join(
        f"{d},{t},{m},{k},{l},10,2,{v},{v - 0.1},{v + 0.1}\n" for d, t, m, k, l, v in rows))
    pair = types.SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cpu"))
    preset = OmegaConf.create({"pair": "tiny", "temperature": 0.4, "dataset": "humaneval", "max_new_tokens": 8})
    pick = preset_module.predicted_pick(str(summary), None, preset, pair, [[1, 2, 3]], calibrate=calibrate)
    assert (pick["method"], pick["K"], pick["L"]) == ("sd", 1, 6) and "this process" in pick["calibration"]
    assert {(1, 7, "all"), (3, 7, "all"), (1, 3, "last")} <= set(asked[0]["target"])  # K=1,3 x L+1; the prompt
    preset.dataset = "gsm8k"
    pick = preset_module.predicted_pick(str(summary), None, preset, pair, [[1, 2, 3]], calibrate=calibrate)
    assert pick["method"] == "sbv"
    preset.dataset = None
    with pytest.raises(UsageError, match="several rows per"):
        preset_module.predicted_pick(str(summary), None, preset, pair, [[1, 2, 3]], calibrate=calibrate)


def test_the_bench_measures_the_costs_of_its_pick_on_the_pair(pair, tmp_path):
    """Without a test double the pick's costs are measured on the loaded pair (the tiny one here): positive
    seconds for every shape the replay calls, and a pick among the replay's lossless rows."""
    from omegaconf import OmegaConf

    summary = tmp_path / "replay_summary.csv"
    summary.write_text("method,K,L,blocks,prompts,tokens_per_call,ci_low,ci_high\n"
                       "sd,1,2,4,2,2.5,2.4,2.6\nspectr_gbv,2,2,4,2,2.9,2.8,3.0\n")
    preset = OmegaConf.create({"pair": "tiny", "temperature": 0.7, "max_new_tokens": 8})
    pick = preset_module.predicted_pick(str(summary), None, preset, pair, [PROMPT])
    assert (pick["method"], pick["K"], pick["L"]) == ("sd", 1, 2)  # spectr_gbv is faster on paper, not lossless
    assert pick["seconds_per_call"] > 0 and pick["tokens_per_s"] > 0
