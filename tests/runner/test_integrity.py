"""Results that cannot be silently damaged (issue 16, runner rows): a cell counts as finished only when its
summary agrees with its records; damaged cells are redone with one warning naming the file; `report` refuses
(naming the file) rather than counting fewer prompts; every folder the run writes is checked first;
SIGTERM/SIGINT say what was kept."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from spectr_repro.analysis.report import main as report_main
from spectr_repro.runner import execute
from spectr_repro.runner.cli import main_sweep
from tests.runner.runner_helpers import cli

GRID = ["model_pair=tiny_random", "dataset=humaneval", "method=sd,spectr", "K=1", "L=2", "num_prompts=2",
        "max_new_tokens=3", "logger=disabled"]


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A finished 3-cell sweep (AR, sd, spectr), copied afresh by each test that damages it."""
    out = tmp_path_factory.mktemp("integrity") / "results"
    os.environ.setdefault("SPECTR_REPRO_RUNNERS", str(out.parent / "runners"))
    assert main_sweep([*GRID, f"output_dir={out}"]) == 0
    return out


@pytest.fixture
def results(finished_sweep, tmp_path):
    import shutil

    out = tmp_path / "results"
    shutil.copytree(finished_sweep, out)
    return out


def _cell(out, method):
    return next(p.parent for p in out.glob("default/cells/*/summary.json") if p.parent.name.startswith(method + "-"))


@pytest.fixture
def computed(monkeypatch):
    calls = []
    original = execute.Session._compute
    monkeypatch.setattr(execute.Session, "_compute",
                        lambda self, plan: calls.append(plan.method) or original(self, plan))
    return calls


