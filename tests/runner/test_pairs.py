"""The model-pair cache the commands share: one pair in memory, loaded once, released before another."""

from __future__ import annotations

import pytest

from spectr_repro import models
from spectr_repro.errors import ResourceError
from spectr_repro.launch.config import Composer, expand, parse_arguments
from spectr_repro.launch.pairs import PairCache
from spectr_repro.settings import run_config

ARGS = ["dataset=humaneval", "method=sd", "num_prompts=1", "max_new_tokens=2", "logger=disabled"]


def composed(*overrides: str):
    with Composer() as composer:
        return run_config(expand(composer, parse_arguments([*ARGS, *overrides]), use_grid=True)[0])


def test_a_pair_is_loaded_once_and_released_before_the_next(two_tiny_conf):
    said, loading = [], []
    pairs = PairCache(echo=said.append, on_load=loading.append)
    first = pairs.pair(composed("model_pair=tiny_random"))
    assert pairs.pair(composed("model_pair=tiny_random")) is first  # the same pair: nothing loaded again
    examples = pairs.examples(composed("model_pair=tiny_random"), first.tokenizer)
    assert len(examples) == 1 and pairs.examples(composed("model_pair=tiny_random"), first.tokenizer) is examples
    pairs.pair(composed("model_pair=tiny_random_b"))
    assert models.loaded_pair_name() == "tiny_random_b"
    pairs.release()
    assert models.loaded_pair_name() is None
    assert said == ["loading model pair tiny_random",
                    "released model pair tiny_random (memory freed before the next pair)",
                    "loading model pair tiny_random_b",
                    "released model pair tiny_random_b (memory freed before the next pair)"]
    assert loading == ["tiny_random", "tiny_random_b"]


def test_a_pair_that_cannot_load_is_a_resource_error(tmp_path):
    run = composed("model_pair=tiny_random")
    run = run.replace(model_pair=run.pair_values | {"source": "hub"})  # no pinned revisions: refused before download
    with pytest.raises(ResourceError, match="cannot load model pair tiny_random"):
        PairCache(echo=lambda message: None).pair(run)
