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
