"""`python -m spectr_repro check`: the tiny pair end to end (fast), failures that must show, the Qwen pair (slow)."""

from __future__ import annotations

import json

import pytest

from spectr_repro.check import main
from spectr_repro.cost.calibration import read_calibrations

TINY = ["model_pair=tiny_random", "check.quick=true", "method=sd", "K=1", "L=3", "logger=disabled"]


def test_tiny_pair_passes_writes_its_json_and_calibrates_the_plan(tmp_path, calibration_file, capsys):
    from spectr_repro.plan import main as main_plan
    from spectr_repro.verify import VERIFIERS

    assert main([*TINY, f"check.output={tmp_path / 'check'}"]) == 0
    out = capsys.readouterr().out
    assert "every correctness item passed" in out and "| correctness" in out
    result = json.loads((tmp_path / "check" / "check.json").read_text())
    items = {item["name"]: item for item in result["items"]}
    for name in ["greedy AR = model.generate", "sd (T=0, L=4) = model.generate", "batched = batch 1 (T=0)",
                 "sections sum to the synchronised wall time", *(f"rule {rule} runs one block" for rule in VERIFIERS)]:
        assert items[name]["status"] == "pass" and items[name]["required"], name
    entry = read_calibrations()["cpu/tiny_random/float32"]
    assert {(r, t) for r, t, _, _ in entry.target.points} >= {(1, 1), (1, 4)}  # decode, sd's L+1 call
    # the rest of the call cost model: sd's call timed on real blocks, each section's overhead fitted on decodes
    assert entry.extra["rule_seconds"]["sd/1/3"] > 0 and "spectr/1/3" in entry.extra["rule_seconds"]
    assert set(entry.extra["section_overheads"]["fits"]) == {"draft", "target", "verify", "other"}
    assert items["rule calls on real blocks"]["status"] == "info" and items["section overheads"]["status"] == "info"
    assert main_plan(["model_pair=tiny_random", "method=sd", "K=1", "L=3", f"output_dir={tmp_path / 'r'}"]) == 0
    assert f"calibrated on {entry.device}, {entry.date}" in capsys.readouterr().out


def test_a_wrong_token_fails_the_check(tmp_path, monkeypatch, capsys):
    """Negative control: an engine whose greedy AR differs from model.generate by one token exits 1."""
    import spectr_repro.check.correctness as correctness  # where the check calls the engine

    real = correctness.generate

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        if kwargs.get("method") == "ar":
            out.new_tokens[-1] = (out.new_tokens[-1] + 1) % 259
        return out

    monkeypatch.setattr(correctness, "generate", off_by_one)
    assert main([*TINY, f"check.output={tmp_path / 'check'}"]) == 1
    out = capsys.readouterr().out
    assert "SOME CORRECTNESS ITEM FAILED" in out
    items = {i["name"]: i for i in json.loads((tmp_path / "check" / "check.json").read_text())["items"]}
    assert items["greedy AR = model.generate"]["status"] == "fail"
    assert items["sd (T=0, L=4) = model.generate"]["status"] == "pass"


@pytest.mark.parametrize("argv, message", [
    (["K=1,3"], "check takes one value per key"),
    (["check.random_wieghts=true"], "unknown key 'check.random_wieghts'"),
    (["model_pair=tiny_randm"], "unknown model_pair 'tiny_randm'"),
])
def test_bad_input_exits_2(argv, message, tmp_path, capsys):
    assert main([*argv, f"check.output={tmp_path / 'check'}"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "check").exists()


def test_a_pair_that_does_not_fit_is_said_before_anything_is_built(tmp_path, monkeypatch, capsys):
    """The 33B pair with random weights against 16 GiB free: memory fails, nothing is built, exit 1."""
    from spectr_repro.check import architectures, environment

    monkeypatch.setattr(environment, "free_memory", lambda device: (16 * 2**30, 32 * 2**30))
    monkeypatch.setattr(architectures, "build_random_model", lambda *a, **k: pytest.fail("a model was built"))
    code = main(["model_pair=deepseek_33b_1.3b", "check.random_weights=true", "check.quick=true",
                 f"check.output={tmp_path / 'check'}"])
    assert code == 1
    items = {i["name"]: i for i in json.loads((tmp_path / "check" / "check.json").read_text())["items"]}
    assert items["fits without offload"]["status"] == "fail"
    assert "needs ~7" in items["fits without offload"]["detail"]  # 33.3B + 1.35B params in bfloat16, ~69 GB
    assert items["load"]["status"] == "skip"


def test_shipped_configs_match_the_model_cards():
    """The architecture configs shipped for random weights have the parameter counts the pair configs state."""
    from spectr_repro.check.architectures import architecture_config, parameter_count
    from spectr_repro.models import pair_config

    for name in ("deepseek_33b_1.3b", "deepseek_6.7b_1.3b"):
        pair = pair_config(name)
        for role in ("target", "draft"):
            count = parameter_count(architecture_config(pair, role))
            assert count / 1e9 == pytest.approx(pair[role]["params_b"], rel=0.01), (name, role)


@pytest.mark.slow
def test_qwen_pair_check_passes(tmp_path, capsys):
    from spectr_repro.models.offline import OFFLINE_MODELS

    if not all(OFFLINE_MODELS[f].is_converted() for f in ("qwen2.5-coder-1.5b-instruct",
                                                           "qwen2.5-coder-0.5b-instruct")):
        pytest.skip("the Qwen pair is not converted (make models)")
    assert main(["model_pair=qwen25coder_1.5b_0.5b", "check.quick=true", f"check.output={tmp_path}"]) == 0
    assert "cpu/qwen25coder_1.5b_0.5b/bfloat16" in read_calibrations()


def test_random_weights_build_the_pair_from_its_configs(tmp_path, monkeypatch, capsys):
    """The random-weight path end to end, with the DeepSeek pair's configs swapped for small Llamas of the same
    kind (the real ones would take minutes to build on a CPU): nothing is downloaded, both models are built
    from configs, the correctness items run on the draft in float32 against its bfloat16 self, and the
    calibration is marked as random weights."""
    from transformers import LlamaConfig

    from spectr_repro.check import architectures

    small = {"target": LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2),
             "draft": LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1)}
    monkeypatch.setattr(architectures, "architecture_config", lambda pair, role: small[role])
    import spectr_repro.models as models

    monkeypatch.setattr(models, "load_pair", lambda *a, **k: pytest.fail("real weights were loaded"))
    code = main(["model_pair=deepseek_6.7b_1.3b", "check.random_weights=true", "check.quick=true", "method=sd",
                 "K=1", "L=3", f"check.output={tmp_path / 'check'}"])
    assert code == 0, capsys.readouterr().out
    entry = read_calibrations()["cpu/deepseek_6.7b_1.3b/bfloat16"]
    assert entry.random_weights and "random weights" in entry.note
    items = {i["name"]: i for i in json.loads((tmp_path / "check" / "check.json").read_text())["items"]}
    assert items["load"]["detail"].startswith("random weights")
    assert items["greedy AR = model.generate"]["status"] == "pass"
