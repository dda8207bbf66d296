"""`run` and `sweep` end to end on the tiny random pair, into a temporary results folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectr_repro.records import CellSummary, PromptRecord, field_names
from spectr_repro.runner import execute, store
from spectr_repro.runner.cli import main_run, main_sweep
from spectr_repro.settings import RunConfig

# The schema is the contract: every summary and record carries exactly its fields.
SUMMARY_KEYS = set(field_names(CellSummary))
RECORD_KEYS = set(field_names(PromptRecord))
ENVIRONMENT_KEYS = {"device", "device_name", "torch", "transformers", "python", "git_commit", "num_threads"}

SWEEP = ["model_pair=tiny_random", "dataset=humaneval", "method=sd,spectr_gbv", "K=1,3", "L=3",
         "num_prompts=2", "max_new_tokens=12", "logger=disabled"]


def cells(root: Path) -> dict[str, tuple[dict, list[dict]]]:
    found = {}
    for summary_path in sorted(root.glob("default/cells/*/summary.json")):
        lines = (summary_path.parent / "records.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        found[summary_path.parent.name] = (json.loads(summary_path.read_text()), records)
    return found


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "results"
    code = main_sweep([*SWEEP, f"output_dir={out}"])
    return code, out


def test_sweep_writes_every_cell_with_the_agreed_fields(swept, capsys):
    code, out = swept
    assert code == 0
    found = cells(out)
    by_key = {(s["method"], s["K"]): (s, r) for s, r in found.values()}
    # sd at K=3 is not a valid cell (single draft): skipped, nothing written for it.
    assert set(by_key) == {("ar", 1), ("sd", 1), ("spectr_gbv", 1), ("spectr_gbv", 3)}
    for summary, records in by_key.values():
        assert set(summary) == SUMMARY_KEYS
        assert ENVIRONMENT_KEYS <= set(summary["environment"])
        assert summary["num_prompts"] == len(records) == 2
        assert summary["model_pair"] == "tiny_random" and summary["dataset"] == "humaneval"
        for record in records:
            assert set(record) == RECORD_KEYS
            assert record["new_tokens"] <= 12
        assert summary["tokens"] == sum(r["new_tokens"] for r in records)
        assert summary["target_calls"] == sum(r["target_calls"] for r in records)
        assert summary["block_efficiency"] == pytest.approx(summary["tokens"] / summary["target_calls"])
        assert summary["tokens_per_s"] == pytest.approx(summary["tokens"] / summary["wall_time_s"])
        assert set(summary["time_split"]) >= {"prefill", "target", "total"}


def test_each_cell_keeps_its_resolved_config(swept):
    """config.yaml beside each summary is the cell's full config: it hashes back to the cell's id."""
    from omegaconf import OmegaConf

    _, out = swept
    for summary_path in out.glob("default/cells/*/summary.json"):
        config = OmegaConf.load(summary_path.parent / "config.yaml")
        assert store.cell_id(RunConfig.of_values(OmegaConf.to_container(config))) == summary_path.parent.name
        summary = json.loads(summary_path.read_text())
        assert config.method.name == summary["method"] and config.K == summary["K"]
        assert config.dataset.name == "humaneval" and config.model_pair.name == "tiny_random"


def test_cfg_job_prints_every_cell_and_writes_nothing(tmp_path, capsys):
    from omegaconf import OmegaConf

    out = tmp_path / "results"
    assert main_sweep([*SWEEP, f"output_dir={out}", "--cfg", "job"]) == 0
    printed = capsys.readouterr().out
    blocks = [b for b in printed.split("# cell ")[1:]]
    assert len(blocks) == 4  # sd K=1, spectr_gbv K=1 and K=3, sd K=3 (skipped when run, still a composed cell)
    first = OmegaConf.create(blocks[0].split("\n", 1)[1])
    assert first.model_pair.name == "tiny_random" and first.L == 3
    assert not out.exists()
    assert main_run(["model_pair=tiny_random", f"output_dir={out}", "--cfg=job"]) == 0
    assert "method:" in capsys.readouterr().out and not out.exists()
    assert main_run([f"output_dir={out}", "--cfg", "hydra"]) == 2
    assert "--cfg takes 'job'" in capsys.readouterr().err


def test_speedup_is_against_the_ar_run_of_the_same_group(swept):
    _, out = swept
    by_key = {(s["method"], s["K"]): (s, r) for s, r in cells(out).values()}
    ar_summary, ar_records = by_key[("ar", 1)]
    assert ar_summary["L"] == 1 and ar_summary["speedup"] == 1.0 and ar_summary["block_efficiency"] == 1.0
    ar_time = {r["prompt_id"]: r["wall_time_s"] for r in ar_records}
    for key in [("sd", 1), ("spectr_gbv", 1), ("spectr_gbv", 3)]:
        summary, records = by_key[key]
        assert summary["ar_cell_id"] == ar_summary["cell_id"]
        assert [r["ar_wall_time_s"] for r in records] == [ar_time[r["prompt_id"]] for r in records]
        assert summary["ar_wall_time_s"] == pytest.approx(sum(ar_time.values()))
        assert summary["speedup"] == pytest.approx(summary["ar_wall_time_s"] / summary["wall_time_s"])
        assert summary["ar_same_process"] is True
        assert len(summary["acceptance_by_position"]) == 3
        assert summary["block_efficiency"] >= 1.0


def test_rerun_skips_finished_cells_and_force_recomputes(swept, capsys, monkeypatch):
    _, out = swept
    before = {name: s["created_at"] + str((out / "default/cells" / name / "summary.json").stat().st_mtime_ns)
              for name, (s, _) in cells(out).items()}
    computed = []
    original = execute.Session._compute
    monkeypatch.setattr(execute.Session, "_compute",
                        lambda self, plan: computed.append(plan.cell_id) or original(self, plan))
    capsys.readouterr()
    assert main_sweep([*SWEEP, f"output_dir={out}"]) == 0
    text = capsys.readouterr()
    assert computed == []
    assert "finished earlier" in text.err and "finished earlier" in text.out
    assert "single draft" in text.out  # the K=3 note is repeated in the final summary
    after = {name: s["created_at"] + str((out / "default/cells" / name / "summary.json").stat().st_mtime_ns)
             for name, (s, _) in cells(out).items()}
    assert after == before

    assert main_sweep([*SWEEP, f"output_dir={out}", "method=spectr_gbv", "K=3", "force=true"]) == 0
    assert len(computed) == 2 and computed[0].startswith("ar-")  # the AR baseline is remeasured too


def test_interrupted_sweep_resumes_without_recomputing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random", "dataset=humaneval", "method=spectr,rbv,sbv", "K=2", "L=2",
            "num_prompts=1", "max_new_tokens=6", "logger=disabled", f"output_dir={out}"]
    computed = []
    original = execute.Session._compute

    def interrupt_third(self, plan):
        if len(computed) == 2:
            # A cell dies half-way: its records exist but its summary does not.
            plan.directory.mkdir(parents=True, exist_ok=True)
            (plan.directory / "records.jsonl").write_text('{"half": true}\n')
            raise KeyboardInterrupt
        computed.append(plan.cell_id)
        return original(self, plan)

    monkeypatch.setattr(execute.Session, "_compute", interrupt_third)
    assert main_sweep(argv) == 130
    assert "rerun the same command" in capsys.readouterr().err
    first = list(computed)
    assert len(cells(out)) == 2  # AR + the first method; the interrupted cell is not counted

    computed.clear()
    monkeypatch.setattr(execute.Session, "_compute",
                        lambda self, plan: computed.append(plan.cell_id) or original(self, plan))
    assert main_sweep(argv) == 0
    assert not set(computed) & set(first), "finished cells are not recomputed"
    assert len(computed) == 2
    final = cells(out)
    assert {s["method"] for s, _ in final.values()} == {"ar", "spectr", "rbv", "sbv"}
    assert all("half" not in r for _, records in final.values() for r in records)


def test_run_one_cell_prints_the_table(tmp_path, capsys):
    out = tmp_path / "results"
    assert main_run(["model_pair=tiny_random", "dataset=gsm8k", "method=spectr", "K=2", "L=2",
                     "num_prompts=1", "max_new_tokens=6", "temperature=0", "logger=disabled",
                     f"output_dir={out}"]) == 0
    table = capsys.readouterr().out
    for column in ("method", "K", "L", "T", "BE", "speedup", "tokens/s"):
        assert f" {column} " in table
    assert {s["method"] for s, _ in cells(out).values()} == {"ar", "spectr"}


def test_hydra_launcher_path_runs_the_same_cells(tmp_path, capsys):
    """`sweep hydra/launcher=...` hands the grid to Hydra's own multirun (the SLURM path); with the basic
    launcher the jobs run here, one cell each, and land under the same cell ids as an in-process sweep."""
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random", "dataset=humaneval", "method=spectr,sbv", "K=2", "L=2", "num_prompts=1",
            "max_new_tokens=4", "logger=disabled", f"output_dir={out}"]
    assert main_sweep([*argv, "hydra/launcher=basic"]) == 0
    found = cells(out)
    assert {s["method"] for s, _ in found.values()} == {"ar", "spectr", "sbv"}
    assert list((out / "default" / "multirun").glob("*/multirun.yaml"))
    capsys.readouterr()
    assert main_sweep(argv) == 0  # the in-process sweep finds every cell finished
    assert "0 cell(s) run, 3 finished earlier" in capsys.readouterr().out
