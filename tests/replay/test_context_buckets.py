"""The replay on a long-input bucket (tiny random pair): end to end with each block's output position and the
prompt's length recorded, resume, and a bucket beyond the pair's context window or the memory refused before
loading (one message naming the largest bucket that fits, exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest

from spectr_repro.analysis.replay import read_blocks
from spectr_repro.launch import fit
from spectr_repro.replay.driver import main

BASE = ["model_pair=tiny_random", "temperature=0.7", "logger=disabled", "method=sd,sbv", "K=1,3", "L=1,2,3",
        "replay.draws=2", "max_new_tokens=12"]


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def run(tmp_path, *extra):
    return main([*BASE, f"output_dir={tmp_path / 'out'}", *extra])


def test_a_bucket_replays_end_to_end_records_positions_and_resumes(tmp_path, capsys):
    assert run(tmp_path, "dataset=longcode_1k", "num_prompts=2") == 0
    assert "2 prompt(s) replayed" in capsys.readouterr().out
    prompts = sorted((tmp_path / "out").glob("default/replay/*/prompts/*"))
    assert len(prompts) == 2
    for prompt in prompts:
        done = json.loads((prompt / "done.json").read_text())
        assert 1024 - 10 <= done["prompt_tokens"] <= 1024 and done["prompt_id"].startswith("longcode/")
        lines = [json.loads(line) for line in (prompt / "blocks.jsonl").read_text().splitlines()]
        positions = [line["output_position"] for line in lines]
        # each block starts where the tokens the reference emitted before it end
        assert positions[0] == 0
        assert positions[1:] == [p + line["reference_tokens"] for p, line in zip(positions, lines)][:-1]
    blocks, left_out = read_blocks(tmp_path / "out" / "default" / "replay")
    assert not left_out and set(blocks["dataset"]) == {"longcode_1k"}

    # resume: one prompt lost its completion marker; only it is replayed again, the other is kept untouched
    kept = prompts[1] / "blocks.jsonl"
    stamp = kept.stat().st_mtime_ns
    (prompts[0] / "done.json").unlink()
    assert run(tmp_path, "dataset=longcode_1k", "num_prompts=2") == 0
    assert "1 prompt(s) replayed, 1 finished earlier" in capsys.readouterr().out
    assert kept.stat().st_mtime_ns == stamp


def test_a_bucket_beyond_the_context_window_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("spectr_repro.launch.pairs.PairCache.pair", no_loading)
    assert run(tmp_path, "dataset=longcode_4k", "num_prompts=1") == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert "max_position_embeddings" in err and "the largest bucket that fits is dataset=longcode_1k" in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_bucket_beyond_the_free_memory_is_refused_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fit, "free_bytes", lambda device: 1)  # no memory at all: not even the weights fit
    assert run(tmp_path, "dataset=longcode_1k", "num_prompts=1") == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "no packaged bucket fits" in err
    assert not (tmp_path / "out").exists()


def test_the_largest_fitting_bucket_is_named_from_the_pairs_config():
    # The Qwen pair (its shipped architecture, nothing loaded) at K=7, L=6, 256 new tokens in bfloat16: weights
    # 4-5 GiB (an untied head when converted), KV caches ~41 kB a position on 8 rows: 9 GiB free (85 % usable) hold the
    # 8K bucket, not the 16K one.
    from spectr_repro.launch.config import Composer, context_window, expand, parse_arguments
    from spectr_repro.settings import run_config

    with Composer() as composer:
        cfg = run_config(expand(composer, parse_arguments(["dataset=longcode_16k", "max_new_tokens=256", "K=7",
                                                           "L=6", "method=sbv"]), use_grid=False)[0])
    window = context_window(cfg.pair_values) or (32768, "the Qwen models")
    with pytest.raises(fit.UsageError, match="the largest bucket that fits is dataset=longcode_8k"):
        fit.check_context_fits(cfg, 7, 6, window, free=9 * 2**30)
    fit.check_context_fits(cfg, 7, 6, window, free=32 * 2**30)  # fits with room
    # hardware.memory_gb, when set, is the device's memory whatever is free now (as for a batch): a reviewer can ask
    # whether a bucket fits a 24 GB machine while another run holds most of this one's.
    sized = cfg.model_copy(update={"hardware": cfg.hardware.model_copy(update={"memory_gb": 40.0})})
    fit.check_context_fits(sized, 7, 6, window, free=1)
    small = cfg.model_copy(update={"hardware": cfg.hardware.model_copy(update={"memory_gb": 9 * 2**30 / 1e9})})
    with pytest.raises(fit.UsageError, match=r"GiB, hardware.memory_gb\); the largest bucket that fits is "
                                             r"dataset=longcode_8k"):
        fit.check_context_fits(small, 7, 6, window, free=64 * 2**30)
    need = fit.context_need(fit_pair(cfg), 16384, 256, 6, 7, 2)
    assert 3.5e9 < need.weight_bytes < 5.5e9 and need.positions == 16384 + 256 + 7


def fit_pair(cfg):
    from spectr_repro.models import pair_config

    return pair_config(cfg.named_pair_values)
