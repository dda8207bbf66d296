"""A weights file that is there but damaged (a truncated model.safetensors) gives one message naming the
folder to delete and the fix, in the converted-model cache and in the HF hub cache alike (issue 26)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from spectr_repro import models
from spectr_repro.models.tiny import make_byte_tokenizer


def _write_truncated_model(folder: Path) -> None:
    """A small Llama saved as an HF folder whose model.safetensors is then cut to half its size."""
    config = LlamaConfig(vocab_size=272, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(config).save_pretrained(folder)
    make_byte_tokenizer().save_pretrained(folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(os.path.getsize(weights) // 2)


def test_a_truncated_converted_model_names_its_folder_and_make_models(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "qwen2.5-coder-1.5b-instruct"
    _write_truncated_model(folder)
    _write_truncated_model(tmp_path / "models" / "qwen2.5-coder-0.5b-instruct")
    models.release_pair()
    with pytest.raises(ValueError) as refused:
        models.load_pair("qwen25coder_1.5b_0.5b", device="cpu", dtype="float32")
    message = str(refused.value)
    assert f"the converted model in {folder} is damaged" in message
    assert "Delete that folder and run `make models`" in message


def test_a_truncated_file_in_the_hub_cache_names_the_cache_folder(tmp_path, monkeypatch):
    import huggingface_hub.constants

    hub_id = "deepseek-ai/deepseek-coder-1.3b-instruct"
    repo = tmp_path / ("models--" + hub_id.replace("/", "--"))
    commit = "c" * 40
    _write_truncated_model(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models.hub, "free_disk_bytes", lambda path: 10**15)
    pair = {"name": "damaged_hub_pair", "source": "hub", "dtype": "float32",
            "target": {"hub_id": hub_id, "revision": "main"}, "draft": {"hub_id": hub_id, "revision": "main"}}
    models.release_pair()
    with pytest.raises(ValueError) as refused:
        models.load_pair(pair, device="cpu")
    message = str(refused.value)
    assert f"a weights file of {hub_id} in the HF hub cache is damaged" in message
    assert f"Delete {repo} and run the command again" in message
