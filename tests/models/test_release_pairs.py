"""The SpecTr-GBV release's pairs (Llama-2 7B/13B targets, JackFram llama-68m/160m drafts): configs by hub id,
pinned draft revisions, and loading tested offline (nothing is downloaded: from_pretrained is replaced)."""

from __future__ import annotations

import pytest

from spectr_repro import models
from spectr_repro.models import downloads_needed, load_pair, pair_config

RELEASE_PAIRS = {
    "llama2_7b_68m": ("meta-llama/Llama-2-7b-hf", "JackFram/llama-68m"),
    "llama2_7b_160m": ("meta-llama/Llama-2-7b-hf", "JackFram/llama-160m"),
    "llama2_13b_68m": ("meta-llama/Llama-2-13b-hf", "JackFram/llama-68m"),
    "llama2_13b_160m": ("meta-llama/Llama-2-13b-hf", "JackFram/llama-160m"),
}
DRAFT_COMMITS = {"JackFram/llama-68m": "0359bbda21c69b1426e785b7f64ba782c3296f31",
                 "JackFram/llama-160m": "b6ff1b85ab5dff915f1d35d11a6e3ca392c4f5bd"}


def _pair(name: str, *overrides: str) -> dict:
    from hydra import compose, initialize_config_dir

    from spectr_repro.conf import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return pair_config(compose(config_name="config", overrides=[f"model_pair={name}", *overrides]).model_pair)


@pytest.mark.parametrize("name", sorted(RELEASE_PAIRS))
def test_release_pairs_name_the_hub_checkpoints_in_fp16(name):
    cfg = _pair(name)
    target, draft = RELEASE_PAIRS[name]
    assert (cfg["source"], cfg["dtype"]) == ("hub", "float16")
    assert cfg["target"]["hub_id"] == target and cfg["draft"]["hub_id"] == draft
    assert cfg["draft"]["revision"] == DRAFT_COMMITS[draft] and len(cfg["target"]["revision"]) > 0


@pytest.mark.parametrize("name", ["llama2_7b_68m", "llama2_13b_160m"])
def test_release_pair_revisions_reach_from_pretrained_offline(refused_hub, name):
    seen = refused_hub
    target, _ = RELEASE_PAIRS[name]
    with pytest.raises(ValueError, match=f"could not load '{target}'"):
        load_pair(_pair(name, "model_pair.target.revision=" + "b" * 40), device="cpu")
    assert seen == [(target, "b" * 40)]


def test_release_pair_downloads_are_counted_from_the_model_cards(tmp_path, monkeypatch):
    monkeypatch.setattr(models.hub, "hub_cache_dir", lambda: tmp_path)
    assert [(hub_id, size) for hub_id, _, size in downloads_needed(_pair("llama2_7b_160m"))] == [
        ("meta-llama/Llama-2-7b-hf", round(6.74e9 * 2)),
        ("JackFram/llama-160m", round(0.162e9 * 2)),
    ]
