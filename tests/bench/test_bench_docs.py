"""docs/speed.md's tables come from the files the bench writes: `python -m spectr_repro.bench.docs` on a small
fabricated bench result gives its tables with its date, machine and command, and a malformed file is refused
with one message naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spectr_repro.bench import docs
from spectr_repro.docblocks import read_block

REPO = Path(__file__).resolve().parents[2]


def _profile(be: float, ms_per_token: float) -> dict:
    return {"block_efficiency": be, "ms_per_token": ms_per_token, "target_forwards_per_token": 1 / be,
            "target_ms_per_forward": 500.0, "ms_per_token_outside_forwards": 1.5, "fraction_inside_forwards": 0.99}


def fabricated() -> dict:
    """The shape `python -m spectr_repro bench` writes (bench.cli.run plus date and command), one of everything."""
    ar = {"ours_tokens_per_s": 3.54, "hf_tokens_per_s": 3.19, "ratio": 1.11,
          "ours_profile": _profile(1.0, 282.5), "hf_profile": _profile(1.0, 313.5)}
    sd = {"ours_tokens_per_s": 4.45, "hf_tokens_per_s": 4.37, "ratio": 1.02,
          "ours_profile": _profile(5.26, 224.7), "hf_profile": _profile(5.61, 228.8)}
    contenders = {name: {"tokens_per_s": tps, "profile": _profile(be, 1e3 / tps)} for name, tps, be in
                  [("hf_generate", 5.06, 1.0), ("hf_assisted_defaults", 5.64, 8.98), ("ours_best", 7.23, 7.31)]}
    return {
        "settings": {"dataset": "humaneval", "num_prompts": 4, "max_new_tokens": 64, "temperature": 0.7,
                     "repeats": 2, "assist_L": 6, "preset": "qwen"},
        "ar_vs_hf_generate": {"qwen": ar}, "sd_vs_hf_assisted": {"qwen": sd},
        "best_vs_best": {"qwen": {"best": {"method": "sd", "K": 1, "L": 10}, "contenders": contenders,
                                  "best_vs_hf_assisted_defaults": 1.28, "best_vs_hf_generate": 1.43,
                                  "sweep": [{"method": "sd", "K": 1, "L": 10, "tokens_per_s": 7.1,
                                             "block_efficiency": 7.2}]}},
        "methods": {"qwen": [{"method": "sbv", "K": 3, "L": 6, "block_efficiency": 6.10, "speedup": 1.18,
                              "tokens_per_s": 4.1, "verify_fraction_of_target": 0.019, "peak_memory_mb": 5300}]},
        "verification": {"target_model": "qwen", "rows": [
            {"rule": "spectr", "K": 3, "L": 12, "V": 151936, "verify_ms": 25.5, "verify_ms_synthetic": 8.5,
             "target_call_ms": 303.6, "fraction_of_target_call": 0.084, "ops_per_call": 183,
             "host_reads_per_call": 5}]},
        "environment": {"device": "cpu", "device_name": "AMD EPYC 9R14", "torch": "2.13.0+cpu",
                        "transformers": "5.24.0", "python": "3.12.3", "git_commit": "abc1234", "num_threads": 2,
                        "cpu_count": 2, "hostname": "box"},
        "wall_time_s": 1500.0,
        "date": "2026-11-30T10:00:00+00:00",
        "command": "python -m spectr_repro bench --preset qwen --out results/bench/bench_qwen.json",
    }


def _speed_doc(path: Path) -> Path:
    path.write_text("# Speed\n\nprose\n\n<!-- bench-tables:begin -->\nold\n<!-- bench-tables:end -->\n\nmore prose\n")
    return path


def test_a_bench_file_becomes_its_tables_with_date_machine_and_command(tmp_path, capsys):
    result = tmp_path / "bench_qwen.json"
    result.write_text(json.dumps(fabricated()))
    doc = _speed_doc(tmp_path / "speed.md")
    assert docs.main([str(result), "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Speed\n\nprose\n") and text.endswith("\n\nmore prose\n")  # prose untouched
    block = read_block(text, docs.BLOCK)
    assert block == docs.render([result])
    assert f"### `{result.as_posix()}`: preset qwen, 2026-11-30" in block
    assert "Date: 2026-11-30T10:00:00+00:00" in block and "AMD EPYC 9R14" in block and "host box" in block
    assert "Command: `python -m spectr_repro bench --preset qwen --out results/bench/bench_qwen.json`" in block
    assert "| ar_vs_hf_generate | qwen | 3.54 | 3.19 | 1.110 | >= 1.0 |" in block
    assert "| spectr | 3 | 12 | 25.50 | 8.50 | 303.6 | 8.4% | 183 | 5 |" in block
    assert docs.main([str(result), "--docs", str(doc), "--check"]) == 0
    doc.write_text(text.replace("3.54", "9.99"))
    assert docs.main([str(result), "--docs", str(doc), "--check"]) == 1


def test_one_section_per_file_and_a_file_without_date_or_command_says_so(tmp_path):
    old = fabricated()
    del old["date"], old["command"]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(fabricated()))
    second.write_text(json.dumps(old))
    block = docs.render([first, second])
    assert block.count("### `") == 2
    assert "Date: not recorded (file time " in block and "Command: not recorded (preset qwen)" in block


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    (json.dumps({"settings": {}}), "no 'environment' object"),
    (json.dumps({k: v for k, v in fabricated().items() if k != "ar_vs_hf_generate"}), "no key 'ar_vs_hf_generate'"),
])
def test_a_malformed_file_is_refused_with_one_message_naming_it(tmp_path, capsys, content, message):
    bad = tmp_path / "bench.json"
    bad.write_text(content)
    doc = _speed_doc(tmp_path / "speed.md")
    before = doc.read_text()
    assert docs.main([str(bad), "--docs", str(doc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad} is not a result of `python -m spectr_repro bench`")
    assert message in err[0]
    assert doc.read_text() == before


def test_without_bench_files_the_section_says_how_to_produce_one(tmp_path):
    block = docs.render([])
    assert "make bench" in block and docs.COMMAND in block


def test_docs_speed_md_has_the_generated_block():
    """The committed docs/speed.md holds a block the command writes (files are not committed: results/ is ignored,
    so only its form is checked here)."""
    block = read_block((REPO / "docs" / "speed.md").read_text(), docs.BLOCK, "docs/speed.md")
    assert block == docs.render([]) or block.startswith(f"Generated by `{docs.COMMAND} ")


def test_the_bench_records_its_date_and_command_in_its_file(tmp_path, monkeypatch):
    """`python -m spectr_repro bench` (its measurements stubbed here) writes the date and command the docs show."""
    from spectr_repro.bench import cli
    from spectr_repro.bench import preset as preset_module

    measured = {k: v for k, v in fabricated().items() if k not in ("date", "command")}
    monkeypatch.setattr(preset_module, "compose_preset", lambda name, device: (name, None))
    monkeypatch.setattr(preset_module, "run", lambda *args, **kwargs: json.loads(json.dumps(measured)))
    out = tmp_path / "bench_qwen.json"
    assert cli.main(["--preset", "qwen", "--device", "cpu", "--out", str(out)]) == 0
    results, _ = docs.load(out)
    assert results["command"] == f"python -m spectr_repro bench --preset qwen --device cpu --out {out}"
    assert results["date"][:4].isdigit() and results["date"].endswith("+00:00")
    assert f"Command: `{results['command']}`." in docs.render([out])


def test_a_preset_without_some_sections_renders_what_it_has(tmp_path):
    """verification_qwen writes the verification rows only; a file without them (or without best_vs_best) renders
    the sections it has and leaves the others out."""
    only_verification = {**fabricated(), "ar_vs_hf_generate": {}, "sd_vs_hf_assisted": {}, "methods": {}}
    del only_verification["best_vs_best"]
    no_verification = {k: v for k, v in fabricated().items() if k != "verification"}
    for content, present, absent in ((only_verification, "| spectr | 3 | 12 |", "| benchmark | pair |"),
                                     (no_verification, "| benchmark | pair |", "Verification per call")):
        path = tmp_path / "bench.json"
        path.write_text(json.dumps(content))
        doc = _speed_doc(tmp_path / "speed.md")
        assert docs.main([str(path), "--docs", str(doc)]) == 0
        assert present in doc.read_text() and absent not in doc.read_text()


def test_the_batch_bench_has_its_own_block(tmp_path):
    """``--block batch-tables``: the batch bench's table into its block; the bench block is left as it was."""
    cell = {"method": "spectr", "K": 3, "L": 4, "B": 8, "groups": 1, "tokens_per_call": 2.9, "speedup": 0.81,
            "speedup_low": float("nan"), "speedup_high": float("nan"), "predicted": 0.77, "error": -0.05,
            "decode_speedup": 0.9, "decode_speedup_low": float("nan"), "decode_speedup_high": float("nan"),
            "decode_predicted": 0.85, "decode_error": -0.06}
    result = fabricated() | {"batches": {
        "pair": "qwen", "cells": [cell], "groups": [], "costs_source": "measured here", "median_abs_error": 0.05,
        "worst_abs_error": 0.05, "decode_median_abs_error": 0.06, "decode_worst_abs_error": 0.06,
        "settings": {"batches": [8], "datasets": ["humaneval", "gsm8k"], "prompts": 8, "temperature": 0.4,
                     "max_new_tokens": 32, "contenders": [["spectr", 3, 4]]}}}
    path = tmp_path / "bench_batch.json"
    path.write_text(json.dumps(result))
    doc = _speed_doc(tmp_path / "speed.md")
    doc.write_text(doc.read_text() + "\n<!-- batch-tables:begin -->\n<!-- batch-tables:end -->\n")
    assert docs.main(["--docs", str(doc), "--block", "batch-tables", str(path)]) == 0
    text = doc.read_text()
    assert read_block(text, "bench-tables", "doc") == "old"
    block = read_block(text, "batch-tables", "doc")
    assert "--block batch-tables" in block and "| spectr | 3 | 4 | 8 | 1 | 2.90 | 0.81 | 0.77 | -5 % |" in block
    assert docs.main(["--docs", str(doc), "--block", "batch-tables", "--check", str(path)]) == 0


