"""The bias command's settings, typed at the door: the ``bias:`` config group read once into a frozen
:class:`BiasSettings`, or refused with one message (exit 2) before any model loads."""

from __future__ import annotations

from typing import Annotated

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, Field, field_validator

from spectr_repro.errors import UsageError
from spectr_repro.settings import SETTINGS, budget_field, read_settings
from spectr_repro.verify import VERIFIERS


class BiasSettings(BaseModel):
    """How many draft sets each context gets and how they are drawn; what the run may spend."""

    model_config = SETTINGS

    samples: int = Field(ge=1, description="an integer >= 1 (draft sets per context)")
    batch: int = Field(ge=1, description="an integer >= 1 (draft sets drafted together)")
    rule_calls: int = Field(ge=1, description="an integer >= 1 (rule calls per draft set)")
    continuation_tokens: int = Field(ge=0, description="an integer >= 0 (the AR continuation cut into contexts)")
    contexts_per_prompt: int = Field(ge=1, description="an integer >= 1")
    draft_temperature: float | None = Field(None, gt=0, allow_inf_nan=False,
                                            description="null (the target's temperature) or a number > 0")
    sample_cap: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="a map of registered rules to integers >= 1 (draft sets a rule judges)")
    budget_minutes: float | None = budget_field("context")

    @field_validator("sample_cap")
    @classmethod
    def _registered_rules(cls, caps: dict[str, int]) -> dict[str, int]:
        if any(method not in VERIFIERS for method in caps):
            raise ValueError("unknown rule")
        return caps


def bias_settings(cfg: DictConfig) -> BiasSettings:
    """``cfg.bias`` checked (UsageError with one message)."""
    if not isinstance(cfg.get("bias"), DictConfig):
        raise UsageError("the config has no `bias` section (conf/config.yaml)")
    values = OmegaConf.to_container(cfg.bias, resolve=True)
    values["sample_cap"] = values.get("sample_cap") or {}
    return read_settings(BiasSettings, values, "bias")


__all__ = ["BiasSettings", "bias_settings"]
