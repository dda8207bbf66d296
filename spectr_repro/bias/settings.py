"""The bias command's settings, typed at the door: the ``bias:`` config group read once into a frozen
:class:`BiasSettings`, or refused with one message (exit 2) before any model loads; each setting of the run (cells
that differ only by the rule) as one :class:`BiasSetting`, which everything below the command takes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator

from spectr_repro.bias.estimators import TEST_VERSION
from spectr_repro.errors import UsageError
from spectr_repro.settings import SETTINGS, LoggerSettings, RunConfig, budget_field, logger_settings, read_settings
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


def bias_settings(run: RunConfig) -> BiasSettings:
    """The config's ``bias`` section checked (UsageError with one message)."""
    if not isinstance(run.values.get("bias"), dict):
        raise UsageError("the config has no `bias` section (conf/config.yaml)")
    values = run.group("bias")
    values["sample_cap"] = values.get("sample_cap") or {}
    return read_settings(BiasSettings, values, "bias")


def bias_folder(run: RunConfig) -> Path:
    """``<output_dir>/<experiment>/bias``: the run's contexts and its table."""
    return Path(run.output_dir).expanduser() / run.experiment / "bias"


@dataclass(frozen=True)
class BiasSetting:
    """One setting: what its draft sets depend on (:meth:`values`, whose JSON names its folder), the rules that judge
    them, where it writes, and the config read at the door that its pair and prompts are loaded from (``run``:
    ``launch.pairs`` takes it)."""

    model_pair: str
    dataset: str
    K: int
    L: int
    temperature: float
    draft_temperature: float  # the draft's temperature (the target's unless bias.draft_temperature is set)
    seed: int
    num_prompts: int
    bias: BiasSettings
    hardware: dict[str, Any]
    model_pair_config: dict[str, Any]
    folder: Path  # bias_folder
    logger: LoggerSettings
    run: RunConfig = field(repr=False, compare=False)
    methods: tuple[str, ...] = ()

    @classmethod
    def of(cls, run: RunConfig, methods: tuple[str, ...] = ()) -> BiasSetting:
        bias = bias_settings(run)
        draft_temperature = run.temperature if bias.draft_temperature is None else bias.draft_temperature
        return cls(run.model_pair, run.dataset, run.K, run.L, run.temperature, float(draft_temperature), run.seed,
                   run.num_prompts, bias, run.group("hardware"), run.group("model_pair"), bias_folder(run),
                   logger_settings(run.logger or {}), run, methods)

    @property
    def prefill_chunk(self) -> int | None:
        return self.hardware.get("prefill_chunk")

    def values(self) -> dict[str, Any]:
        """What the draft sets depend on (setting.json). Its JSON names the folder (:attr:`id`): a change of a value's
        type or of a key would orphan every context measured so far (tests/bias pins the names)."""
        b = self.bias
        return {
            "model_pair": self.model_pair, "dataset": self.dataset, "K": self.K, "L": self.L,
            "temperature": self.temperature, "draft_temperature": self.draft_temperature, "seed": self.seed,
            "num_prompts": self.num_prompts, "samples": b.samples, "batch": b.batch, "rule_calls": b.rule_calls,
            "continuation_tokens": b.continuation_tokens, "contexts_per_prompt": b.contexts_per_prompt,
            "sample_cap": dict(b.sample_cap),
            "contexts": "cuts where max p is nearest 1/2",  # the rule of contexts_of (a change of it is a new setting)
            "test": TEST_VERSION,  # the per-context results are the test's: a new test is a new setting
            "hardware": self.hardware, "model_pair_config": self.model_pair_config,
        }

    @property
    def id(self) -> str:
        digest = hashlib.sha1(json.dumps(self.values(), sort_keys=True).encode()).hexdigest()[:8]
        return (f"{self.model_pair}__{self.dataset}__K{self.K}_L{self.L}_T{self.temperature:g}"
                f"_Tq{self.draft_temperature:g}__{digest}")

    @property
    def contexts_key(self) -> tuple:
        """Settings that differ only by rule, K or L share their contexts (the AR continuation's cuts)."""
        return (self.model_pair, self.dataset, self.temperature, self.seed, self.num_prompts,
                self.bias.continuation_tokens, self.bias.contexts_per_prompt)

    @property
    def contexts_folder(self) -> Path:
        return self.folder / "contexts" / self.id


def bias_setting_groups(runs: list[RunConfig]) -> list[BiasSetting]:
    """The run's settings in grid order, each with its rules in order (cells sharing all but the rule)."""
    groups: dict[str, tuple[BiasSetting, list[str]]] = {}
    for run in runs:
        setting = BiasSetting.of(run)
        setting, methods = groups.setdefault(setting.id, (setting, []))
        if run.method not in methods:
            methods.append(run.method)
    return [BiasSetting.of(setting.run, tuple(methods)) for setting, methods in groups.values()]


__all__ = ["BiasSetting", "BiasSettings", "bias_folder", "bias_setting_groups", "bias_settings"]
