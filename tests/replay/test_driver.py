"""`python -m spectr_repro replay` on the tiny random pair: end to end, resume, bad input, agreement with
a trajectory of its own."""

from __future__ import annotations

import json
import math

import pytest
import torch

from spectr_repro.analysis.replay import load_blocks, read_summaries
from spectr_repro.replay.driver import main

BASE = ["model_pair=tiny_random", "dataset=humaneval", "temperature=0.7", "logger=disabled"]


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def run(tmp_path, *extra, folder="out"):
    return main([*BASE, f"output_dir={tmp_path / folder}", *extra])


def block_files(tmp_path, folder="out"):
    return sorted((tmp_path / folder).glob("default/replay/*/prompts/*/blocks.jsonl"))


def block_values(path):
    """A block file's lines without their timings (rule_seconds: the one field a rerun may change)."""
    return [{k: v for k, v in json.loads(line).items() if k != "rule_seconds"}
            for line in path.read_text().splitlines()]


def test_replay_writes_summaries_is_deterministic_and_resumes(tmp_path, capsys):
    args = ["method=sd,sbv", "K=1,2", "L=2,3", "num_prompts=3", "max_new_tokens=10", "replay.draws=2"]
    assert run(tmp_path, *args) == 0
    assert "3 prompt(s) replayed" in capsys.readouterr().out
    assert run(tmp_path, *args, folder="again") == 0
    first, second = block_files(tmp_path), block_files(tmp_path, "again")
    assert len(first) == 3 and [block_values(f) for f in first] == [block_values(f) for f in second]
    assert all("rule_seconds" in json.loads(line) for line in first[0].read_text().splitlines())

    table, diffs = read_summaries(tmp_path / "out" / "default" / "replay")
    cells = set(zip(table["method"], table["K"], table["L"]))
    assert cells == {("sd", 1, 2), ("sd", 1, 3), ("sbv", 1, 2), ("sbv", 1, 3), ("sbv", 2, 2), ("sbv", 2, 3)}
    assert (table["prompts"] == 3).all() and (table["tokens_per_call"] >= 1).all()
    assert set(diffs["comparator"]) == {"sd"}  # the release was not replayed

    # Interrupted replay: one prompt lost its completion marker; only it is computed again.
    kept = {f: f.stat().st_mtime_ns for f in first[1:]}
    (first[0].parent / "done.json").unlink()
    assert run(tmp_path, *args) == 0
    out = capsys.readouterr().out
    assert "1 prompt(s) replayed, 2 finished earlier" in out
    assert all(f.stat().st_mtime_ns == t for f, t in kept.items())
    assert block_values(first[0]) == block_values(second[0])


def test_other_settings_in_the_same_folder_are_refused(tmp_path, capsys):
    args = ["method=sd,bv", "K=1", "L=2", "num_prompts=1", "max_new_tokens=4"]
    assert run(tmp_path, *args) == 0
    assert run(tmp_path, "method=sd,bv", "K=1", "L=3", "num_prompts=1", "max_new_tokens=4") == 2
    assert "other settings (L)" in capsys.readouterr().err
    # A rule dropped from the replay is refused too: its later prompts would lack it without a reason.
    assert run(tmp_path, "method=sd", "K=1", "L=2", "num_prompts=1", "max_new_tokens=4") == 2
    assert "other settings (methods)" in capsys.readouterr().err


def test_a_rule_added_to_a_replay_goes_on_with_the_new_prompts(tmp_path, capsys):
    """A rule registered after a replay began (hsd, 2026-12-05) joins it: the finished prompts are kept as they are,
    the new prompts carry the new rule, and the report pairs it with the others on the prompts both have."""
    args = ["K=1", "L=2", "max_new_tokens=4"]
    assert run(tmp_path, "method=sd", "num_prompts=1", *args) == 0
    first = block_files(tmp_path)
    kept = first[0].stat().st_mtime_ns
    assert run(tmp_path, "method=sd,bv", "num_prompts=2", *args) == 0
    assert "1 prompt(s) replayed, 1 finished earlier" in capsys.readouterr().out
    files = block_files(tmp_path)
    assert files[0].stat().st_mtime_ns == kept
    methods = [{value[0] for line in f.read_text().splitlines() for value in json.loads(line)["values"]}
               for f in files]
    assert methods == [{"sd"}, {"sd", "bv"}]


