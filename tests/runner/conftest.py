"""Shared fixtures of the runner tests: an isolated runner registry, a config folder with a second tiny pair."""

from __future__ import annotations

import shutil

import pytest

from spectr_repro import models
from spectr_repro.conf import PACKAGED_CONF


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    """Each test sees only its own runners (other jobs on this machine do not count as contention)."""
    registry = tmp_path / "runners"
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(registry))
    return registry


@pytest.fixture
def two_tiny_conf(tmp_path, monkeypatch):
    """The packaged configs plus ``tiny_random_b`` (another seed: a distinct tiny pair); SPECTR_REPRO_CONF set."""
    conf = tmp_path / "conf"
    shutil.copytree(PACKAGED_CONF, conf, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    text = (conf / "model_pair" / "tiny_random.yaml").read_text()
    (conf / "model_pair" / "tiny_random_b.yaml").write_text(
        text.replace("name: tiny_random", "name: tiny_random_b").replace("seed: 0 ", "seed: 1 "))
    monkeypatch.setenv("SPECTR_REPRO_CONF", str(conf))
    return conf


@pytest.fixture(autouse=True)
def no_calibration(tmp_path, monkeypatch):
    """`plan` reads this machine's calibration file (written by `check`): the tests see none unless they
    write one themselves."""
    from spectr_repro.cost.calibration import CALIBRATION_ENV_VAR

    path = tmp_path / "calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV_VAR, str(path))
    return path


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No model may load; the HF cache is empty; the disk has 500 GB free (tests change it)."""
    from huggingface_hub import constants

    def no_loading(*args, **kwargs):
        raise AssertionError("the plan loaded a model")

    monkeypatch.setattr(models, "load_pair", no_loading)
    monkeypatch.setattr(models.hub, "hub_cache_dir", lambda: tmp_path / "hub")
    monkeypatch.setattr(models.hub, "free_disk_bytes", lambda path: 500 * 10**9)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path
