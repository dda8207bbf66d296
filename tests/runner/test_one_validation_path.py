"""Every command that loads models checks its input the same way (launch.config.check_before_loading): the same
message, exit 2, nothing written, no model loaded -- a dataset too small, hardware that is not here, an L no block of
the pair can hold."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.__main__ import main as cli
from spectr_repro.launch.config import context_window

COMMON = ["model_pair=tiny_random", "dataset=humaneval", "logger=disabled", "method=spectr"]
TOO_MANY = "num_prompts=99999 but dataset gsm8k has only 1319 records; use num_prompts <= 1319"
TOO_LONG = "L=5000 cannot fit in a block of model pair tiny_random"
NO_CUDA = "hardware device 'cuda' but no CUDA device is visible to torch"


@pytest.fixture(autouse=True)
def no_models(monkeypatch, tmp_path):
    """Any model load fails the test: every refusal must come before one."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("spectr_repro.models.load_pair", refuse)
    monkeypatch.setattr("spectr_repro.launch.pairs.PairCache.pair", refuse)
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


COMMANDS = ["run", "sweep", "replay", "bias"]
CASES = [
    (["num_prompts=99999", "dataset=gsm8k"], TOO_MANY),
    (["L=5000", "max_new_tokens=5000"], TOO_LONG),
    (["hardware=cuda"], NO_CUDA),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("arguments, message", CASES)
def test_every_command_refuses_the_same_input_with_the_same_message(command, arguments, message, tmp_path, capsys):
    if "hardware=cuda" in arguments and torch.cuda.is_available():
        pytest.skip("CUDA is available here: hardware=cuda is valid input")
    output = tmp_path / "out"
    assert cli([command, *COMMON, "K=1" if command in ("run", "replay") else "K=2", f"output_dir={output}",
                *arguments]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert not output.exists()


def test_check_refuses_the_same_input(tmp_path, capsys):
    assert cli(["check", *COMMON, "K=2", f"output_dir={tmp_path / 'out'}", "L=5000", "max_new_tokens=5000"]) == 2
    assert TOO_LONG in capsys.readouterr().err


def test_bench_refuses_a_device_that_is_not_here(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: --device cuda is valid input")
    assert cli(["bench", "--quick", "--device", "cuda", "--out", str(tmp_path / "bench.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert NO_CUDA in err and err.endswith("use --device cpu") and len(err.splitlines()) == 1
    assert not (tmp_path / "bench.json").exists()


def test_the_block_bound_is_the_context_window_less_one(tmp_path, capsys):
    """L = window - 1 is the longest block the pair holds (a context token before it); one more is refused."""
    window, _ = context_window({"name": "tiny_random", "source": "tiny"})
    assert window == 4096
    assert cli(["replay", *COMMON, "K=1", f"L={window}", f"output_dir={tmp_path / 'out'}"]) == 2
    assert f"use L <= {window - 1}" in capsys.readouterr().err
    from spectr_repro.replay.driver import check_groups, parse

    check_groups(parse([*COMMON, "K=1", f"L={window - 1}", f"output_dir={tmp_path / 'ok'}"]))  # no UsageError


def test_a_long_L_bounded_by_max_new_tokens_is_still_accepted_by_run(tmp_path):
    """A cell never drafts past max_new_tokens (L=100000 runs as L=max_new_tokens): not refused."""
    from spectr_repro.launch.config import parse_arguments
    from spectr_repro.runner.cli import _compose_and_check

    args = parse_arguments([*COMMON, "K=2", "L=100000", "max_new_tokens=8", f"output_dir={tmp_path}"])
    _, plans = _compose_and_check("run", args, show_config=False)
    assert [plan.run.L for plan in plans if plan.method != "ar"] == [100000]
