"""Faults injected into `python -m spectr_repro replay` on the tiny random pair: a damaged record, a kill between a
prompt's records and its done.json, a full disk, two runners on one folder, SIGTERM and SIGINT; and the checks
before any model loads. Each must end in one message (or a clean resume), never a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from spectr_repro.analysis.replay import read_blocks, write_summaries
from spectr_repro.replay import driver
from spectr_repro.replay.driver import main, prompt_state
from tests.process_helpers import command_process, stop_once_written

BASE = ["model_pair=tiny_random", "hardware=cpu", "dataset=humaneval", "temperature=0.7", "logger=disabled",
        "method=sd,sbv", "K=1,2", "L=2", "replay.reference_K=2", "replay.reference_L=2", "replay.draws=1"]
SMALL = [*BASE, "num_prompts=2", "max_new_tokens=6"]


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def prompt_folders(output: Path) -> list[Path]:
    return sorted(output.glob("default/replay/*/prompts/*"))


def blocks_text(folder: Path) -> list[dict]:
    """A prompt's blocks without their timings (rule_seconds: the one field a rerun may change)."""
    return [{k: v for k, v in json.loads(line).items() if k != "rule_seconds"}
            for line in (folder / "blocks.jsonl").read_text().splitlines()]


def subprocess_replay(output: Path, arguments: list[str], prelude: str = "") -> subprocess.Popen:
    """The replay command in its own process (``prelude``: Python run first, e.g. to inject a fault)."""
    return command_process("spectr_repro.replay.driver", output, arguments, prelude)


def test_a_finished_replay_records_what_its_prompts_hold(tmp_path):
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    folders = prompt_folders(tmp_path)
    assert len(folders) == 2
    for folder in folders:
        done = json.loads((folder / "done.json").read_text())
        text = (folder / "blocks.jsonl").read_text()
        assert done["records"]["blocks.jsonl"]["lines"] == len(text.splitlines()) > 0
        assert prompt_state(folder).status == "finished"


def test_a_damaged_record_is_named_left_out_set_aside_and_recomputed(tmp_path, capsys):
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    damaged, intact = prompt_folders(tmp_path)
    before = blocks_text(damaged)
    text = (damaged / "blocks.jsonl").read_text()
    cut = text.index("\n") + 30  # cut mid-line in the second line, as a crash or a bad copy would
    (damaged / "blocks.jsonl").write_text(text[:cut])
    capsys.readouterr()

    # The summary and the report's reader name the file and the line and build from the rest.
    frame, left_out = read_blocks(tmp_path / "default" / "replay")
    assert len(left_out) == 1 and f"{damaged / 'blocks.jsonl'}:2:" in left_out[0], left_out
    assert set(frame["prompt_id"]) == {json.loads((intact / "done.json").read_text())["prompt_id"]}
    digest = write_summaries(tmp_path / "default" / "replay", resamples=50)
    assert "left out prompt 0000" in digest

    # The replay on the same folder names it, sets it aside (never deleted) and computes it again.
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert f"{damaged / 'blocks.jsonl'}:2:" in captured.err and "set aside" in captured.err
    assert "1 prompt(s) replayed, 1 finished earlier" in captured.out
    aside = list((damaged.parent.parent / "set_aside").glob("0000-*/blocks.jsonl"))
    assert len(aside) == 1 and aside[0].read_text() == text[:cut]
    assert prompt_state(damaged).status == "finished" and blocks_text(damaged) == before