def test_a_batch_result_says_its_pool_and_batches_not_the_presets_rounds(tmp_path):
    """The batch bench's line names its pool (prompts, datasets), its batch sizes and tokens; the preset's generic
    keys (one prompt, rounds) describe nothing it measured."""
    results = {"date": "2026-12-06T08:23:39+00:00", "command": "python -m spectr_repro bench --preset batch_qwen",
               "settings": {"num_prompts": 1, "dataset": "gsm8k", "repeats": 1, "preset": "batch_qwen"},
               "environment": {"device_name": "a CPU"}, "wall_time_s": 600.0,
               "batches": {"settings": {"prompts": 8, "datasets": ["gsm8k", "lm1b"], "batches": [1, 2, 4, 8],
                                        "max_new_tokens": 32, "temperature": 0.4}}}
    text = docs.section(tmp_path / "bench_batch.json", results, "")
    assert "Run: 8 prompts of gsm8k, lm1b in groups of B = 1, 2, 4, 8 × 32 new tokens, T=0.4, 10.0 min." in text
    assert "rounds" not in text


def test_the_committed_batch_tables_are_the_committed_files(monkeypatch):
    """docs/speed.md's batch-tables block is what `python -m spectr_repro.bench.docs --block batch-tables` renders
    from the committed batch benches (results/speedup_batch: the full preset the report reads, then the short one
    kept beside it), so a new bench result cannot land without its table. Negative control: the block with one
    measured value changed no longer matches."""
    monkeypatch.chdir(REPO)
    files = docs.batch_files()
    assert [p.name for p in files][:1] == ["bench_batch.json"]
    assert not [p for p in files if ".partial" in p.name or ".set-aside" in p.name]
    expected = docs.render(files, "batch-tables")  # relative paths, as the command shows them
    block = read_block((REPO / "docs" / "speed.md").read_text(), "batch-tables", "docs/speed.md")
    assert block == expected, f"docs/speed.md is stale: {docs.COMMAND} --block batch-tables"
    measured = re.search(r"\| (\d\.\d\d) \[", block).group(1)
    altered = block.replace(f"| {measured} [", f"| {float(measured) + 0.01:.2f} [", 1)
    assert altered != expected


