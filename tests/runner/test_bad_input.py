"""Bad input: one clear message on stderr, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectr_repro.runner.cli import main_run, main_sweep

COMMON = ["model_pair=tiny_random", "dataset=humaneval", "logger=disabled", "num_prompts=1",
          "max_new_tokens=4"]


@pytest.mark.parametrize("command, argv, message", [
    (main_run, ["method=spectr_gvb"], "unknown method 'spectr_gvb'. Did you mean spectr_gbv"),
    (main_sweep, ["dataset=gsm8k,humaneva"], "unknown dataset 'humaneva'. Did you mean humaneval"),
    (main_run, ["K=0"], "K must be an integer >= 1 (drafts a block), got 0"),
    (main_sweep, ["K=1,0"], "K must be an integer >= 1 (drafts a block), got 0"),
    (main_run, ["L=0"], "L must be an integer >= 1 (tokens a draft), got 0"),
    (main_run, ["temperature=-0.5"], "temperature must be a number >= 0 (0 = greedy), got -0.5"),
    (main_run, ["K=two"], "K must be an integer >= 1 (drafts a block), got 'two'"),
    (main_run, ["hardware.batch_prompts=0"], "hardware.batch_prompts must be an integer >= 1, got 0"),
    (main_run, ["hardware.timed_prompts=-1"], "hardware.timed_prompts must be an integer >= 0, got -1"),
    (main_run, ["method=sd", "K=3"], "method sd verifies a single draft (K=1), got K=3"),
    (main_run, ["method=bv", "K=2"], "method bv verifies a single draft"),
    (main_run, ["method=gbv", "K=4"], "method gbv verifies a single draft"),
    (main_run, ["K=1,3"], "use `sweep` for lists"),
    (main_run, ["Kx=3"], "unknown key 'Kx': not in the config. Did you mean K?"),
    # Hydra's own hint after a typo is `+temprature=0.9`: it would add the key and run at T=0.4 (issue 16).
    (main_run, ["+temprature=0.9"], "unknown key 'temprature': not in the config. Did you mean temperature?"),
    (main_sweep, ["++temprature=0.9"], "unknown key 'temprature'"),
    (main_run, ["hardware.allow_ofload=true"], "unknown key 'hardware.allow_ofload': not in hardware. Did you "
                                               "mean allow_offload?"),
    (main_run, ["+model_pair.sed=3"], "unknown key 'model_pair.sed'"),
])
def test_bad_input_exits_2_with_one_message(command, argv, message, tmp_path, capsys):
    out = tmp_path / "results"
    code = command([*COMMON, f"output_dir={out}", *argv])
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err
    assert "Traceback" not in captured.err
    assert not out.exists(), "nothing may be written"


def test_cuda_without_a_gpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    out = tmp_path / "results"
    assert main_run([*COMMON, "hardware=cuda", f"output_dir={out}"]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
    assert not out.exists()


def test_non_writable_output_dir(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    code = main_run([*COMMON, f"output_dir={blocker / 'results'}"])
    assert code == 2
    assert "is not writable" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_read_only_output_dir(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main_run([*COMMON, f"output_dir={locked / 'results'}"]) == 2
        assert "is not writable" in capsys.readouterr().err
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_cli_process_prints_no_traceback(tmp_path):
    """Through `python -m spectr_repro`: the exit status and stderr a user sees."""
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "spectr_repro", "run", *COMMON, "method=sd", "K=3", f"output_dir={out}"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: method sd verifies a single draft")
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_missing_data_is_one_message_without_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECTR_REPRO_DATA", str(tmp_path / "no_data_here"))
    out = tmp_path / "results"
    code = main_run(["model_pair=tiny_random", "dataset=lm1b", "logger=disabled", "num_prompts=1",
                     "max_new_tokens=4", f"output_dir={out}"])
    captured = capsys.readouterr()
    assert code == 1
    assert "error: cannot load dataset lm1b" in captured.err and "Traceback" not in captured.err
    assert "loading model pair" not in captured.out + captured.err  # found before any model loads
    assert not out.exists()


@pytest.mark.parametrize("command", ["replay", "bias"])
def test_missing_data_stops_replay_and_bias_before_any_model_loads(command, tmp_path, monkeypatch, capsys):
    """The Qwen grid once loaded its 4 GB pair before saying lm1b's data folder was not set: the data is read
    first, so the message comes before any model loads, and nothing is written."""
    monkeypatch.setenv("SPECTR_REPRO_DATA", str(tmp_path / "no_data_here"))
    out = tmp_path / "results"
    main = importlib.import_module(f"spectr_repro.{command}.driver").main
    code = main(["model_pair=tiny_random", "dataset=lm1b", "logger=disabled", "max_new_tokens=4",
                 f"output_dir={out}"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "error: cannot load dataset lm1b" in captured.err and "Traceback" not in captured.err
    assert "loading model pair" not in captured.out + captured.err
    assert not out.exists()


def test_a_sweep_with_nothing_valid_left_exits_2_with_the_reason(tmp_path, capsys):
    """`sweep method=sd K=3`: every cell is invalid, so nothing would run; say why and exit 2 (issue 26)."""
    out = tmp_path / "results"
    code = main_sweep([*COMMON, "method=sd", "K=3", f"output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "nothing valid to run: all 1 cell(s) are invalid" in err and "method sd verifies a single draft" in err
    assert not out.exists()
    # control: one valid cell beside the invalid one still runs (the invalid one is skipped, as before)
    assert main_sweep([*COMMON, "method=sd", "K=1,3", "L=2", f"output_dir={out}"]) == 0


def test_too_many_prompts_are_refused_before_the_pair_loads(tmp_path, capsys, monkeypatch):
    from spectr_repro import models

    loads = []
    monkeypatch.setattr(models, "load_pair", lambda *a, **k: loads.append(a) or pytest.fail("pair loaded"))
    out = tmp_path / "results"
    code = main_run([*[a for a in COMMON if not a.startswith("num_prompts")], "num_prompts=165",
                     f"output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "num_prompts=165 but dataset humaneval has only 164 records" in err
    assert loads == [] and not out.exists()
