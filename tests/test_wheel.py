"""A built wheel runs without the source tree: configs and the paper's numbers ship inside the package.

Builds the wheel from this checkout, installs it into a fresh virtual environment (its dependencies are
borrowed from the test's environment through a path file, so nothing is downloaded), and from a folder
outside the checkout runs ``--help``, a tiny ``run`` and ``report`` on what it wrote.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(args, cwd, env, timeout=600):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources (setuptools writes build/ and *.egg-info beside them)."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    shutil.copytree(REPO / "spectr_repro", source / "spectr_repro",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
          "-w", str(out)], cwd=out, env=os.environ.copy())
    (path,) = out.glob("spectr_repro-*.whl")
    return path


def test_the_wheel_carries_configs_and_paper_numbers(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "spectr_repro/conf/config.yaml" in names
    assert "spectr_repro/conf/model_pair/tiny_random.yaml" in names
    assert "spectr_repro/conf/hydra/launcher/slurm.yaml" in names
    assert "spectr_repro/paper_numbers.csv" in names
    assert "spectr_repro/cost/accelerators.yaml" in names  # the roofline's spec-sheet figures
    assert not any(name.startswith(("tests/", "conf/")) for name in names)


def test_an_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=os.environ.copy())
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, env=os.environ.copy()).stdout.strip())
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
          str(wheel)], cwd=tmp_path, env=os.environ.copy())
    # Dependencies from this environment, added after the venv's own site-packages (a .pth line does not
    # run that folder's own .pth files, so the checkout's editable install stays out).
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "SPECTR_REPRO_CONF")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(python), "-c", "import spectr_repro; print(spectr_repro.__file__)"], cwd=work, env=env)
    assert where.stdout.strip().startswith(str(site)), where.stdout

    help_text = _run([str(python), "-m", "spectr_repro", "--help"], cwd=work, env=env).stdout
    assert "tiny_random" in help_text and "bench" in help_text
    out = work / "results"
    _run([str(python), "-m", "spectr_repro", "run", "model_pair=tiny_random", "dataset=humaneval", "method=sd",
          "K=1", "L=2", "num_prompts=1", "max_new_tokens=4", "logger=disabled", f"output_dir={out}"],
         cwd=work, env=env)
    (summary,) = (out / "default" / "cells").glob("sd-*/summary.json")
    assert (summary.parent / "config.yaml").is_file()
    _run([str(python), "-m", "spectr_repro", "report", str(out / "default")], cwd=work, env=env)
    assert "Block efficiency" in (out / "default" / "REPORT.md").read_text()