CALIBRATION_KEYS = ("calibration_predicted", "decode_calibration_predicted")


def test_the_committed_batch_bench_predictions_are_the_cost_models_now():
    """The full preset's committed cells are what today's cost model predicts from the run's own calibration and
    groups (``bench.batches.rescore``): a change to the model that moves a committed prediction fails here until the
    file is timed again. Negative control: costs with the target's forwards doubled predict other cells."""
    from spectr_repro.bench.batches import rescore

    result = json.loads((REPO / "results" / "speedup_batch" / "bench_batch.json").read_text())["batches"]
    again = rescore(result)
    assert len(again) == len(result["cells"]) == 32
    for old, new in zip(result["cells"], again):
        assert {k: old[k] for k in ("method", "K", "L", "B")} == {k: new[k] for k in ("method", "K", "L", "B")}
        for key in ("predicted", "decode_predicted", "speedup", *CALIBRATION_KEYS):
            if key in old:  # calibration_: groups whose forwards were timed again before them
                assert new[key] == pytest.approx(old[key], rel=1e-9), (old["method"], old["K"], old["L"], old["B"], key)
    # Negative control: the target's forwards twice as dear, in the calibration and in each group's own timing
    dearer = json.loads(json.dumps(result))
    forwards = [row["forwards"]["target"] for row in dearer["groups"] if row.get("forwards")]
    for points in [dearer["costs"]["target"], *forwards]:
        for point in points:
            point["seconds"] *= 2
    moved = rescore(dearer)
    for key in ("predicted", "calibration_predicted") if forwards else ("predicted",):
        assert any(abs(m[key] / c[key] - 1) > 0.05 for m, c in zip(moved, result["cells"])), key


def test_docs_quote_where_the_committed_batch_benchs_error_is():
    """docs/speed.md quotes ``seconds_against_prediction`` of the committed file (it predates the field, so the
    sentence is prose, not the generated block): a new run or a model change that moves it fails here. Negative
    control: AR's seconds 10 % dearer give another sentence."""
    from spectr_repro.bench.batches import seconds_against_prediction
    from spectr_repro.bench.tables import where_the_error_is

    result = json.loads((REPO / "results" / "speedup_batch" / "bench_batch.json").read_text())["batches"]
    speed = (REPO / "docs" / "speed.md").read_text()
    if "seconds_against_prediction" in result:
        pytest.fail("the committed run keeps its own breakdown: drop the quoted sentence from docs/speed.md's prose")
    sentence = where_the_error_is(json.loads(json.dumps(seconds_against_prediction(result))))
    assert f"> {sentence}" in speed
    slower = json.loads(json.dumps(result))
    for row in slower["groups"]:
        if row["method"] == "ar":
            row["seconds"] += 0.1 * (row["seconds"] - row["prefill_s"])
    assert where_the_error_is(seconds_against_prediction(slower)) != sentence
