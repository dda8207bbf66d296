"""hardware.batch_prompts: BE from batches of prompts, speed-up from the prompts decoded alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spectr_repro.errors import UsageError
from spectr_repro.runner.batched import split_prompts
from spectr_repro.runner.cli import main_sweep
from spectr_repro.settings import HardwareSettings, read_settings

# gbv (single draft, carry-over state) at K=1, sbv at K=1 and 2; gbv at K=2 is skipped.
SWEEP = ["model_pair=tiny_random", "dataset=gsm8k", "method=gbv,sbv", "K=1,2", "L=3", "num_prompts=4",
         "max_new_tokens=8", "temperature=0.7", "logger=disabled"]


def hardware(**values) -> HardwareSettings:
    return read_settings(HardwareSettings, values, "hardware")


def split_of(settings: HardwareSettings, num_prompts: int):
    return split_prompts(settings.batch_prompts, settings.timed_prompts, num_prompts)


def test_split_prompts():
    assert split_of(hardware(batch_prompts=1, timed_prompts=3), 4).timed == (0, 1, 2, 3)
    split = split_of(hardware(batch_prompts=3, timed_prompts=2), 7)
    assert split.timed == (0, 1) and split.batches == ((2, 3, 4), (5, 6)) and split.batch_prompts == 3
    assert split_of(hardware(batch_prompts=4), 2).batches == ((0, 1),)  # timed_prompts defaults to 0
    assert split_of(hardware(), 2).timed == (0, 1)  # a hardware config from before batching: all timed
    assert split_of(hardware(batch_prompts=None, timed_prompts=None), 2).timed == (0, 1)  # null: the defaults
    assert split_of(hardware(batch_prompts=2, timed_prompts=9), 3).timed == (0, 1, 2)
    # bad counts are refused at the door (settings.HardwareSettings), naming the key
    for bad in ({"batch_prompts": 0}, {"batch_prompts": 2.5}, {"batch_prompts": 2, "timed_prompts": -1}):
        with pytest.raises(UsageError, match="^hardware\\.(batch|timed)_prompts must be an integer"):
            hardware(**bad)


def by_method(root: Path) -> dict[str, tuple[dict, list[dict]]]:
    found = {}
    for path in root.glob("default/cells/*/summary.json"):
        summary = json.loads(path.read_text())
        records = [json.loads(line) for line in (path.parent / "records.jsonl").read_text().splitlines()]
        found[summary["method"], summary["K"]] = (summary, records)
    return found


@pytest.fixture(scope="module")
def alone_and_batched(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched")
    assert main_sweep([*SWEEP, f"output_dir={root / 'alone'}"]) == 0
    assert main_sweep([*SWEEP, "hardware.batch_prompts=3", "hardware.timed_prompts=1",
                       f"output_dir={root / 'batched'}"]) == 0
    return by_method(root / "alone"), by_method(root / "batched")


def test_batched_cells_give_the_batch_one_block_efficiency(alone_and_batched):
    """Same seeds, float32 pair: every prompt's tokens, target calls and accepted lengths are those of the
    batch-1 run, so the cell's BE and acceptance profile agree exactly."""
    alone, batched = alone_and_batched
    assert set(alone) == set(batched) == {("ar", 1), ("gbv", 1), ("sbv", 1), ("sbv", 2)}
    for method in alone:
        (s1, r1), (sb, rb) = alone[method], batched[method]
        assert [r["prompt_id"] for r in r1] == [r["prompt_id"] for r in rb]
        for key in ("new_tokens", "target_calls", "accepted_lengths", "completion"):
            assert [r[key] for r in r1] == [r[key] for r in rb], (method, key)
        assert sb["block_efficiency"] == s1["block_efficiency"]
        assert sb["acceptance_by_position"] == s1["acceptance_by_position"]
        assert sb["num_prompts"] == s1["num_prompts"] == 4
        assert sb["cell_id"] != s1["cell_id"]  # batch_prompts is part of the cell's identity


def test_only_prompts_decoded_alone_are_timed(alone_and_batched):
    """Prompt 0 is decoded alone and timed; prompts 1-3, decoded in one batch, carry no wall time, so the
    speed-up and tokens/s come from prompt 0 only and the batch's time is recorded apart."""
    _, batched = alone_and_batched
    ar_times = {r["prompt_id"]: r["wall_time_s"] for r in batched["ar", 1][1]}
    for summary, records in batched.values():
        assert [r["batch_prompts"] for r in records] == [1, 3, 3, 3]
        assert records[0]["wall_time_s"] > 0
        assert all(r["wall_time_s"] is None and r["ar_wall_time_s"] is None for r in records[1:])
        assert summary["batch_prompts"] == 3 and summary["timed_prompts"] == 1
        assert summary["batched_wall_time_s"] > 0
        assert summary["wall_time_s"] == records[0]["wall_time_s"]
        assert summary["ar_wall_time_s"] == ar_times[records[0]["prompt_id"]]
        assert summary["speedup"] == pytest.approx(summary["ar_wall_time_s"] / summary["wall_time_s"])
        assert summary["tokens_per_s"] == pytest.approx(records[0]["new_tokens"] / records[0]["wall_time_s"])


def test_batch_one_cells_are_timed_as_before(alone_and_batched):
    alone, _ = alone_and_batched
    for summary, records in alone.values():
        assert summary["batch_prompts"] == 1 and summary["timed_prompts"] == 4
        assert summary["batched_wall_time_s"] == 0.0
        assert all(r["batch_prompts"] == 1 and r["wall_time_s"] > 0 for r in records)
        assert not math.isnan(summary["speedup"])
