"""Budgeted and killed replays on the tiny random pair: ``replay.budget_minutes`` stops at a batch boundary (exit 0,
the command that continues), a SIGKILL mid-run resumes with every prompt finished exactly once (the dead runner's
claim taken over), and a bad budget is one message before any model loads."""

from __future__ import annotations

import re
import shlex
import signal

import pytest

from spectr_repro.environment import device_name
from spectr_repro.replay.driver import main, prompt_directory, prompt_state, recorded_batch_seconds, write_prompt
from tests.process_helpers import stop_once_written
from tests.replay.test_replay_safety import BASE, prompt_folders, subprocess_replay


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


BUDGET = re.compile(r"budget of (\S+) min reached: kept (\d+) prompt\(s\) this run, (\d+) finished before, (\d+) left; "
                    r"continue with: python -m spectr_repro replay (.*)$")


def test_a_tiny_budget_stops_after_the_first_batch_and_the_printed_command_finishes(tmp_path, capsys):
    arguments = [*BASE, "num_prompts=3", "max_new_tokens=6", "replay.batch_prompts=2", "replay.budget_minutes=0.0001",
                 f"output_dir={tmp_path}"]
    assert main(arguments) == 0
    out = capsys.readouterr().out.strip().splitlines()
    stopped = BUDGET.match(out[-1])
    assert stopped is not None, out[-1]
    assert stopped.groups()[:4] == ("0.0001", "2", "0", "1")  # one batch of two prompts, then the budget
    assert shlex.split(stopped.group(5)) == arguments  # the same command line
    assert [prompt_state(f).status for f in prompt_folders(tmp_path)] == ["finished", "finished"]
    assert list((tmp_path / "default" / "replay").glob("replay_summary.csv"))  # the summary of what was kept

    assert main(shlex.split(stopped.group(5))) == 0  # the last batch (one prompt) fits: no budget line
    out = capsys.readouterr().out
    assert "1 prompt(s) replayed, 2 finished earlier" in out and "budget of" not in out
    assert [prompt_state(f).status for f in prompt_folders(tmp_path)] == ["finished"] * 3


@pytest.mark.slow  # a replay in its own process, killed, then resumed
def test_a_replay_killed_mid_run_resumes_with_every_prompt_done_exactly_once(tmp_path, capsys):
    arguments = [*BASE, "num_prompts=4", "max_new_tokens=40"]
    process = subprocess_replay(tmp_path, arguments)
    stop_once_written(process, tmp_path, "default/replay/*/prompts/0000/done.json", signal.SIGKILL, -signal.SIGKILL)
    kept = {f.name: (f / "done.json").read_bytes() for f in prompt_folders(tmp_path)
            if prompt_state(f).status == "finished"}
    assert "0000" in kept and len(kept) < 4, "killed after the first prompt, before the last"
    # SIGKILL runs no cleanup: the claim on the prompt being replayed stays behind, held by a dead pid (save in the
    # microseconds between one prompt's release and the next one's claim; tests/test_units.py takes such a claim
    # over deterministically).

    assert main([*arguments, f"output_dir={tmp_path}"]) == 0  # takes the dead runner's claim over
    captured = capsys.readouterr()
    assert f"{4 - len(kept)} prompt(s) replayed, {len(kept)} finished earlier" in captured.out
    assert "Traceback" not in captured.err
    folders = prompt_folders(tmp_path)
    assert [f.name for f in folders] == ["0000", "0001", "0002", "0003"]
    assert all(prompt_state(f).status == "finished" for f in folders)
    for name, done in kept.items():  # the prompts finished before the kill were not replayed again
        assert next(tmp_path.glob(f"default/replay/*/prompts/{name}/done.json")).read_bytes() == done
    assert not list(tmp_path.glob("default/replay/*/prompts/*/claim.json"))  # every claim released


@pytest.mark.parametrize("value", ["-1", "abc", "0"])
def test_a_bad_budget_is_exit_2_with_one_message_before_any_model_loads(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setattr("spectr_repro.launch.pairs.PairCache.pair", lambda *a, **k: pytest.fail("pair loaded"))
    assert main([*BASE, "num_prompts=2", f"replay.budget_minutes={value}", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: replay.budget_minutes must be a number of minutes > 0") and err.count("\n") == 1
    assert not (tmp_path / "default").exists()


def test_a_folders_recorded_batches_on_this_machine_are_what_the_budget_expects_of_it(tmp_path):
    """The budget's expectation of a folder it has not timed this run: the median of its finished batches' wall
    times, counting each batch once and only those replayed at this batch size, on this device's model and dtype
    (a record from another machine or dtype says nothing of this one)."""
    here = device_name("cpu")

    def finished(index, batch, seconds, name=here, dtype="float32", size=2):
        write_prompt(prompt_directory(tmp_path, index), [{"block": 0}], {
            "index": index, "batch": batch, "batch_prompts": size, "batch_seconds": seconds, "seconds": seconds / size,
            "environment": {"device_name": name, "dtype": dtype}})

    finished(0, [0, 1], 100.0)
    finished(1, [0, 1], 100.0)  # the same batch: counted once
    finished(2, [2, 3], 300.0)
    finished(3, [2, 3], 300.0)
    finished(4, [4, 5], 200.0)
    finished(6, [6, 7], 9000.0, name="another CPU")
    finished(8, [8, 9], 9000.0, dtype="bfloat16")
    finished(10, [10], 50.0, size=1)  # a batch of one records its own "seconds"
    assert recorded_batch_seconds(tmp_path, 12, 2, "cpu", "float32") == 200.0  # median of 100, 300, 200
    assert recorded_batch_seconds(tmp_path, 12, 1, "cpu", "float32") == 50.0
    assert recorded_batch_seconds(tmp_path, 12, 2, "cpu", "float16") is None
    assert recorded_batch_seconds(tmp_path / "absent", 12, 2, "cpu", "float32") is None
