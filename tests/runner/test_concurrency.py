"""Several runners over one results folder: every cell is computed once; a dead runner's cells are redone."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from spectr_repro.launch.claims import CLAIM_FILE, Runner, process_start
from spectr_repro.runner import execute
from spectr_repro.runner.cli import main_sweep
from spectr_repro.settings import run_config
from tests.runner.runner_helpers import cells_computed, cli

# 7 cells: the AR baseline and six methods of one group.
GRID = ["model_pair=tiny_random", "dataset=humaneval", "method=sd,bv,gbv,spectr,rbv,sbv", "K=1", "L=2",
        "num_prompts=1", "max_new_tokens=3", "logger=disabled", "runner.poll_s=0.2"]


def _summaries(out):
    return {p.parent.name: json.loads(p.read_text()) for p in out.glob("default/cells/*/summary.json")}


def test_two_concurrent_sweeps_compute_seven_cells_in_total(tmp_path, isolated_runner_registry):
    out = tmp_path / "results"
    env = {"SPECTR_REPRO_RUNNERS": str(isolated_runner_registry)}
    first, second = (cli("sweep", *GRID, f"output_dir={out}", env=env) for _ in range(2))
    results = [process.communicate(timeout=900) for process in (first, second)]
    assert first.returncode == second.returncode == 0, [err[-3000:] for _, err in results]
    computed = [cells_computed(stdout) for stdout, _ in results]
    assert sum(computed) == 7, computed
    summaries = _summaries(out)
    assert len(summaries) == 7 and not list(out.rglob(CLAIM_FILE))
    for stdout, _ in results:  # each command accounts for all 7 cells
        line = next(line for line in stdout.splitlines() if " cell(s) run, " in line)
        ran, earlier = int(line.split()[0]), int(line.split(", ")[1].split()[0])
        by_others = int(line.split(", ")[2].split()[0])
        assert ran + earlier + by_others == 7, line
    # Every speed-up is against the one AR baseline, whoever measured it.
    ar = next(s for s in summaries.values() if s["method"] == "ar")
    assert {s["ar_cell_id"] for s in summaries.values()} == {ar["cell_id"]}


def test_cells_claimed_by_a_live_runner_are_left_to_it(tmp_path, capsys):
    """A method cell held by another live process is skipped; once that process is gone it is taken over."""
    out = tmp_path / "results"
    argv = [*GRID[:2], "method=sd", *GRID[3:], f"output_dir={out}"]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        from spectr_repro.launch.config import Composer, expand, parse_arguments

        with Composer() as composer:
            cfgs = expand(composer, parse_arguments(argv), use_grid=True)
        plans = execute.plan_cells([run_config(cfg) for cfg in cfgs])
        sd = next(p for p in plans if p.method == "sd")
        sd.directory.mkdir(parents=True)
        (sd.directory / CLAIM_FILE).write_text(json.dumps({
            "host": Runner().host, "pid": holder.pid, "runner": "other", "started_at": "now",
            "pid_start": process_start(holder.pid)}))
        assert main_sweep(argv) == 0
        printed = capsys.readouterr()
        assert f"skip {sd.cell_id}: computed by" in printed.err and "claimed elsewhere" in printed.out
        assert not (sd.directory / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert main_sweep(argv) == 0
    assert f"took over {sd.cell_id}" in capsys.readouterr().err
    assert (sd.directory / "summary.json").exists() and not (sd.directory / CLAIM_FILE).exists()


def test_a_live_claim_on_the_ar_baseline_is_waited_for(tmp_path, capsys, monkeypatch):
    """The methods need the AR baseline: the runner waits while another live runner holds it, and computes
    it itself once that runner is gone (dead claim taken over)."""
    out = tmp_path / "results"
    argv = [*GRID[:2], "method=sd,spectr", *GRID[3:], f"output_dir={out}"]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    from spectr_repro.launch.config import Composer, expand, parse_arguments

    with Composer() as composer:
        plans = execute.plan_cells([run_config(cfg) for cfg in expand(composer, parse_arguments(argv), use_grid=True)])
    ar = next(p for p in plans if p.method == "ar")
    ar.directory.mkdir(parents=True)
    (ar.directory / CLAIM_FILE).write_text(json.dumps({
        "host": Runner().host, "pid": holder.pid, "runner": "other", "started_at": "now",
        "pid_start": process_start(holder.pid)}))
    computed = []
    original = execute.Session._compute
    monkeypatch.setattr(execute.Session, "_compute",
                        lambda self, plan: computed.append((plan.cell_id, time.monotonic())) or original(self, plan))
    killed_at, waiting = [], threading.Event()
    run_one = execute.Session.run_one

    def run_one_and_note(self, plan):
        outcome = run_one(self, plan)
        if outcome is None and plan.method == "ar":
            waiting.set()  # the runner found the AR claimed by a live runner: it will wait
        return outcome

    monkeypatch.setattr(execute.Session, "run_one", run_one_and_note)

    def kill_later():
        # once the runner says it waits (not after a fixed delay: a loaded machine may take longer to get there)
        waiting.wait(timeout=120)
        time.sleep(0.5)
        killed_at.append(time.monotonic())
        holder.kill()
        holder.wait()

    threading.Thread(target=kill_later, daemon=True).start()
    assert main_sweep(argv) == 0
    err = capsys.readouterr().err
    assert f"waiting for AR baseline {ar.cell_id}" in err and f"took over {ar.cell_id}" in err
    assert computed[0][0] == ar.cell_id and computed[0][1] >= killed_at[0], "nothing computed before the AR"
    assert len(computed) == 3
