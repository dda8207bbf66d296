"""`replay.batch_prompts`: prompts replayed together through the engine's batched path give each prompt the blocks
the one-prompt replay gives it (tiny random pair, float32, CPU).

Each prompt keeps its own seeds (engine seed and the replay's draws, ``seed * 7919 + 17``) and its own
reference trajectory, so its trajectory and its blocks' values do not depend on its batch mates. The batched
forwards round differently from batch 1 (float32, ~1e-7 relative on each probability), so the exact values agree
to float tolerance, not bit for bit: 8.8e-6 tokens at most on these prompts (2026-12-03), checked against
atol = rtol = 1e-5 (a value is 1 to L + 1 tokens). Monte-Carlo values (the release, forced to its sampler by
``replay.sampled``) and sbvf's control variate draw with the same seeds in the same order: a draw could move only
if its uniform fell within ~1e-7 of a boundary, which the fixed seeds below do not (a moved draw would shift a
value by at least 1 / (draws x row groups) = 0.25, far outside the tolerance, and also every later block of the
trajectory). Negative control: another prompt's blocks fail the same comparison.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spectr_repro.analysis.replay import read_summaries
from spectr_repro.cost import Calibration, CellSpec, ForwardCosts, calibrated_prompt_seconds, write_calibration
from spectr_repro.cost.calibration import CALIBRATION_ENV_VAR
from spectr_repro.cost.measure import plan_shapes
from spectr_repro.replay import driver
from spectr_repro.replay.driver import main, parse, prompt_state
from spectr_repro.replay.plan import plan_replays

# sd, spectr, sbv: exact; sbvf: control variate; spectr_gbv: Monte-Carlo (replay.sampled).
GRID = ["model_pair=tiny_random", "dataset=humaneval", "temperature=0.7", "logger=disabled",
        "method=sd,spectr,sbv,sbvf,spectr_gbv", "replay.sampled=[spectr_gbv]", "K=1,2", "L=2,3",
        "replay.reference_K=2", "replay.reference_L=3", "replay.draws=2", "max_new_tokens=10"]
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def prompt_folders(output: Path) -> list[Path]:
    return sorted(output.glob("default/replay/*/prompts/*"))


def blocks_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "blocks.jsonl").read_text().splitlines()]


def differences(alone: list[dict], together: list[dict]) -> list[str]:
    """Where two prompts' blocks differ beyond float tolerance ([] when they are the same blocks): block count,
    the trajectory (reference_tokens, output_position), each value's cell and estimator, and its tokens."""
    if len(alone) != len(together):
        return [f"{len(alone)} blocks against {len(together)}"]
    found = []
    for number, (a, b) in enumerate(zip(alone, together)):
        for key in ("iteration", "reference_tokens", "output_position"):
            if a[key] != b[key]:
                found.append(f"block {number}: {key} {a[key]} != {b[key]}")
        for x, y in zip(a["values"], b["values"], strict=True):
            if x[:3] != y[:3] or x[4:] != y[4:]:
                found.append(f"block {number}: cell {x} != {y}")
            elif not math.isclose(x[3], y[3], rel_tol=TOLERANCE, abs_tol=TOLERANCE):
                found.append(f"block {number}: {x[:3]} ({x[4]}) {x[3]} != {y[3]}")
    return found


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """The same three prompts replayed one at a time (batch_prompts=1) and together (batch_prompts=3)."""
    root = tmp_path_factory.mktemp("batched_replay")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECTR_REPRO_RUNNERS", str(root / "runners"))
        for size in (1, 3):
            assert main([*GRID, "num_prompts=3", f"replay.batch_prompts={size}", f"output_dir={root / str(size)}"]) == 0
    return {size: prompt_folders(root / str(size)) for size in (1, 3)}


def test_batched_replay_gives_each_prompt_its_one_prompt_blocks(replays):
    alone, together = replays[1], replays[3]
    assert [f.name for f in alone] == [f.name for f in together] == ["0000", "0001", "0002"]
    estimators = set()
    for a, b in zip(alone, together):
        blocks = blocks_of(a)
        assert len(blocks) >= 2 and differences(blocks, blocks_of(b)) == []
        estimators |= {value[4] for block in blocks for value in block["values"]}
    assert estimators == {"exact", "control_variate", "monte_carlo"}  # every kind of value was compared


def test_another_prompts_blocks_fail_the_same_check(replays):
    """Negative control: the check above tells prompts apart (their blocks differ beyond the tolerance)."""
    alone, together = replays[1], replays[3]
    for shift in (1, 2):
        for i, folder in enumerate(alone):
            assert differences(blocks_of(folder), blocks_of(together[(i + shift) % 3])) != []
    # ... and a value nudged by ten times the tolerance fails it too.
    blocks = blocks_of(alone[0])
    nudged = json.loads(json.dumps(blocks))
    nudged[-1]["values"][0][3] += 10 * TOLERANCE * (1 + nudged[-1]["values"][0][3])
    assert len(differences(blocks, nudged)) == 1


def test_done_json_records_the_batch_and_the_prompts_share_of_its_time(replays):
    for folder in replays[3]:
        done = json.loads((folder / "done.json").read_text())
        assert done["batch_prompts"] == 3 and prompt_state(folder).status == "finished"
        assert done["seconds"] == pytest.approx(done["batch_seconds"] / 3)
        assert done["blocks"] == len(blocks_of(folder))
    for folder in replays[1]:  # batch_prompts=1 writes today's records
        assert "batch_prompts" not in json.loads((folder / "done.json").read_text())


