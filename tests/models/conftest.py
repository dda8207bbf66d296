"""Shared fixtures of the model tests."""

from __future__ import annotations

import pytest

from spectr_repro import models


@pytest.fixture
def refused_hub(monkeypatch, tmp_path):
    """The hub refuses every tokenizer load (offline), recording (hub id, revision) asked; an empty cache with
    ample disk; no pair held. Returns the record."""
    import transformers

    seen = []

    def refuse(where, **kwargs):
        seen.append((where, kwargs.get("revision")))
        raise OSError("offline")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(models.hub, "hub_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(models.hub, "free_disk_bytes", lambda path: 10**15)
    models.release_pair()
    return seen
