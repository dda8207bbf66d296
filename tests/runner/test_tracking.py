"""W&B offline: one run folder per computed cell under the results folder, with the summary metrics."""

from __future__ import annotations

import json
import os

from spectr_repro.conf import conf_dir
from spectr_repro.runner.cli import main_run
from spectr_repro.tracking.offline import records as wandb_records  # the one reader of offline run files


def test_wandb_offline_runs_hold_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "results"
    code = main_run(["model_pair=tiny_random", "dataset=humaneval", "method=sbv", "K=2", "L=2",
                     "num_prompts=1", "max_new_tokens=6", "logger=wandb_offline", f"output_dir={out}"])
    assert code == 0
    assert not (tmp_path / "wandb").exists()
    run_files = sorted((out / "default" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 2, "one run per computed cell (AR baseline + sbv)"

    runs, tags, projects = {}, {}, {}
    for run_file in run_files:
        summary, group, name = {}, None, None
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                group, name = record.run.run_group, record.run.display_name
                tags[name], projects[name] = list(record.run.tags), record.run.project
            elif kind == "summary":
                for item in record.summary.update:
                    summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        runs[name] = (group, summary)
        assert list(run_file.parent.glob("files/media/table/records_*.table.json")), "per-prompt table"

    (sbv_name,) = [n for n in runs if n.startswith("sbv-")]
    group, summary = runs[sbv_name]
    assert group == "default"
    stored = json.loads((out / "default" / "cells" / sbv_name / "summary.json").read_text())
    for key in ("block_efficiency", "speedup", "tokens_per_s", "wall_time_s", "ar_wall_time_s", "tokens"):
        assert summary[key] == stored[key]
    assert summary["time_split/total"] == stored["time_split"]["total"]
    assert summary["records/nrows"] == 1
    assert "W&B offline run" in capsys.readouterr().err
    # Conventions: tags to filter by, the default project, acceptance by position as a chart and as scalars.
    assert set(tags[sbv_name]) == {"pair:tiny_random", "dataset:humaneval", "method:sbv"}
    assert projects[sbv_name] == "spectr_repro"
    charts = [f for f in run_files if list(f.parent.glob("files/media/table/acceptance_by_position_*.table.json"))]
    assert len(charts) == 1, "the sbv run charts its acceptance by position (the AR run has none)"
    chart = json.loads(next(charts[0].parent.glob("files/media/table/acceptance_by_position_*.table.json")).read_text())
    assert chart["columns"] == ["position", "acceptance"]
    assert [row[1] for row in chart["data"]] == [a for a in stored["acceptance_by_position"] if a is not None]
    assert summary["acceptance/position_1"] == stored["acceptance_by_position"][0]


def test_wandb_environment_variables_win(tmp_path, monkeypatch):
    """WANDB_PROJECT / WANDB_ENTITY choose where runs go; WANDB_MODE=disabled logs nothing and is kept."""
    from omegaconf import OmegaConf

    from spectr_repro import tracking

    offline = tracking.logger_settings(OmegaConf.load(conf_dir() / "logger" / "wandb_offline.yaml"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_PROJECT", "reviewer_project")
    monkeypatch.setenv("WANDB_ENTITY", "reviewer_team")
    assert tracking.destination(offline) == ("reviewer_project", "reviewer_team")
    monkeypatch.delenv("WANDB_PROJECT")
    monkeypatch.delenv("WANDB_ENTITY")
    assert tracking.destination(offline) == ("spectr_repro", None)
    assert tracking.destination(tracking.logger_settings({"project": "mine", "entity": "me"})) == ("mine", "me")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert not tracking.enabled(offline)
    tracking.prepare(offline)
    assert os.environ["WANDB_MODE"] == "disabled"  # never overwritten
    out = tmp_path / "results"
    assert main_run(["model_pair=tiny_random", "dataset=humaneval", "method=sd", "K=1", "L=2", "num_prompts=1",
                     "max_new_tokens=4", "logger=wandb_offline", f"output_dir={out}"]) == 0
    assert not (out / "default" / "wandb").exists()


def test_a_misspelt_logger_mode_is_refused_at_the_door(tmp_path, capsys):
    """logger.mode=ofline used to be read as "log nothing", silently: now one message, exit 2, nothing written."""
    out = tmp_path / "results"
    assert main_run(["model_pair=tiny_random", "dataset=humaneval", "method=sd", "K=1", "L=2", "num_prompts=1",
                     "max_new_tokens=4", "logger.mode=ofline", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "logger.mode must be online, offline or disabled, got 'ofline'" in err
    assert "loading model pair" not in err and not out.exists()
