"""``bias.budget_minutes`` on the tiny random pair: the run stops at a context boundary (exit 0, the command that
continues it), the printed command finishes the rest, and a bad budget is one message before any model loads."""

from __future__ import annotations

import re
import shlex

import pytest

from spectr_repro.__main__ import main as cli
from spectr_repro.bias import records as bias_records
from tests.bias.test_bias_safety import SMALL, contexts


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def test_a_tiny_budget_stops_after_the_first_context_and_the_printed_command_finishes(tmp_path, capsys):
    arguments = [*SMALL, "bias.budget_minutes=0.0001", f"output_dir={tmp_path}"]
    assert cli(["bias", *arguments]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    stopped = re.match(r"budget of 0.0001 min reached: kept 1 context\(s\) this run, 0 finished before, 1 left; "
                       r"continue with: python -m spectr_repro bias (.*)$", last)
    assert stopped is not None, last
    assert shlex.split(stopped.group(1)) == arguments
    assert [bias_records.context_problem(c) for c in contexts(tmp_path)] == [None]

    assert cli(["bias", *shlex.split(stopped.group(1))]) == 0
    assert "budget of" not in capsys.readouterr().out
    assert len(contexts(tmp_path)) == 2 and all(bias_records.context_problem(c) is None for c in contexts(tmp_path))


@pytest.mark.parametrize("value", ["-2", "soon"])
def test_a_bad_budget_is_exit_2_before_any_model_loads(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setattr("spectr_repro.launch.pairs.PairCache.pair", lambda *a, **k: pytest.fail("pair loaded"))
    assert cli(["bias", *SMALL, f"bias.budget_minutes={value}", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bias.budget_minutes must be a number of minutes > 0") and err.count("\n") == 1