def test_garbage_summary_is_redone_with_one_warning_naming_the_file(results, computed, capsys):
    sd = _cell(results, "sd")
    (sd / "summary.json").write_text("{garbage")
    assert main_sweep([*GRID, f"output_dir={results}"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"warning: {sd / 'summary.json'}: not valid JSON") == 1
    assert computed == ["sd"], "only the damaged cell is redone; the later cell is not lost"
    assert json.loads((sd / "summary.json").read_text())["num_prompts"] == 2


@pytest.mark.parametrize("damage", ["cut mid-line", "last line missing"])
def test_damaged_ar_baseline_is_recomputed_before_its_dependents(results, computed, capsys, damage):
    ar, sd = _cell(results, "ar"), _cell(results, "sd")
    text = (ar / "records.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    (ar / "records.jsonl").write_text(lines[0] + lines[1][: len(lines[1]) // 2] if damage == "cut mid-line"
                                      else lines[0])
    (sd / "summary.json").unlink()  # a dependent still to compute
    assert main_sweep([*GRID, f"output_dir={results}"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {ar / 'records.jsonl'}" in err
    assert computed == ["ar", "sd"], "the AR baseline first, then the cell that needs it"
    new_ar = {r["prompt_id"]: r["wall_time_s"]
              for r in map(json.loads, (ar / "records.jsonl").read_text().splitlines())}
    sd_records = [json.loads(line) for line in (sd / "records.jsonl").read_text().splitlines()]
    assert [r["ar_wall_time_s"] for r in sd_records] == [new_ar[r["prompt_id"]] for r in sd_records]


def test_cell_with_records_cut_mid_line_is_not_finished(results, computed, capsys):
    spectr = _cell(results, "spectr")
    text = (spectr / "records.jsonl").read_text()
    (spectr / "records.jsonl").write_text(text[: len(text) - 40])
    assert main_sweep([*GRID, f"output_dir={results}"]) == 0
    assert computed == ["spectr"]
    assert f"warning: {spectr / 'records.jsonl'}:2: not valid JSON" in capsys.readouterr().err


def test_report_refuses_missing_records_or_summaries_and_names_them(results, capsys):
    spectr, sd = _cell(results, "spectr"), _cell(results, "sd")
    lines = (spectr / "records.jsonl").read_text().splitlines(keepends=True)
    (spectr / "records.jsonl").write_text(lines[0])  # a whole record line missing
    (sd / "summary.json").unlink()  # records, but no summary
    folder = results / "default"
    assert report_main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{spectr / 'records.jsonl'}: disagrees with summary.json: the summary counts 2 prompts" in err
    assert f"{sd / 'records.jsonl'}: records but no summary.json" in err
    assert not (folder / "REPORT.md").exists()
    # Asked to report anyway: the report lists what it left out.
    assert report_main([str(folder), "--allow-incomplete"]) == 0
    text = (folder / "REPORT.md").read_text()
    assert "## Results integrity" in text and "2 cell folder(s) were left out" in text
    assert sd.name in text and spectr.name in text


@pytest.mark.parametrize("blocked", ["default", "default/cells"])
def test_unwritable_experiment_folder_is_refused_before_any_work(tmp_path, computed, capsys, blocked):
    """<output_dir> is writable, but a folder the run writes below it is not (a file sits there: unwritable
    even for root): refused before the first cell, not after it."""
    out = tmp_path / "results"
    (out / blocked).parent.mkdir(parents=True, exist_ok=True)
    (out / blocked).write_text("a file where a folder goes")
    assert main_sweep([*GRID, f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "is not writable" in err and f"{out / blocked} is not a directory" in err
    assert computed == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_experiment_folder_under_a_writable_parent(tmp_path, computed, capsys):
    out = tmp_path / "results"
    (out / "default").mkdir(parents=True)
    (out / "default").chmod(0o555)
    try:
        assert main_sweep([*GRID, f"output_dir={out}"]) == 2
        assert "no write permission" in capsys.readouterr().err
        assert computed == []
    finally:
        (out / "default").chmod(0o755)


def test_wandb_folder_is_checked_when_logging_is_on(tmp_path, computed, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "results"
    (out / "default").mkdir(parents=True)
    (out / "default" / "wandb").write_text("not a folder")
    argv = [a for a in GRID if not a.startswith("logger=")] + ["logger=wandb_offline", f"output_dir={out}"]
    assert main_sweep(argv) == 2
    assert "wandb" in capsys.readouterr().err and computed == []


def test_a_signal_after_a_summary_is_written_counts_that_cell_as_kept():
    """The race behind a CI failure of the test below (2026-12-02): SIGTERM landed after the second cell's
    summary.json was written and before its outcome was recorded, and the message said "kept 1" with 2 cells on
    disk. The files decide: a cell written to disk is kept (and not "dropped"), whatever the outcomes say.
    Control: without the written cell the message counts the recorded outcome only."""
    from types import SimpleNamespace

    from spectr_repro.runner.cli import stopped_message

    plans = [SimpleNamespace(cell_id=name, skip_note=None) for name in ("ar", "sd", "bv")]
    finished = [execute.CellOutcome(plans[0], "ran")]
    message = stopped_message("SIGTERM", plans, finished, plans[1], "out", written={"ar", "sd"})
    assert "kept 2 cell(s) computed in this run" in message and "no cell was being computed" in message
    assert "the 1 cell(s) left" in message
    control = stopped_message("SIGTERM", plans, finished, plans[1], "out", written={"ar"})
    assert "kept 1 cell(s)" in control and "(sd) was dropped" in control and "the 2 cell(s) left" in control


def test_sigterm_says_what_was_kept(tmp_path, isolated_runner_registry):
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random", "dataset=humaneval", "method=sd,bv,gbv,spectr,rbv,sbv", "K=1", "L=2",
            "num_prompts=1", "max_new_tokens=24", "logger=disabled", f"output_dir={out}"]
    process = cli("sweep", *argv, env={"SPECTR_REPRO_RUNNERS": str(isolated_runner_registry)})
    deadline = time.monotonic() + 600
    while not list(out.glob("default/cells/*/summary.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM: kept " in err and "rerun the same command" in err
    assert "Traceback" not in err
    assert not list(out.rglob("claim.json")), "claims are released on the way out"
    kept = len(list(out.glob("default/cells/*/summary.json")))
    assert f"kept {kept} cell(s) computed in this run" in err