def test_the_summary_reads_a_batched_replay_as_any_other(replays):
    for prompts in replays.values():
        table, _ = read_summaries(prompts[0].parents[2])
        assert (table.query("dataset == 'average'")["prompts"] == 3).all()


def test_a_resumed_group_replays_only_the_prompts_left_in_one_batch(replays, tmp_path, capsys, monkeypatch):
    """Prompts 0 and 1 finished before (one at a time); batch_prompts=4 over 4 prompts replays 2 and 3 together,
    with the blocks the one-prompt replay gives prompt 2, and leaves 0 and 1 untouched."""
    batches = []
    real = driver.replay_prompts
    monkeypatch.setattr(driver, "replay_prompts", lambda pair, prompts, *args: batches.append(len(prompts))
                        or real(pair, prompts, *args))
    assert main([*GRID, "num_prompts=2", f"output_dir={tmp_path}"]) == 0
    assert batches == [1, 1]  # one prompt at a time
    batches.clear()
    before = {f: (f / "blocks.jsonl").stat().st_mtime_ns for f in prompt_folders(tmp_path)}
    capsys.readouterr()
    assert main([*GRID, "num_prompts=4", "replay.batch_prompts=4", f"output_dir={tmp_path}"]) == 0
    assert "2 prompt(s) replayed, 2 finished earlier" in capsys.readouterr().out
    assert batches == [2]
    folders = prompt_folders(tmp_path)
    assert all((f / "blocks.jsonl").stat().st_mtime_ns == t for f, t in before.items())
    assert [json.loads((f / "done.json").read_text()).get("batch_prompts") for f in folders] == [None, None, 2, 2]
    assert differences(blocks_of(replays[1][2]), blocks_of(folders[2])) == []


def test_a_stopped_batch_writes_none_of_its_prompts_and_releases_their_claims(tmp_path, capsys, monkeypatch):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "replay_prompts", stopped)
    assert main([*GRID, "num_prompts=3", "replay.batch_prompts=3", f"output_dir={tmp_path}"]) == 130
    err = capsys.readouterr().err
    assert "the 3 prompts being replayed together" in err and "kept 0 prompt(s)" in err and "Traceback" not in err
    assert not list(tmp_path.glob("default/replay/*/prompts/*/*.json*"))  # no blocks, no done.json, no claim


@pytest.mark.parametrize("value", ["0", "-2", "a", "1.5", "true", "[2]"])
def test_bad_batch_prompts_is_one_message_and_exit_2_before_loading(tmp_path, capsys, value):
    assert main([*GRID, "num_prompts=2", f"replay.batch_prompts={value}", f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "replay.batch_prompts must be an integer >= 1" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_plan_prices_a_batch_of_prompts_at_b_times_the_rows(tmp_path, monkeypatch):
    """`plan` with replay.batch_prompts=4 over 9 prompts: two batches of 4 and one prompt alone, each call over
    B x K_max rows (the calibrated cost model's batched price); B = 1 prices 9 prompts alone, which costs more when a
    forward has a fixed part (here 0.2 s target, 0.1 s draft). Without a calibration the modelled forwards (pair
    shapes, cost/shapes.py, 2026-12-05) price the batch too: reading the weights once for B x K_max rows is cheaper
    than B times alone."""
    monkeypatch.setenv(CALIBRATION_ENV_VAR, str(tmp_path / "calibration.json"))
    # a stated memory (64 GB): the batch check must not depend on what else holds this machine's memory
    argv = ["experiment=replay_qwen", "dataset=humaneval", "replay.num_prompts=9", f"output_dir={tmp_path / 'out'}",
            "hardware.memory_gb=64"]

    def model_seconds(batch: int):
        (plan,) = plan_replays([([*argv, f"replay.batch_prompts={batch}"], "replay_qwen")], {})
        return plan

    modelled = [model_seconds(batch) for batch in (1, 4)]
    assert 0 < modelled[1].model_seconds < modelled[0].model_seconds
    assert "4 prompts a batch (4 x 7 rows a call)" in modelled[1].model_note and "batch" not in modelled[0].model_note

    cfg = parse(argv)[0].run
    shapes = plan_shapes([1, 3, 5, 7], [6, 12], [512, 2048], [1, 4])
    costs = {role: ForwardCosts(tuple((r, t, k, a + b * r * t) for r, t, k in shapes[role]))
             for role, a, b in (("target", 0.2, 0.007), ("draft", 0.1, 0.003))}
    calibration = Calibration("cpu", "qwen25coder_1.5b_0.5b", cfg.dtype, "Test CPU", "2026-12-03",
                              False, costs["target"], costs["draft"], extra={"overhead_s_per_call": 0.01})
    write_calibration(calibration)
    alone, batched = model_seconds(1), model_seconds(4)
    assert "4 prompts a batch" in batched.model_note
    iterations = batched.groups[0].iterations
    assert batched.groups[0].to_replay == 9 and alone.groups[0].iterations == iterations
    price = {size: calibrated_prompt_seconds(CellSpec.of(cfg), calibration, 7, 12, iterations, size) for size in (1, 4)}
    assert alone.model_seconds == pytest.approx(9 * price[1], rel=1e-9)
    assert batched.model_seconds == pytest.approx(2 * price[4] + price[1], rel=1e-9)
    # a batch of 4 saves, per call, the fixed parts of 3 prompts' forwards (0.2 s the target's, 0.1 s each of the
    # draft's 12) and their overhead per call (0.01 s, charged once per call by the cost model), x 2 batches
    saved = 2 * 3 * iterations * (0.2 + 12 * 0.1 + 0.01)
    assert alone.model_seconds - batched.model_seconds == pytest.approx(saved, rel=1e-6)
