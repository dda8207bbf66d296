"""Typed settings at the door (spectr_repro/settings.py): one UsageError message per refusal, in the project's words."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, model_validator

from spectr_repro.errors import UsageError
from spectr_repro.settings import SETTINGS, budget_field, read_settings


class Example(BaseModel):
    model_config = SETTINGS

    count: int = Field(1, ge=1, description="an integer >= 1 (things)")
    share: float | None = Field(0.5, gt=0, lt=1, description="a number in (0, 1) or null")
    low: int = 0
    high: int = 1

    @model_validator(mode="after")
    def _ordered(self) -> Example:
        if self.low >= self.high:
            raise ValueError(f"group.low={self.low} must be below group.high={self.high}")
        return self


@pytest.mark.parametrize("values, message", [
    ({"count": 0}, "group.count must be an integer >= 1 (things), got 0"),
    ({"count": True}, "group.count must be an integer >= 1 (things), got True"),  # strict: a bool is no count
    ({"count": "3"}, "group.count must be an integer >= 1 (things), got '3'"),  # nor is a string
    ({"count": 2.0}, "group.count must be an integer >= 1 (things), got 2.0"),
    ({"share": 1}, "group.share must be a number in (0, 1) or null, got 1"),
    ({"share": float("nan")}, "group.share must be a number in (0, 1) or null, got nan"),
    ({"low": "a"}, "group.low: input should be a valid integer, got 'a'"),  # no description: pydantic's own words
    ({"low": 2, "high": 1}, "group.low=2 must be below group.high=1"),  # a check across fields, as written
])
def test_each_refusal_is_one_message_naming_the_key_and_value(values, message):
    with pytest.raises(UsageError) as refused:
        read_settings(Example, values, "group")
    assert str(refused.value) == message


def test_good_values_come_back_typed_and_frozen_and_unknown_keys_are_left_to_the_key_check():
    settings = read_settings(Example, {"count": 3, "share": None, "typo": 1}, "group")
    assert (settings.count, settings.share, settings.low) == (3, None, 0)
    with pytest.raises(ValueError):
        settings.count = 4  # frozen: what the door checked cannot change below it


class Budgeted(BaseModel):
    model_config = SETTINGS

    budget_minutes: float | None = budget_field("prompt")


@pytest.mark.parametrize("value", [-1, 0, "ten", True, float("nan"), float("inf")])
def test_a_bad_budget_is_one_usage_error(value):
    with pytest.raises(UsageError, match=r"^replay.budget_minutes must be a number of minutes > 0 \(the run stops at "
                                         r"a prompt boundary"):
        read_settings(Budgeted, {"budget_minutes": value}, "replay")


def test_a_good_budget_is_minutes():
    assert [read_settings(Budgeted, values, "replay").budget_minutes
            for values in ({}, {"budget_minutes": None}, {"budget_minutes": 2}, {"budget_minutes": 0.5})] == [
        None, None, 2, 0.5]


# --------------------------------------------------------------------------------------------------
# RunConfig: one composed config read at the door


def _values(**changes):
    values = {"K": 3, "L": 6, "num_prompts": 2, "max_new_tokens": 16, "seed": 0, "temperature": 0.4,
              "output_dir": "results", "experiment": "default", "force": False,
              "method": {"name": "sbv", "options": {"x": 1}},
              "choices": {"method": "sbv", "model_pair": "tiny_random", "dataset": "humaneval", "hardware": "cpu"},
              "model_pair": {"source": "tiny", "dtype": "float32"}, "dataset": {"options": {}},
              "hardware": {"device": "cpu", "dtype": None, "batch_prompts": 2, "prefill_chunk": 256},
              "logger": {"backend": "none", "mode": "disabled"}, "replay": {"K": [1, 3]}}
    return values | changes


def test_a_run_config_reads_every_field_from_its_values():
    from spectr_repro.settings import RunConfig

    run = RunConfig.of_values(_values())
    assert (run.K, run.L, run.num_prompts, run.max_new_tokens, run.seed, run.temperature) == (3, 6, 2, 16, 0, 0.4)
    assert (run.method, run.method_options, run.model_pair, run.dataset, run.hardware_name) == (
        "sbv", {"x": 1}, "tiny_random", "humaneval", "cpu")
    assert (run.hardware.batch_prompts, run.hardware.timed_prompts, run.hardware.prefill_chunk) == (2, 0, 256)
    assert run.dtype == "float32"  # hardware.dtype null: the pair's own
    assert run.dataset_values == {"options": {}, "name": "humaneval"}
    assert run.named_pair_values == {"source": "tiny", "dtype": "float32", "name": "tiny_random"}
    assert run.group("replay") == {"K": [1, 3]} and run.group("bias") == {}
    run.group("replay")["K"].append(5)  # a copy: the run's values never change below the door
    assert run.values["replay"] == {"K": [1, 3]}


def test_replace_checks_again_and_renames_the_method_choice():
    from spectr_repro.settings import RunConfig

    run = RunConfig.of_values(_values())
    ar = run.replace(method={"name": "ar"}, K=1, L=1)
    assert (ar.method, ar.choices["method"], ar.K, ar.L, ar.method_options) == ("ar", "ar", 1, 1, {})
    assert (run.method, run.K) == ("sbv", 3)  # the original is untouched
    with pytest.raises(UsageError, match=r"^K must be an integer >= 1 \(drafts a block\), got 0$"):
        run.replace(K=0)


@pytest.mark.parametrize("changes, message", [
    ({"K": True}, "K must be an integer >= 1 (drafts a block), got True"),
    ({"temperature": float("nan")}, "temperature must be a number >= 0 (0 = greedy), got nan"),
    ({"experiment": "a/b"}, "experiment must be a plain name, got 'a/b'"),
    ({"output_dir": ""}, "output_dir must be a path, got ''"),
    ({"method": {"name": "sbvv"}}, "method config must name a known rule (ar, "),
    ({"hardware": {"prefill_chunk": 0}}, "hardware.prefill_chunk must be an integer >= 1 or null"),
    ({"logger": {"mode": "ofline"}}, "logger.mode must be online, offline or disabled, got 'ofline'"),
])
def test_a_bad_value_anywhere_is_one_message_at_the_door(changes, message):
    from spectr_repro.settings import RunConfig

    with pytest.raises(UsageError) as refused:
        RunConfig.of_values(_values(**changes))
    assert str(refused.value).startswith(message)
