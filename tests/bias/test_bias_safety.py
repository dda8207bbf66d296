"""Faults injected into `python -m spectr_repro bias` on the tiny random pair: a damaged record, a kill between a
context's records and its done.json, a full disk, SIGTERM and SIGINT. Each ends in one message (or a clean resume),
never a traceback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from spectr_repro.__main__ import main as cli
from spectr_repro.bias import driver
from spectr_repro.bias import measure as bias_measure
from spectr_repro.bias import records as bias_records
from tests.process_helpers import command_process, stop_once_written

SMALL = ["model_pair=tiny_random", "hardware=cpu", "K=2", "L=3", "num_prompts=1", "bias.samples=8", "bias.batch=4",
         "bias.continuation_tokens=6", "bias.contexts_per_prompt=2", "logger=disabled", "method=spectr"]


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def contexts(output: Path) -> list[Path]:
    return sorted(p for p in output.glob("default/bias/contexts/*/*") if p.is_dir())


def subprocess_bias(output: Path, arguments: list[str], prelude: str = "") -> subprocess.Popen:
    return command_process("spectr_repro.bias.driver", output, arguments, prelude)


def test_a_damaged_record_is_named_left_out_set_aside_and_measured_again(tmp_path, capsys, monkeypatch):
    assert cli(["bias", *SMALL, f"output_dir={tmp_path}"]) == 0
    damaged, intact = contexts(tmp_path)
    assert bias_records.context_problem(damaged) is None and bias_records.context_problem(intact) is None
    record = damaged / "spectr.json"
    text = record.read_text()
    record.write_text(text[: len(text) // 2])  # cut: not JSON any more
    capsys.readouterr()

    records, left_out = bias_records.read_records_checked(tmp_path / "default" / "bias")
    assert len(left_out) == 1 and str(record) in left_out[0], left_out
    assert {r["context"] for r in records} == {json.loads((intact / "spectr.json").read_text())["context"]}

    measured = []
    measure = bias_measure.measure_context
    monkeypatch.setattr(bias_measure, "measure_context", lambda *a, **k: (measured.append(a[4]), measure(*a, **k))[1])
    assert cli(["bias", *SMALL, f"output_dir={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert str(record) in err and "set aside" in err and "Traceback" not in err
    assert measured == [0]  # only the damaged context is measured again
    aside = list((tmp_path / "default" / "bias" / "set_aside").glob(f"*/{damaged.name}-*/spectr.json"))
    assert len(aside) == 1 and aside[0].read_text() == text[: len(text) // 2]
    assert bias_records.context_problem(damaged) is None


@pytest.mark.slow  # a bias run in its own process, killed and resumed
def test_a_kill_between_the_records_and_done_json_is_found_and_measured_again(tmp_path, capsys):
    prelude = """
import os, signal
import spectr_repro.units as units
real = units.atomic_write_text
def dying(path, text):
    if path.name == "done.json":
        os.kill(os.getpid(), signal.SIGKILL)  # the method files are written, done.json never will be
    real(path, text)
units.atomic_write_text = dying  # the one store writes every unit's files
"""
    process = subprocess_bias(tmp_path, SMALL, prelude)
    process.communicate(timeout=600)
    assert process.returncode == -signal.SIGKILL
    (killed,) = contexts(tmp_path)
    assert (killed / "spectr.json").exists() and "no done.json" in bias_records.context_problem(killed)

    assert cli(["bias", *SMALL, f"output_dir={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert f"{killed}: no done.json" in err and "Traceback" not in err
    assert all(bias_records.context_problem(c) is None for c in contexts(tmp_path))


def test_a_full_disk_stops_with_one_message(tmp_path, capsys, monkeypatch):
    """ENOSPC where the records are written (the tmpfs version is tests/replay's; this one needs no mount)."""
    import spectr_repro.units as units

    def no_space(path, text):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(units, "atomic_write_text", no_space)  # the one store writes every context's files
    assert cli(["bias", *SMALL, f"output_dir={tmp_path}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "No space left on device" in err and "finished contexts are kept" in err


@pytest.mark.slow  # a bias run in its own process, stopped and resumed
@pytest.mark.parametrize("sent, status, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_stop_by_signal_says_what_is_kept_and_how_to_resume(tmp_path, capsys, sent, status, name):
    arguments = [*SMALL[:-1], "method=spectr,spectr_gbv", "bias.contexts_per_prompt=3", "bias.samples=128"]
    process = subprocess_bias(tmp_path, arguments)
    message = stop_once_written(process, tmp_path, "default/bias/contexts/*/*/done.json", sent, status)
    assert re.search(rf"stopped by {name}.*: kept [1-3] context\(s\) measured in this run and 0 finished before, "
                     r"in .*rerun the same command to resume\.", message), message
    assert cli(["bias", *arguments, f"output_dir={tmp_path}"]) == 0
    assert all(bias_records.context_problem(c) is None for c in contexts(tmp_path))


def test_the_stop_message_says_what_is_kept_and_what_was_dropped():
    """The words the slow stop-by-signal test reads, from the shared launch.signals.RunProgress."""
    from spectr_repro.launch.signals import Terminated

    progress = driver.Progress(computed=2, earlier=1, current="setting/ctx+3")
    assert progress.stopped_message(Terminated(15), Path("out/bias")) == (
        "stopped by SIGTERM: kept 2 context(s) measured in this run and 1 finished before, in out/bias; the context "
        "being measured (setting/ctx+3) was dropped and starts over; rerun the same command to resume.")
    idle = driver.Progress().stopped_message(KeyboardInterrupt(), Path("out/bias"))
    assert idle.startswith("stopped by SIGINT (Ctrl-C): kept 0 context(s)") and "no context was being measured" in idle
