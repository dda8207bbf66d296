"""Budgeted and killed replays on the tiny random pair: ``replay.budget_minutes`` stops at a batch boundary (exit 0,
the command that continues), a SIGKILL mid-run resumes with every prompt finished exactly once (the dead runner's
claim taken over), and a bad budget is one message before any model loads."""

from __future__ import annotations

import json
import re
import shlex
import signal

import pytest

from spectr_repro.replay.driver import main, prompt_state, write_prompt
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



def _slow_down_the_records(folder):
    """Every finished prompt of a group folder, its blocks' rules said to have taken 100,000 s each (the records
    rewritten with their done files, so they stay finished and vouched for)."""
    for prompt in sorted(folder.glob("prompts/*")):
        done = json.loads((prompt / "done.json").read_text())
        lines = (prompt / "blocks.jsonl").read_text().splitlines()
        blocks = [{**json.loads(line), "rule_seconds": 1e5} for line in lines]
        write_prompt(prompt, blocks, {k: v for k, v in done.items() if k != "records"})


@pytest.mark.parametrize("slow", [True, False])
def test_a_group_the_plan_prices_past_the_budget_is_not_started(tmp_path, capsys, slow):
    """Two groups (T = 0.1 and 0.7), one prompt of each finished earlier. With the T = 0.7 group's records saying
    its blocks' rules take 100,000 s, a 60-min budget replays T = 0.1's next prompt (seconds) and stops before
    T = 0.7's: the plan prices that batch at days, though the longest batch this run is seconds. Negative control
    (records left as they are): the same budget replays both."""
    arguments = [*(a for a in BASE if a != "temperature=0.7"), "temperature=0.1,0.7", "max_new_tokens=6",
                 f"output_dir={tmp_path}"]
    assert main([*arguments, "num_prompts=1"]) == 0
    hot = next((tmp_path / "default" / "replay").glob("*__T0.7__*"))
    if slow:
        _slow_down_the_records(hot)
    capsys.readouterr()
    assert main([*arguments, "num_prompts=2", "replay.budget_minutes=60"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    stopped = BUDGET.match(out[-1])
    if slow:
        assert stopped is not None and stopped.groups()[1:4] == ("1", "2", "1"), out[-1]
        assert not (hot / "prompts" / "0001" / "done.json").exists()
    else:
        assert stopped is None and "2 prompt(s) replayed, 2 finished earlier" in out[-1], out[-1]
        assert prompt_state(hot / "prompts" / "0001").status == "finished"
