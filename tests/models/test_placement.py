"""One pair in memory at a time; offload seen through accelerate's public attributes; pinned hub revisions;
free disk checked before a download. All on CPU, with fake device maps and a fake HF cache."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from spectr_repro import models
from spectr_repro.models import (
    check_disk_for_pair,
    downloads_needed,
    load_pair,
    loaded_pair_name,
    offload_message,
    offloaded_modules,
    pair_config,
    placement,
)


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.layer = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10)


def test_a_model_spread_over_gpu_cpu_and_disk_is_offloaded():
    model = TwoLayers()
    model.hf_device_map = {"embed": 0, "layer": "cpu", "head": "disk"}  # as accelerate sets it
    assert placement(model) == {"embed": "cuda:0", "layer": "cpu", "head": "disk"}
    assert offloaded_modules(model) == ["head (disk)", "layer (cpu)"]
    model.hf_device_map = {"embed": "cuda:0", "layer": "cuda:1", "head": 1}
    assert offloaded_modules(model) == []  # several GPUs are not offload


def test_a_model_entirely_on_the_cpu_is_not_offloaded():
    model = TwoLayers()
    assert offloaded_modules(model) == []
    model.hf_device_map = {"": "cpu"}
    assert offloaded_modules(model) == []


def test_weights_left_on_meta_are_offloaded_even_without_a_device_map():
    model = TwoLayers()
    model.head = torch.nn.Linear(4, 10, device="meta")  # what disk offload hooks leave in the module
    assert offloaded_modules(model) == ["head.bias (meta)", "head.weight (meta)"]


def test_offload_message_names_pair_memory_and_the_option():
    pair = models.ModelPair(name="deepseek_33b_1.3b", target=TwoLayers(), draft=TwoLayers(), tokenizer=None,
                            eos_token_ids=(0,), vocab_size=10, device=torch.device("cpu"), dtype=torch.bfloat16,
                            offloaded={"target": ["model.layers.60 (cpu)", "lm_head (disk)"]},
                            memory_bytes=80 * 1024**3, memory_free=[(79 * 1024**3, 80 * 1024**3)])
    message = offload_message(pair)
    assert message.startswith("model pair deepseek_33b_1.3b does not fit on the accelerator: 2 target module(s)")
    assert "needs 80.0 GiB" in message and "cuda:0 79.0 of 80.0 GiB free" in message
    assert "hardware.allow_offload=true" in message


def test_loading_another_pair_releases_the_previous_one_first():
    models.release_pair()
    first = load_pair("tiny_random", device="cpu")
    alive = weakref.ref(first.target)
    assert loaded_pair_name() == "tiny_random"
    del first
    second = load_pair({**pair_config("tiny_random"), "seed": 1, "name": "tiny_random_b"}, device="cpu")
    gc.collect()
    assert alive() is None, "the first pair's weights are gone once the second is loaded"
    assert loaded_pair_name() == "tiny_random_b" and second.offloaded == {} and second.memory_bytes > 0
    assert models.release_pair() == "tiny_random_b" and loaded_pair_name() is None


# --------------------------------------------------------------------------------------------------
# Hub pairs: revisions and disk


def _deepseek(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir

    from spectr_repro.conf import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return pair_config(compose(config_name="config", overrides=["model_pair=deepseek_33b_1.3b", *overrides])
                           .model_pair)


def test_hub_pairs_carry_an_overridable_revision():
    cfg = _deepseek()
    assert cfg["target"]["revision"] == "main" and cfg["draft"]["revision"] == "main"
    pinned = _deepseek("model_pair.target.revision=" + "a" * 40)
    assert pinned["target"]["revision"] == "a" * 40
    unpinned = {**cfg, "target": {k: v for k, v in cfg["target"].items() if k != "revision"}}
    with pytest.raises(ValueError, match=r"target.revision is missing; pin the hub checkpoint"):
        pair_config(unpinned)


def test_the_revision_reaches_from_pretrained(refused_hub):
    seen = refused_hub
    with pytest.raises(ValueError, match="could not load 'deepseek-ai/deepseek-coder-33b-instruct'"):
        load_pair(_deepseek("model_pair.target.revision=abc123"), device="cpu")
    assert seen == [("deepseek-ai/deepseek-coder-33b-instruct", "abc123")]


def test_downloads_count_what_the_cache_lacks(tmp_path, monkeypatch):
    monkeypatch.setattr(models.hub, "hub_cache_dir", lambda: tmp_path)
    needed = downloads_needed(_deepseek())
    assert [(hub_id, size) for hub_id, _, size in needed] == [
        ("deepseek-ai/deepseek-coder-33b-instruct", round(33.3e9 * 2)),
        ("deepseek-ai/deepseek-coder-1.3b-instruct", round(1.35e9 * 2)),
    ]
    # The draft fully in the local cache (config.json + weights at the pinned revision): nothing to fetch.
    snapshot = tmp_path / "models--deepseek-ai--deepseek-coder-1.3b-instruct" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    with open(snapshot / "model.safetensors", "wb") as handle:
        handle.truncate(round(1.35e9 * 2))  # sparse: the size is what counts
    refs = snapshot.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("c" * 40)
    assert [size for _, _, size in downloads_needed(_deepseek())] == [round(33.3e9 * 2), 0]


def test_full_disk_is_refused_before_any_download(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setattr(models.hub, "hub_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(models.hub, "free_disk_bytes", lambda path: 50 * 10**9)
    fetched = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: fetched.append(a))
    with pytest.raises(ValueError) as refused:
        check_disk_for_pair(_deepseek())
    message = str(refused.value)
    assert "downloading 69.3 GB" in message and "50.0 GB free" in message and "HF_HOME" in message
    models.release_pair()
    with pytest.raises(ValueError, match="downloading 69.3 GB"):
        load_pair(_deepseek(), device="cpu")
    assert fetched == [], "nothing is fetched when the disk cannot hold it"
