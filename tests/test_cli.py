"""`python -m spectr_repro`: help lists the subcommands and config groups; dispatch by name."""

from __future__ import annotations

import pytest

from spectr_repro import __main__ as cli


def test_help_lists_subcommands_and_config_groups(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("run", "sweep", "report", "theory", "audit"):
        assert f"  {command} " in text
    for group in ("method", "model_pair", "dataset", "experiment", "hardware", "logger"):
        assert f"  {group} " in text
    for option in ("spectr_gbv", "tiny_random", "paper_main", "wandb_offline", "cuda"):
        assert option in text


def test_sweep_help(capsys):
    assert cli.main(["sweep", "--help"]) == 0
    assert "Comma lists expand to the grid" in capsys.readouterr().out


def test_no_command_prints_usage_and_fails(capsys):
    assert cli.main([]) == 2
    assert "commands:" in capsys.readouterr().out


def test_unknown_command_suggests(capsys):
    assert cli.main(["swep"]) == 2
    assert "Did you mean sweep" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "sweep", "report", "theory", "audit"])
def test_dispatch_calls_the_named_function(command, monkeypatch):
    import types

    calls = []
    module_name, function_name, _ = cli.COMMANDS[command]
    fake = types.SimpleNamespace(**{function_name: lambda argv: calls.append(argv) or 0})
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: fake if name == module_name else None)
    assert cli.main([command, "a=1", "b"]) == 0
    assert calls == [["a=1", "b"]]


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_names_a_module_and_function_that_exist(command):
    """So the dispatcher needs no "not available yet" path: each command resolves."""
    import importlib

    module_name, function_name, _ = cli.COMMANDS[command]
    assert callable(getattr(importlib.import_module(module_name), function_name))


def test_sweep_dash_dash_plan_is_the_plan_command(monkeypatch):
    """`sweep ... --plan` prints the plan (cells and replays): it goes to the `plan` command, not to the runner."""
    import types

    calls = []
    module_name, function_name, _ = cli.COMMANDS["plan"]
    fake = types.SimpleNamespace(**{function_name: lambda argv: calls.append(argv) or 0})
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: fake if name == module_name else None)
    assert cli.main(["sweep", "K=1,3", "--plan"]) == 0
    assert calls == [["K=1,3", "--plan"]]


def test_the_commit_is_read_when_a_command_starts(tmp_path, capsys):
    """A long run's records name the commit its code came from: the entry point reads it before the command runs, so
    a checkout of another commit during the run (a worktree moved on between budgeted rounds) cannot relabel the
    prompts it finishes later. `seal --check` on an empty folder reads no environment itself (the control: the cache
    is empty until the entry point fills it)."""
    from spectr_repro.__main__ import main
    from spectr_repro.commit import git_commit

    git_commit.cache_clear()
    assert git_commit.cache_info().currsize == 0
    assert main(["seal", "--check", str(tmp_path)]) == 2
    assert "no replay group" in capsys.readouterr().err
    assert git_commit.cache_info().currsize == 1
