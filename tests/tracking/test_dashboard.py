"""The dashboard's panels plot what the commands' offline runs hold, under the same names (fast: a synthetic
results folder logged by the drivers' calls; ``test_dashboard_end_to_end.py`` runs the real commands)."""

from __future__ import annotations

import json

import pytest

from spectr_repro import tracking
from spectr_repro.tracking import dashboard, names
from spectr_repro.tracking.offline import read_runs, run_files
from tests.tracking.synthetic import BENCH, EXPERIMENT, log_everything, replay_summary
from tests.tracking.tracking_helpers import without_wandb_variables

SECTIONS = ["Verdicts", "Table 1 (replay)", "Tokens per call against K and L",
            "Speed-up against L: predicted and measured", "Bias per rule", "Machine: check and bench", "Figures"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as patch:
        without_wandb_variables(patch)
        patch.chdir(root)
        folder = log_everything(root)
        assert not (root / "wandb").exists(), "runs go under the results folders, never the working directory"
    runs = read_runs(dashboard.run_folders(folder))
    return folder, runs


def by_job(runs):
    return {run.job_type: run for run in runs}


def test_every_command_leaves_one_offline_run_with_the_cells_conventions(logged):
    folder, runs = logged
    jobs = by_job(runs)
    assert sorted(r.job_type for r in runs) == sorted(
        ["sbv", "replay", "bias", "report", "check", "theory", "audit", "bench"])
    for command in ("replay", "bias", "report"):  # group = the experiment, as for the cells
        assert jobs[command].group == EXPERIMENT == jobs["sbv"].group
        assert set(jobs[command].tags) == {f"command:{command}", f"experiment:{EXPERIMENT}"}
        assert jobs[command].project == tracking.DEFAULT_PROJECT
    assert (jobs["check"].group, jobs["audit"].group, jobs["bench"].group) == ("check", "audit", "bench")
    assert jobs["replay"].config["K"] == [1, 3] and jobs["replay"].config["dataset"] == "humaneval"  # top level
    assert jobs["bench"].config["preset"] == BENCH["settings"]["preset"]


def test_the_runs_hold_the_tables_values(logged):
    """Values, not only names: the replay's scalars are replay_summary.csv's, the report counts its verdicts,
    the audit and check carry their numbers."""
    folder, runs = logged
    jobs = by_job(runs)
    for _, row in replay_summary().iterrows():
        name = names.replay_tokens(row["dataset"], row["temperature"], row["method"], row["K"], row["L"])
        assert jobs["replay"].summary[name] == pytest.approx(row["tokens_per_call"])
    assert jobs["replay"].summary["replay/summary"]["nrows"] == len(replay_summary())
    assert (jobs["report"].summary["verdicts/holds"], jobs["report"].summary["verdicts/undecided"],
            jobs["report"].summary["verdicts/does_not_hold"]) == (1, 1, 0)
    assert jobs["audit"].summary["audit/exact_tv/spectr_gbv_K2_carry_over-False"] == pytest.approx(0.012)
    assert jobs["audit"].summary["audit/verdicts/not_lossless"] == 1
    assert jobs["check"].summary["check/passed"] == 1 and jobs["check"].summary["check/items"]["nrows"] == 1
    assert jobs["bias"].summary["bias/tv_estimate/humaneval/T0_4/K2_L3/P_1+0/control_draft"] == pytest.approx(0.9)
    assert jobs["sbv"].summary["speedup"] == 1.3 and jobs["sbv"].config["L"] == 4


def test_every_panel_plots_a_metric_some_run_holds(logged):
    folder, runs = logged
    built = dashboard.sections(folder, runs)
    assert [s.name for s in built] == SECTIONS
    assert dashboard.unplotted(built, runs) == []
    kinds = {panel.kind for section in built for panel in section.panels}
    assert kinds == {"table", "scalar", "bar", "line", "scatter", "media"}
    speedup = next(s for s in built if s.name.startswith("Speed-up"))
    lines = [p for p in speedup.panels if p.kind == "line"]
    assert any(m.endswith("/measured") for p in lines for m in p.metrics), "the timed cell beside the prediction"
    tokens = next(s for s in built if s.name.startswith("Tokens"))
    assert {p.x for p in tokens.panels} == {names.REPLAY_K, names.REPLAY_L}


def test_negative_control_a_renamed_metric_is_reported(logged):
    """A panel naming a metric no run logs fails the check: rename one curve of the replay run, one verdict count of
    the report's, the cells' config key L."""
    folder, runs = logged
    built = dashboard.sections(folder, runs)
    replay = by_job(runs)["replay"]
    curve = next(p for s in built for p in s.panels if p.kind == "line" and p.x == names.REPLAY_K).metrics[0]
    replay.history_keys = {k + "_renamed" if k == curve else k for k in replay.history_keys}
    report = by_job(runs)["report"]
    report.summary["verdicts/holds_renamed"] = report.summary.pop("verdicts/holds")
    cell = by_job(runs)["sbv"]
    cell.config["L_renamed"] = cell.config.pop("L")
    try:
        missing = dashboard.unplotted(built, runs)
    finally:
        replay.history_keys = {k.removesuffix("_renamed") for k in replay.history_keys}
        report.summary["verdicts/holds"] = report.summary.pop("verdicts/holds_renamed")
        cell.config["L"] = cell.config.pop("L_renamed")
    assert len(missing) == 3, missing
    assert any(m.endswith(f"{curve} (history)") for m in missing)
    assert any(m.endswith("verdicts/holds (summary)") for m in missing)
    assert any(m.endswith(": L (config) with speedup (summary)") for m in missing), "the replay's config L is a list"


def test_the_dashboard_command_writes_the_definition_offline(logged, capsys):
    folder, runs = logged
    assert dashboard.main([str(folder)]) == 0
    out = capsys.readouterr().out
    definition = json.loads((folder / dashboard.DEFINITION_FILE).read_text())
    assert [s["name"] for s in definition["sections"]] == SECTIONS
    assert [s["name"] for s in definition["view"]["spec"]["section"]["panelBankConfig"]["sections"]] == SECTIONS
    assert definition["view"]["project"] == tracking.DEFAULT_PROJECT
    assert f"wandb sync {folder / 'wandb'}/offline-run-*" in out and "--logger wandb_online" in out
    assert f"over {len(runs)} runs" in out


def test_bad_input_is_one_message_and_exit_2(tmp_path, capsys):
    assert dashboard.main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert dashboard.main([str(tmp_path / "empty")]) == 2
    assert "no offline W&B run" in capsys.readouterr().err
    assert list(tmp_path.rglob("*")) == [tmp_path / "empty"], "nothing written"


def test_logger_disabled_writes_no_wandb_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = log_everything(tmp_path / "off", logger=tracking.logger_config("disabled"))
    assert not list(tmp_path.rglob("wandb")), "logger=disabled writes nothing to W&B"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # W&B's variable wins over the offline logger
    assert tracking.log_command("replay", tracking.logger_config(), folder) is None
    assert not run_files(folder) and not (tmp_path / "wandb").exists()


def test_an_argparse_command_takes_logger_disabled(tmp_path, monkeypatch):
    """theory (as report, audit, bench, dashboard): --logger disabled writes its files and no W&B run."""
    from spectr_repro.theory.cli import main_theory

    monkeypatch.chdir(tmp_path)
    assert main_theory(["--quick", "--out", str(tmp_path / "theory"), "--logger", "disabled"]) == 0
    assert (tmp_path / "theory" / "THEORY.md").is_file()
    assert not list(tmp_path.rglob("wandb"))


def test_wandb_environment_variables_choose_the_project(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "reviewer_project")
    run_dir = tracking.log_command("bench", tracking.logger_config(), tmp_path / "bench", results=BENCH)
    (run,) = read_runs([tmp_path / "bench"])
    assert run_dir == run.folder and run.project == "reviewer_project"


def test_a_failing_tracker_warns_and_never_fails_the_command(tmp_path, monkeypatch, capsys):
    import wandb

    def broken(*args, **kwargs):
        raise RuntimeError("no disk")

    monkeypatch.setattr(wandb, "init", broken)
    assert tracking.log_command("bench", tracking.logger_config(), tmp_path, results=BENCH) is None
    assert "W&B logging of bench failed: RuntimeError: no disk" in capsys.readouterr().err


def test_names_hold_no_dot_and_curves_come_in_order():
    derived = names.replay_metrics({"summary": replay_summary()}, {})
    assert all("." not in key for key in derived.summary)
    series = [row[names.REPLAY_K] for row in derived.history if names.replay_vs_K("humaneval", 0.4, 4, "sbv") in row]
    assert series == sorted(series) == [1.0, 3.0]




def test_a_table_of_mixed_types_is_logged_whole(tmp_path):
    """Columns mixing numbers, text, NaN and lists (bias.csv's interval, audit's options) are logged, not refused."""
    import pandas as pd

    frame = pd.DataFrame({"a": [1, "x", None], "b": [1.0, float("nan"), 2.0], "c": [[1], {"k": 2}, "t"]})
    assert tracking.log_command("bench", tracking.logger_config(), tmp_path, tables={"mixed": frame}) is not None
    (run,) = read_runs([tmp_path])
    assert run.summary["bench/mixed"]["nrows"] == 3


def test_quality_logs_its_table(tmp_path):
    """`quality` (a step of make reproduce) leaves one offline run holding quality.csv; --logger disabled none."""
    from spectr_repro.quality.cli import main as main_quality
    from spectr_repro.quality.tables import QUALITY_FILE

    results = tmp_path / "results"
    results.mkdir()
    assert main_quality([str(results)]) == 0
    assert (results / QUALITY_FILE).is_file()
    runs = read_runs([results])
    assert [run.job_type for run in runs] == ["quality"]
    assert (results / QUALITY_FILE).stat().st_size < 10  # no scored cell here: a table with no columns, still a run
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    assert main_quality([str(quiet), "--logger", "disabled"]) == 0
    assert not (quiet / "wandb").exists()


def test_a_logged_run_is_on_disk_when_logging_returns(tmp_path):
    """run.finish() may return before W&B's core has flushed the file (1 run in 25 on a busy CPU): log_command waits
    for the run's exit record, and the wait says False for a file cut before it."""
    from spectr_repro.tracking.offline import records, wait_until_written

    run_dir = tracking.log_command("bench", tracking.logger_config(), tmp_path / "bench", results=BENCH)
    (path,) = run_files(tmp_path / "bench")
    assert [r.WhichOneof("record_type") for r in records(path)][-1] == "exit"
    assert wait_until_written(run_dir, timeout_s=0.0)
    cut = tmp_path / "cut" / path.name
    cut.parent.mkdir()
    cut.write_bytes(path.read_bytes()[:200])  # the header and the start of the run record: no exit yet
    assert not wait_until_written(cut.parent, timeout_s=0.2)
    assert not wait_until_written(tmp_path / "no_run", timeout_s=0.0)


def test_the_batch_bench_is_logged_as_curves_the_dashboard_plots(tmp_path):
    """bench --preset batch_qwen: each rule's measured and predicted speed-up against B as history rows (x = B), and
    the dashboard's batch panels name only what the run holds."""
    cells = [{"method": m, "K": k, "L": 4, "B": B, "speedup": s, "predicted": s * 1.1}
             for m, k, base in (("sd", 1, 1.4), ("spectr", 3, 1.3)) for B, s in ((1, base), (2, base - 0.2))]
    results = {"settings": {"preset": "batch_qwen"},
               "batches": {"cells": cells, "median_abs_error": 0.1, "worst_abs_error": 0.1}}
    folder = tmp_path / "speedup_batch"
    folder.mkdir()
    (folder / "bench_batch.json").write_text(json.dumps(results))
    tracking.log_command("bench", tracking.logger_config(), folder, results=results)
    (run,) = read_runs([folder])
    assert names.batch_speedup("spectr", 3, 4, "measured") in run.history_keys
    assert names.batch_speedup("sd", 1, 4, "predicted") in run.history_keys
    section = dashboard.batch_section(folder)
    assert [p.kind for p in section.panels] == ["line", "table"]
    assert dashboard.unplotted([section], [run]) == []
    assert dashboard.batch_section(tmp_path / "grid").panels  # a results folder beside speedup_batch/
    assert not dashboard.batch_section(tmp_path / "other" / "grid").panels
