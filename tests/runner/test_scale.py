"""The runner at scale, rehearsed on the CPU: pairs one at a time, offload refused when timing, the paper's
grid by two concurrent runners, and the SLURM path through submitit's local executor (array semantics)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from spectr_repro import models
from spectr_repro.analysis.report import main as report_main
from spectr_repro.runner.cli import main_sweep
from tests.runner.runner_helpers import cells_computed, cli

TINY = ["dataset=humaneval", "K=1", "L=2", "num_prompts=1", "max_new_tokens=3", "logger=disabled",
        "runner.poll_s=0.2"]


def _summaries(folder):
    return [json.loads(p.read_text()) for p in folder.glob("cells/*/summary.json")]


@pytest.fixture
def offloaded_tiny_pair(monkeypatch):
    """load_pair gives the tiny pair as if accelerate had put two target modules on the CPU."""
    real = models.load_pair

    def load(*args, **kwargs):
        pair = real(*args, **kwargs)
        return dataclasses.replace(pair, offloaded={"target": ["model.layers.1 (cpu)", "lm_head (disk)"]},
                                   memory_free=[(3 * 1024**3, 80 * 1024**3)])

    monkeypatch.setattr(models, "load_pair", load)


def test_offloaded_pair_is_refused_for_timing(tmp_path, offloaded_tiny_pair, capsys):
    out = tmp_path / "results"
    assert main_sweep(["model_pair=tiny_random", "method=sd", *TINY, f"output_dir={out}"]) == 1
    err = capsys.readouterr().err
    assert "error: model pair tiny_random does not fit on the accelerator: 2 target module(s) on cpu/disk" in err
    assert "cuda:0 3.0 of 80.0 GiB free" in err and "hardware.allow_offload=true" in err
    assert "Traceback" not in err and not list(out.rglob("summary.json"))


def test_allowed_offload_is_recorded_and_reported_not_comparable(tmp_path, offloaded_tiny_pair, capsys):
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random", "method=sd", *TINY, "hardware.allow_offload=true", f"output_dir={out}"]
    assert main_sweep(argv) == 0
    summaries = {s["method"]: s for s in _summaries(out / "default")}
    assert summaries["ar"]["offloaded"] and summaries["sd"]["offloaded"]
    assert summaries["sd"]["speedup_caveats"][0].startswith("offloaded")
    assert any(c.startswith("AR baseline: offloaded") for c in summaries["sd"]["speedup_caveats"])
    capsys.readouterr()
    assert report_main([str(out / "default")]) == 0
    report = (out / "default" / "REPORT.md").read_text()
    assert "2 cell(s) have speed-ups that are **not comparable**" in report
    assert summaries["sd"]["cell_id"] in report


def test_two_pairs_in_one_sweep_are_loaded_one_after_the_other(two_tiny_conf, tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random,tiny_random_b", "method=sd,spectr", *TINY, f"output_dir={out}"]
    assert main_sweep(argv) == 0
    err = capsys.readouterr().err
    events = re.findall(r"(loading|released) model pair (\w+)", err)
    assert events == [("loading", "tiny_random"), ("released", "tiny_random"), ("loading", "tiny_random_b"),
                      ("released", "tiny_random_b")]
    assert models.loaded_pair_name() is None


def _pair_events(stderr: str) -> list[tuple[str, str]]:
    return re.findall(r"(loading|released) model pair (\w+)", stderr)


@pytest.mark.skipif(not (Path(os.environ.get("SPECTR_REPRO_DATA", "/nonexistent")) / "gsm8k").is_dir(),
                    reason="needs the local copies of the five datasets (SPECTR_REPRO_DATA); CI sets it")
def test_paper_main_dress_rehearsal_by_two_concurrent_runners(two_tiny_conf, tmp_path, isolated_runner_registry):
    """experiment=paper_main with the DeepSeek pairs replaced by two distinct tiny pairs, on the CPU, run by
    two processes at once into one folder: every cell computed once, each pair released before the next
    is loaded, and one report over it all."""
    out = tmp_path / "results"
    argv = ["experiment=paper_main", "model_pair=tiny_random,tiny_random_b", "hardware=cpu", "logger=disabled",
            "num_prompts=1", "max_new_tokens=2", "runner.poll_s=0.2", f"output_dir={out}"]
    env = {"SPECTR_REPRO_CONF": str(two_tiny_conf), "SPECTR_REPRO_RUNNERS": str(isolated_runner_registry)}
    processes = [cli("sweep", *argv, env=env) for _ in range(2)]
    results = [p.communicate(timeout=1800) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [err[-3000:] for _, err in results]
    # 2 pairs x 2 datasets x 4 methods (the checking cells), plus an AR baseline per pair and dataset.
    computed = [cells_computed(stdout) for stdout, _ in results]
    assert sum(computed) == 20, computed
    assert len(_summaries(out / "paper_main")) == 20 and not list(out.rglob("claim.json"))
    for _, err in results:
        events = _pair_events(err)
        loads = [pair for event, pair in events if event == "loading"]
        assert len(loads) == len(set(loads)), f"a pair was loaded twice: {events}"
        for index, (event, _pair) in enumerate(events):
            if event == "loading":  # whatever was loaded before has been released
                held = [p for e, p in events[:index] if e == "loading"]
                released = [p for e, p in events[:index] if e == "released"]
                assert held == released, events
    assert report_main([str(out / "paper_main")]) == 0
    report = (out / "paper_main" / "REPORT.md").read_text()
    assert "from 20 cells" in report and "## Table 1 — tiny_random" in report and "## Table 1 — tiny_random_b" in report


def _job_logs(out):
    """(stdout, stderr) of each submitit job."""
    return [(path.read_text(), path.with_suffix(".err").read_text()) for path in out.rglob(".submitit/*/*_log.out")]


@pytest.mark.parametrize("jobs, expected_jobs", [("workers_3", 3), pytest.param("per_pair", 2, marks=pytest.mark.slow)])
def test_slurm_path_with_submitit_local_executor(two_tiny_conf, tmp_path, isolated_runner_registry, jobs,
                                                 expected_jobs):
    """hydra/launcher=submitit_local runs the jobs as submitit would on SLURM (pickled task, one process each,
    all at once): N workers over one grid, or one job per pair; each cell computed once; one report."""
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random,tiny_random_b", "method=sd,spectr", *TINY, f"output_dir={out}",
            f"runner.jobs={jobs}", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=30"]
    env = {"SPECTR_REPRO_CONF": str(two_tiny_conf), "SPECTR_REPRO_RUNNERS": str(isolated_runner_registry)}
    process = cli("sweep", *argv, env=env)
    stdout, stderr = process.communicate(timeout=1800)
    assert process.returncode == 0, (stdout + stderr)[-4000:]
    logs = _job_logs(out)
    assert len(logs) == expected_jobs
    assert sum(cells_computed(stdout) for stdout, _ in logs) == 6  # 2 pairs x (AR, sd, spectr)
    if jobs == "per_pair":  # a job never loads two pairs
        assert sorted(p for _, err in logs for e, p in _pair_events(err) if e == "loading") == [
            "tiny_random", "tiny_random_b"]
    assert len(_summaries(out / "default")) == 6
    assert report_main([str(out / "default")]) == 0