@pytest.mark.slow  # replays in processes of their own (model load each time)
def test_a_kill_between_the_records_and_done_json_is_found_and_recomputed(tmp_path, capsys):
    prelude = """
import os, signal
import spectr_repro.units as units
real = units.atomic_write_text
def dying(path, text):
    if path.name == "done.json" and path.parent.name == "0001":
        os.kill(os.getpid(), signal.SIGKILL)  # blocks.jsonl is written, done.json never will be
    real(path, text)
units.atomic_write_text = dying  # the one store writes every unit's files
"""
    process = subprocess_replay(tmp_path, SMALL, prelude)
    process.communicate(timeout=600)
    assert process.returncode == -signal.SIGKILL
    killed = prompt_folders(tmp_path)[1]
    assert prompt_state(killed).status == "partial"

    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    captured = capsys.readouterr()
    assert f"{killed / 'blocks.jsonl'}: written without its done.json" in captured.err
    assert "1 prompt(s) replayed, 1 finished earlier" in captured.out and "Traceback" not in captured.err
    assert len(list((killed.parent.parent / "set_aside").glob("0001-*/blocks.jsonl"))) == 1
    assert prompt_state(killed).status == "finished"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MB tmpfs (root only: skipped with the reason where mounting is not allowed)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte (unbuffered writes); returns the filler file."""
    filler = folder / "filler"
    handle = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        for size in (65536, 1):
            try:
                while os.write(handle, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(handle)
    return filler


def test_a_full_disk_stops_with_one_message_and_keeps_the_finished_prompts(tmp_path, small_tmpfs, monkeypatch,
                                                                            capsys):
    real = driver.replay_prompts
    calls = []

    def disk_full_after_the_first(*args, **kwargs):
        calls.append(1)
        result = real(*args, **kwargs)
        if len(calls) == 2:
            fill(small_tmpfs)  # the second prompt is computed, its records cannot be written
        return result

    monkeypatch.setattr(driver, "replay_prompts", disk_full_after_the_first)
    assert main([*SMALL, f"output_dir={small_tmpfs / 'out'}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "No space left on device" in err, err
    assert "cannot write prompt 1" in err and "finished prompts are kept" in err
    first = prompt_folders(small_tmpfs / "out")[0]
    second = first.parent / "0001"
    assert prompt_state(first).status == "finished" and prompt_state(second).status == "absent"
    assert not list(first.parent.glob("*/.*tmp"))  # no half-written file left behind

    (small_tmpfs / "filler").unlink()
    monkeypatch.setattr(driver, "replay_prompts", real)
    assert main([*SMALL, f"output_dir={small_tmpfs / 'out'}"]) == 0
    assert "1 prompt(s) replayed, 1 finished earlier" in capsys.readouterr().out


def replayed_count(output: str) -> int:
    return int(re.search(r"(\d+) prompt\(s\) replayed", output).group(1))


@pytest.mark.slow  # replays in processes of their own (model load each time)
def test_two_runners_on_one_folder_replay_each_prompt_once(tmp_path):
    arguments = [*BASE, "num_prompts=4", "max_new_tokens=8"]
    runners = [subprocess_replay(tmp_path, arguments) for _ in range(2)]
    outputs = [runner.communicate(timeout=600) for runner in runners]
    assert [runner.returncode for runner in runners] == [0, 0], outputs
    assert all("Traceback" not in err for _, err in outputs)
    assert sum(replayed_count(out) for out, _ in outputs) == 4
    folders = prompt_folders(tmp_path)
    assert len(folders) == 4 and all(prompt_state(f).status == "finished" for f in folders)
    assert not list(tmp_path.glob("default/replay/*/prompts/*/claim.json"))  # every claim released


@pytest.mark.slow  # a replay in its own process, stopped, then resumed
@pytest.mark.parametrize("sent, status, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_stop_by_signal_says_what_is_kept_and_how_to_resume(tmp_path, capsys, sent, status, name):
    arguments = [*BASE, "num_prompts=3", "max_new_tokens=40"]
    process = subprocess_replay(tmp_path, arguments)
    message = stop_once_written(process, tmp_path, "default/replay/*/prompts/0000/done.json", sent, status)
    kept = re.search(rf"stopped by {name}.*: kept (\d+) prompt\(s\) replayed in this run and 0 finished before, "
                     r"in .*; rerun the same command to replay the (\d+) prompt\(s\) left\.", message)
    assert kept is not None, message
    assert int(kept.group(1)) + int(kept.group(2)) == 3

    assert main([*arguments, f"output_dir={tmp_path}"]) == 0
    kept_count = int(kept.group(1))
    assert f"{3 - kept_count} prompt(s) replayed, {kept_count} finished earlier" in capsys.readouterr().out
    assert all(prompt_state(f).status == "finished" for f in prompt_folders(tmp_path))


def test_a_replay_written_before_done_json_vouched_for_its_blocks_still_reports(tmp_path, capsys):
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    for folder in prompt_folders(tmp_path):  # as the replays of 2026-12-02 wrote them
        done = json.loads((folder / "done.json").read_text())
        del done["records"]
        (folder / "done.json").write_text(json.dumps(done))
    capsys.readouterr()
    frame, notes = read_blocks(tmp_path / "default" / "replay")
    assert frame["prompt_id"].nunique() == 2
    assert len(notes) == 1 and "2 prompt(s)" in notes[0] and "unverified" in notes[0]
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    captured = capsys.readouterr()
    assert "0 prompt(s) replayed, 2 finished earlier" in captured.out
    assert captured.err.count("unverified") == 1  # said once, not per prompt


def test_an_unreadable_replay_json_is_one_message(tmp_path, capsys):
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 0
    meta = next(tmp_path.glob("default/replay/*/replay.json"))
    meta.write_text('{"model_pair": ')
    capsys.readouterr()
    assert main([*SMALL, f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and str(meta) in err and "Traceback" not in err
    assert "left out" in read_blocks(tmp_path / "default" / "replay")[1][0]


def test_the_recursion_room_lets_sbv_walk_a_block_longer_than_the_default_limit():
    """sbv's exact law walks a block position by position: L = 1500 needs more than Python's 1000 frames."""
    import torch

    from spectr_repro.replay.core import block_estimates

    K, L, V = 2, 1500, 8
    generator = torch.Generator().manual_seed(0)
    draft_probs = torch.softmax(torch.randn(K, L, V, generator=generator), -1)
    target_probs = torch.softmax(torch.randn(K, L + 1, V, generator=generator), -1)
    row = torch.multinomial(draft_probs[0], 1, generator=generator).view(1, L)
    draft_tokens = row.expand(K, L).clone()  # identical rows: the walk goes all the way down
    with pytest.raises(RecursionError):
        block_estimates(draft_tokens, draft_probs, target_probs, ["sbv"], [2], [L], 1, torch.Generator())
    with driver.recursion_room(L):
        (estimate,) = block_estimates(draft_tokens, draft_probs, target_probs, ["sbv"], [2], [L], 1,
                                      torch.Generator())
    assert 1 - 1e-9 <= estimate.tokens <= L + 1 + 1e-9  # E[tau + 1]: at least the one token every block emits