@pytest.mark.parametrize("arguments, message", [
    (["method=nope"], "unknown method"),
    (["K=0"], "K values"),
    (["L=0"], "L values"),
    (["method=sd", "K=3"], "single-draft"),
    (["replay.reference=spectr_gbv"], "lossless"),
    (["replay.draws=0"], "replay.draws must be an integer >= 1"),
    (["replay.reference_K=true"], "replay.reference_K must be an integer >= 1, got True"),
    (["replay.reference_L='6'"], "replay.reference_L must be an integer >= 1, got '6'"),
    (["replay.row_groups=rows"], "replay.row_groups must be one of"),
    (["replay.reference=sd"], "replay.reference sd verifies a single draft: set replay.reference_K=1"),
    (["K=a"], "integers"),
    (["dataset=nope"], "dataset"),
    (["method=sd", "K=1", "replay.sampled=[spectr_gbv]"], "replay.sampled names rules the replay does not run"),
])
def test_bad_input_is_one_message_and_exit_2_before_loading(tmp_path, capsys, arguments, message):
    assert run(tmp_path, *arguments) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sd_replay_agrees_with_sd_trajectories(tmp_path):
    """SD's replay value (K=1, L=4, on the blocks of an sbv K=2 L=4 trajectory) against SD's own trajectories
    (block efficiency of their full blocks, :func:`full_block_tokens`). Blocks are treated as
    independent for this check's standard errors; the threshold is 4 combined SEs. Negative control: the
    replay at L=1 is far (> 4 SE) from the L=3 trajectories, so the check has power."""
    from spectr_repro.analysis.replay_report import full_block_tokens
    from spectr_repro.data import encode_prompt, load_examples
    from spectr_repro.engine.loop import generate
    from spectr_repro.models import load_pair

    args = ["method=sd", "K=1", "L=1,4", "num_prompts=12", "max_new_tokens=48", "replay.reference_K=2",
            "replay.reference_L=4", "replay.draws=1"]
    assert run(tmp_path, *args) == 0
    blocks = load_blocks(tmp_path / "out" / "default" / "replay")

    pair = load_pair("tiny_random")
    trajectory = []
    for index, example in enumerate(load_examples("humaneval", 12, seed=0, tokenizer=pair.tokenizer)):
        ids = encode_prompt(pair.tokenizer, example)[0]
        for seed in range(3):
            out = generate(pair.target, pair.draft, ids, method="sd", K=1, L=4, temperature=0.7, max_new_tokens=48,
                           seed=1000 * index + seed, vocab_size=pair.vocab_size)
            trajectory += full_block_tokens(out.stats["accepted_lengths"], out.stats["block_lengths"], 4)

    def mean_se(values):
        values = torch.tensor(values, dtype=torch.float64)
        return float(values.mean()), float(values.std() / math.sqrt(len(values)))

    t_mean, t_se = mean_se(trajectory)
    r_mean, r_se = mean_se(blocks.query("L == 4")["tokens"].tolist())
    assert abs(r_mean - t_mean) < 4 * math.hypot(t_se, r_se), (r_mean, t_mean)
    short_mean, short_se = mean_se(blocks.query("L == 1")["tokens"].tolist())
    assert abs(short_mean - t_mean) > 4 * math.hypot(t_se, short_se), (short_mean, t_mean)


def test_records_name_the_estimator_and_the_reference(tmp_path):
    assert run(tmp_path, "method=gbv,sbv", "K=1,2", "L=2", "num_prompts=1", "max_new_tokens=6") == 0
    line = json.loads(block_files(tmp_path)[0].read_text().splitlines()[0])
    assert {row[4] for row in line["values"]} <= {"exact", "monte_carlo"}
    assert 1 <= line["reference_tokens"] <= 7
    meta = json.loads(next((tmp_path / "out").glob("default/replay/*/replay.json")).read_text())
    assert meta["reference"] == "sbv" and meta["methods"] == ["gbv", "sbv"]


def test_more_prompts_extend_a_replay_in_its_folder(tmp_path, capsys):
    args = ["method=sd", "K=1", "L=2", "max_new_tokens=4"]
    assert run(tmp_path, *args, "num_prompts=1") == 0
    capsys.readouterr()
    assert run(tmp_path, *args, "num_prompts=2") == 0
    assert "1 prompt(s) replayed, 1 finished earlier" in capsys.readouterr().out
    assert len(block_files(tmp_path)) == 2


def test_a_folder_goes_on_in_another_dtype_and_each_prompt_records_its_own(tmp_path, capsys):
    """The dtype that is fast depends on the CPU (bfloat16 with AVX512-BF16, float32 on AVX2 only): a folder
    accumulates prompts over machines of either kind, so the dtype is each prompt's (done.json), not the folder's.
    Control: another seed is another folder."""
    args = ["method=sd", "K=1", "L=2", "max_new_tokens=4"]
    assert run(tmp_path, *args, "num_prompts=1") == 0
    assert run(tmp_path, *args, "num_prompts=2", "hardware.dtype=bfloat16") == 0
    assert "1 prompt(s) replayed, 1 finished earlier" in capsys.readouterr().out
    [folder] = (tmp_path / "out" / "default" / "replay").glob("*/")
    dtypes = [json.loads((folder / "prompts" / i / "done.json").read_text())["environment"]["dtype"]
              for i in ("0000", "0001")]
    assert dtypes == ["float32", "bfloat16"]
    assert "dtype" not in json.loads((folder / "replay.json").read_text())
    assert run(tmp_path, *args, "num_prompts=1", "seed=1") == 0
    assert len(list((tmp_path / "out" / "default" / "replay").glob("*/replay.json"))) == 2
