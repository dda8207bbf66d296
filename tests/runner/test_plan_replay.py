"""`plan` prints the shared-block replay's cost beside the timed cells' (experiments with a `replay:` block)."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from spectr_repro.cost import CellSpec, speculative_prompt_seconds
from spectr_repro.environment import device_name
from spectr_repro.launch.pairs import pair_config_of
from spectr_repro.logs import format_duration
from spectr_repro.plan import main as main_plan
from spectr_repro.replay.driver import parse, prompt_directory, write_prompt
from spectr_repro.runner.store import atomic_write_text


def _plan(capsys, *argv) -> str:
    assert main_plan(list(argv)) == 0
    return capsys.readouterr().out


def _lines(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith(start)]


def _replay_line(text: str) -> str:
    lines = _lines(text, "Replay (shared blocks")
    assert len(lines) == 1, text
    return lines[0]


def _detail_line(text: str) -> str:
    return text.splitlines()[text.splitlines().index(_replay_line(text)) + 1]


# cpu_quick's replay block at the size these tests count with (its yaml may grow: the tests do not follow it)
PINNED = ("replay.num_prompts=2", "replay.L=[6]")


def test_cpu_quick_plan_prints_its_replay(offline, capsys):
    out = offline / "results"
    text = _plan(capsys, "experiment=cpu_quick", *PINNED, f"output_dir={out}")
    line = _replay_line(text)
    assert f"`python -m spectr_repro replay experiment=cpu_quick {' '.join(PINNED)} output_dir={out}`" in line
    assert "5 datasets x 1 temperature x 2 prompts, blocks of K_max x L_max = 7 x 6" in line
    assert "rules 0 s" in line and "rules not estimated (no finished replay here)" in line
    # nothing measured: the reference sbv K=3 L=6 at (L+1)/2 = 3.5 tokens per block, ceil(32 / 3.5) = 10 blocks
    detail = _detail_line(text)
    assert "10 prompts, 0 finished, 10 to replay, 100 blocks" in detail
    assert "reference sbv K=3 L=6: 3.50 tokens per block, (L+1)/2 (5 groups)" in detail
    assert f"in {out / 'cpu_quick' / 'replay'}" in detail
    # the total: replay + calibration (`check` of the same experiment) + timed cells, in hours, summed
    (calibration,) = _lines(text, "Calibration (")
    assert f"`python -m spectr_repro check experiment=cpu_quick output_dir={out}`" in calibration
    (total,) = _lines(text, "Total:")
    hours = [float(v) for v in re.findall(r"([\d.]+) h\b", total)][:4]
    assert total.startswith(f"Total: {hours[0]:.2f} h = replay {hours[1]:.2f} h + calibration {hours[2]:.2f} h + "
                            f"timed cells {hours[3]:.2f} h")
    assert hours[0] == pytest.approx(sum(hours[1:]), abs=0.015)
    assert not out.exists(), "a plan writes nothing"


def _blocks(*pairs):
    """Block lines as ReplayingReference writes them: (reference_tokens, rule_seconds) per block."""
    return [{"iteration": i, "reference_tokens": tokens, "values": [["sd", 1, 6, 2.0, "exact", 0]],
             "rule_seconds": seconds} for i, (tokens, seconds) in enumerate(pairs)]


def test_finished_replay_prompts_are_counted_and_measure_the_estimate(offline, capsys):
    out = offline / "results"
    argv = ["experiment=cpu_quick", *PINNED, f"output_dir={out}"]
    groups = parse(argv)
    assert len(groups) == 5
    fresh = _plan(capsys, *argv)

    # humaneval: prompt 0 finished, 2 blocks (4 and 2 reference tokens; 30 s and 10 s of rules)
    group, other_group = groups[0], groups[1]
    assert group.dataset == "humaneval"
    folder = group.folder
    folder.mkdir(parents=True)
    atomic_write_text(folder / "replay.json", json.dumps(group.meta(), indent=2) + "\n")
    write_prompt(prompt_directory(folder, 0), _blocks((4, 30.0), (2, 10.0)),
                 {"prompt_id": "HumanEval/0", "index": 0, "new_tokens": 6, "target_calls": 2, "blocks": 2,
                  "trajectory_block_efficiency": 3.0, "seconds": 50.0})
    # another group's prompt being replayed (no done.json): neither finished nor measured
    other = prompt_directory(other_group.folder, 0)
    other.mkdir(parents=True)
    (other / "blocks.jsonl").write_text(json.dumps(_blocks((7, 500.0))[0]) + "\n")

    text = _plan(capsys, *argv)
    line, detail = _replay_line(text), _detail_line(text)
    # 3 tokens per block measured: ceil(32 / 3) = 11 blocks per prompt; 9 prompts left -> 99 blocks
    per_prompt = math.ceil(32 / 3.0)
    assert "10 prompts, 1 finished, 9 to replay, 99 blocks" in detail
    assert ("3.00 tokens per block, measured: 2 block(s) of this group here (1 group), measured: 2 block(s) of "
            "other groups of this replay (4 groups)") in detail
    assert "rules 20 s per block, mean of 2 finished replay block(s) here" in line
    rules = 99 * 20.0
    model = sum((g.settings.num_prompts - (g.dataset == "humaneval")) * speculative_prompt_seconds(
        CellSpec.of(g.run), pair_config_of(g.run), 7, 6, per_prompt) for g in groups)
    assert (f"est. {format_duration(model + rules)} (model calls {format_duration(model)} + rules "
            f"{format_duration(rules)};") in line
    # the model calls shrink (9 prompts left, 99 blocks instead of 10 and 100); the rules are now counted
    fresh_model = sum(2 * speculative_prompt_seconds(CellSpec.of(g.run), pair_config_of(g.run), 7, 6, 10)
                      for g in groups)
    assert f"(model calls {format_duration(fresh_model)} + rules 0 s;" in _replay_line(fresh)
    assert model < fresh_model

    # force=true replays every prompt again: none counted finished
    forced = _detail_line(_plan(capsys, *argv, "force=true"))
    assert "10 prompts, 0 finished, 10 to replay" in forced


def test_a_folder_with_other_replay_settings_is_not_counted(offline, capsys):
    out = offline / "results"
    argv = ["experiment=cpu_quick", *PINNED, f"output_dir={out}", "dataset=gsm8k"]
    (group,) = parse(argv)
    folder = group.folder
    folder.mkdir(parents=True)
    atomic_write_text(folder / "replay.json", json.dumps(group.meta() | {"draws": 99}) + "\n")
    write_prompt(prompt_directory(folder, 0), _blocks((5, 1.0)), {"index": 0, "new_tokens": 5, "blocks": 1})
    text = _plan(capsys, *argv)
    assert "1 dataset x 1 temperature x 2 prompts" in _replay_line(text)
    assert "2 prompts, 0 finished, 2 to replay" in _detail_line(text)
    assert "holds a replay with other settings (draws)" in text and "rules not estimated" in text


def test_no_replay_without_a_replay_block(offline, capsys):
    out = offline / "results"
    for argv in (["K=3"], ["experiment=ablation_K", "dataset=gsm8k"]):
        text = _plan(capsys, *argv, f"output_dir={out}")
        assert "Cells:" in text and "Replay" not in text and "Total:" not in text, argv
    # config.yaml's replay: block (datasets and temperatures null) is the replay of the dataset and
    # temperature chosen; it is planned only when the command line asks for it
    text = _plan(capsys, "replay.num_prompts=3", f"output_dir={out}")
    assert "1 dataset x 1 temperature x 3 prompts, blocks of K_max x L_max = 7 x 12" in _replay_line(text)
    assert "qwen25coder_1.5b_0.5b on cpu: 3 prompts" in _detail_line(text)


def test_replay_arguments_the_replay_refuses_are_said(offline, capsys):
    text = _plan(capsys, "experiment=cpu_quick", "replay.reference_K=0", f"output_dir={offline / 'results'}")
    assert "not planned, the replay refuses these arguments: replay.reference_K must be" in _replay_line(text)
    assert "Total:" not in text


def test_paper_main_plan_prints_its_replay_and_the_total(offline, capsys):
    text = _plan(capsys, "experiment=paper_main", f"output_dir={offline / 'results'}")
    line = _replay_line(text)
    assert "`python -m spectr_repro replay experiment=paper_main" in line
    assert "5 datasets x 3 temperatures x 100 prompts, blocks of K_max x L_max = 7 x 24" in line
    assert "model calls: cost model, A100-80GB (assumed, not measured)" in line
    detail = _detail_line(text)
    # the paper gives no sbv block efficiency: (12+1)/2 = 6.5, ceil(256 / 6.5) = 40 blocks per prompt
    assert "deepseek_33b_1.3b on cuda: 1,500 prompts, 0 finished, 1,500 to replay, 60,000 blocks" in detail
    total = _lines(text, "Total:")
    assert len(total) == 1
    hours = [float(v) for v in re.findall(r"([\d.]+) h\b", total[0])][:4]
    assert len(hours) == 4 and hours[0] == pytest.approx(sum(hours[1:]), abs=0.015)


def test_the_calibration_prices_the_replay_calls(offline, capsys, no_calibration):
    from spectr_repro.cost import Calibration, ForwardCosts, write_calibration
    from spectr_repro.cost.measure import plan_shapes

    argv = ["experiment=cpu_quick", *PINNED, "dataset=humaneval", f"output_dir={offline / 'results'}"]
    cfg = parse(argv)[0].run
    shapes = plan_shapes([1, 3, 7], [6], [32, 180], [1, 8])

    def calibration(scale):
        costs = {role: ForwardCosts(tuple((r, t, k, scale * (a + b * r * t)) for r, t, k in shapes[role]))
                 for role, a, b in (("target", 0.2, 0.007), ("draft", 0.1, 0.003))}
        return Calibration("cpu", "qwen25coder_1.5b_0.5b", cfg.dtype, "Test CPU", "2026-12-01",
                           False, costs["target"], costs["draft"], extra={"overhead_s_per_call": 0.01 * scale})

    from spectr_repro.replay.plan import plan_replays

    write_calibration(calibration(1.0))
    (once,) = plan_replays([(argv, "cpu_quick")], {})
    assert once.model_note == "calibrated on Test CPU, 2026-12-01" and once.model_seconds > 0
    assert "model calls: calibrated on Test CPU, 2026-12-01" in _replay_line(_plan(capsys, *argv))
    write_calibration(calibration(2.0))
    (twice,) = plan_replays([(argv, "cpu_quick")], {})
    assert twice.model_seconds == pytest.approx(2 * once.model_seconds, rel=1e-9)


def test_a_replay_experiment_is_planned_without_cells(offline, capsys):
    """replay_qwen has a replay: block and no grid: its plan is the replay alone (no base cell priced, which
    `sweep` would run and nobody asked for); an experiment with a grid keeps its cells (negative control)."""
    out = offline / "results"
    text = _plan(capsys, "experiment=replay_qwen", "replay.num_prompts=1", f"output_dir={out}")
    assert text.startswith("Plan: replay only") and "Cells:" not in text, text
    assert len(_lines(text, "Replay (shared blocks")) == 1 and "Total:" in text
    mixed = _plan(capsys, "experiment=cpu_quick,replay_qwen", "replay.num_prompts=1", f"output_dir={out}")
    assert "Cells:" in mixed and len(_lines(mixed, "Replay (shared blocks")) == 2, mixed


def test_the_rules_seconds_are_priced_at_each_temperature(offline, capsys):
    """Finished blocks at T = 0.1 took 2 s of rules, at T = 0.7 40 s (SpecTr's exact rho grows with T): each
    temperature's blocks left are priced at its own mean, not at the pooled 21 s."""
    out = offline / "results"
    argv = ["experiment=cpu_quick", *PINNED, f"output_dir={out}", "dataset=gsm8k", "temperature=0.1,0.7"]
    cold, hot = parse(argv)
    assert (cold.temperature, hot.temperature) == (0.1, 0.7)
    for group, tokens, seconds in ((cold, 2, 2.0), (hot, 8, 40.0)):
        group.folder.mkdir(parents=True)
        atomic_write_text(group.folder / "replay.json", json.dumps(group.meta(), indent=2) + "\n")
        write_prompt(prompt_directory(group.folder, 0), _blocks((tokens, seconds), (tokens, seconds)),
                     {"prompt_id": "gsm8k/0", "index": 0, "new_tokens": 2 * tokens, "target_calls": 2, "blocks": 2,
                      "trajectory_block_efficiency": float(tokens), "seconds": 50.0})
    line = _replay_line(_plan(capsys, *argv))
    assert "rules 21 s per block, mean of 4 finished replay block(s) here (by temperature: T=0.1 2 s, T=0.7 40 s)" \
        in line
    # one prompt left at each temperature: ceil(32 / 2) = 16 blocks at T = 0.1, ceil(32 / 8) = 4 at T = 0.7
    rules = 16 * 2.0 + 4 * 40.0
    assert f"+ rules {format_duration(rules)};" in line
    assert format_duration(rules) != format_duration((16 + 4) * 21.0)  # the pooled mean's price


def test_the_rules_seconds_are_those_of_this_machine_where_it_replayed_any(offline, capsys):
    """Two prompts of one group: one replayed on another CPU (rules 90 s a block), one on this machine's in this
    dtype (10 s a block). The blocks left are priced at this machine's 10 s, not at the pooled 50 s; with this
    machine's prompt removed (negative control) the other CPU's are all there is, and they are used."""
    out = offline / "results"
    argv = ["experiment=cpu_quick", *PINNED, f"output_dir={out}", "dataset=gsm8k", "temperature=0.4"]
    [group] = parse(argv)
    group.folder.mkdir(parents=True)
    atomic_write_text(group.folder / "replay.json", json.dumps(group.meta(), indent=2) + "\n")
    for index, (cpu, seconds) in enumerate((("another CPU", 90.0), (device_name("cpu"), 10.0))):
        write_prompt(prompt_directory(group.folder, index), _blocks((4, seconds), (4, seconds)),
                     {"prompt_id": f"gsm8k/{index}", "index": index, "new_tokens": 8, "target_calls": 2, "blocks": 2,
                      "trajectory_block_efficiency": 4.0, "seconds": 50.0,
                      "environment": {"device_name": cpu, "dtype": group.run.dtype}})
    line = _replay_line(_plan(capsys, *argv))
    assert (f"rules 10 s per block, mean of 2 finished replay block(s) here (replayed on this {device_name('cpu')} "
            f"in {group.run.dtype})") in line
    shutil.rmtree(prompt_directory(group.folder, 1))
    assert "rules 90 s per block, mean of 2 finished replay block(s) here)" in _replay_line(_plan(capsys, *argv))


@pytest.mark.parametrize("where", ["here", "another CPU"])
def test_the_model_calls_are_scaled_by_what_this_machines_prompts_took_over_their_price(offline, capsys, where):
    """One prompt of 2 blocks finished on this machine in this dtype, in 5 times what the cost model gives such a
    prompt (plus its 2 s of rules): the prompt left is priced at 5 times the cost model. Negative control: the same
    prompt replayed on another CPU scales nothing."""
    out = offline / "results"
    argv = ["experiment=cpu_quick", *PINNED, f"output_dir={out}", "dataset=gsm8k", "temperature=0.4"]
    [group] = parse(argv)
    cell, pair = CellSpec.of(group.run), pair_config_of(group.run)
    group.folder.mkdir(parents=True)
    atomic_write_text(group.folder / "replay.json", json.dumps(group.meta(), indent=2) + "\n")
    priced = speculative_prompt_seconds(cell, pair, 7, 6, 2)  # a prompt of 2 blocks
    cpu = device_name("cpu") if where == "here" else "another CPU"
    write_prompt(prompt_directory(group.folder, 0), _blocks((4, 1.0), (4, 1.0)),
                 {"prompt_id": "gsm8k/0", "index": 0, "new_tokens": 8, "target_calls": 2, "blocks": 2,
                  "trajectory_block_efficiency": 4.0, "seconds": 2.0 + 5 * priced,
                  "environment": {"device_name": cpu, "dtype": group.run.dtype}})
    line = _replay_line(_plan(capsys, *argv))
    unscaled = speculative_prompt_seconds(cell, pair, 7, 6, math.ceil(32 / 4.0))  # the prompt left
    scale = 5.0 if where == "here" else 1.0
    assert f"(model calls {format_duration(scale * unscaled)} + rules" in line, line
    assert ("x 5.00, what 1 prompt(s) finished here took over what it gives them" in line) == (where == "here")


def test_a_bucket_the_replay_would_refuse_is_priced_and_named(offline, capsys):
    """context_qwen in float32 on a 21 GB machine: the 16K bucket needs ~18.1 GiB (weights ~9 + KV caches on 7 rows
    ~9) where 85 % of 21e9 bytes (16.6 GiB) are usable, so the replay would refuse it before loading; the plan still
    prices all four buckets and says so for that one alone (the check the replay makes). In bfloat16 (half the
    bytes) every bucket fits: no note (the control)."""
    argv = ["experiment=context_qwen", f"output_dir={offline / 'results'}", "hardware.memory_gb=21"]
    text = _plan(capsys, *argv, "hardware.dtype=float32")
    assert "4 datasets x 1 temperature x 8 prompts" in _replay_line(text)
    notes = _lines(text, "note: the replay refuses")
    assert len(notes) == 1 and "refuses longcode_16k here" in notes[0], text
    assert "hardware.memory_gb); the largest bucket that fits is dataset=longcode_8k" in notes[0]
    assert not _lines(_plan(capsys, *argv, "hardware.dtype=bfloat16"), "note: the replay refuses")
