import shutil
import subprocess
from pathlib import Path

import pytest

from spectr_repro.conf import conf_dir

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(*args):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "reproduce", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines()]


def _position(lines, text):
    matches = [i for i, line in enumerate(lines) if text in line]
    assert matches, f"{text!r} not among the steps:\n" + "\n".join(lines)
    return matches[0]


def test_make_reproduce_cpu_default_steps_in_order():
    lines = _dry_run()
    steps = [
        "scripts/make_models.py",
        "-m spectr_repro sweep experiment=cpu_quick",
        "-m spectr_repro theory",
        "-m spectr_repro audit",
        "-m spectr_repro report results/cpu_quick",
        "results/cpu_quick/REPORT.md",
    ]
    positions = [_position(lines, step) for step in steps]
    assert positions == sorted(positions)
    assert not any("+experiment=" in line for line in lines)  # `+` fails: the group is already in defaults


def test_make_reproduce_paper_preset_runs_the_paper_grid_without_cpu_models():
    lines = _dry_run("PRESET=paper")
    for experiment in ("paper_main", "ablation_K", "ablation_L", "ablation_T"):
        _position(lines, f"sweep experiment={experiment}")
        assert (conf_dir() / "experiment" / f"{experiment}.yaml").is_file()
    assert _position(
        lines, "report results/paper_main results/ablation_K results/ablation_L results/ablation_T"
    )
    assert not any("make_models.py" in line for line in lines)


def test_make_reproduce_calibrates_with_the_real_weights_after_the_sweep():
    """Every preset measures the seconds per call of its predicted speed-ups (`check`, real weights: its default)
    right after the timed cells and before the report (PRESET=paper in full, cpu_quick quick: its smallest and
    largest L); the random-weight check that gates the run comes first."""
    def real_weight_checks(lines):
        return [i for i, line in enumerate(lines) if "-m spectr_repro check " in line and "random_weights" not in line]

    lines = _dry_run("PRESET=paper")
    (calibration,) = real_weight_checks(lines)
    assert "check experiment=paper_main" in lines[calibration] and "check.quick" not in lines[calibration]
    assert _position(lines, "sweep experiment=ablation_T") < calibration < _position(lines, "spectr_repro report")
    lines = _dry_run()
    (calibration,) = real_weight_checks(lines)
    assert "check experiment=cpu_quick" in lines[calibration] and "check.quick=true" in lines[calibration]
    assert _position(lines, "make_models.py") < _position(lines, "sweep experiment=cpu_quick") < calibration
    assert calibration < _position(lines, "spectr_repro report")
