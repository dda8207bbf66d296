"""Typed settings at a command's door: a config group's values checked by a pydantic model, and every refusal one
UsageError message in the project's words ("replay.batch_prompts must be an integer >= 1 ..., got 0").

A command declares its settings as a frozen pydantic model (types, ranges and each field's description say what
is allowed), reads them once with :func:`read_settings`, and passes the typed object down: nothing below the door
re-checks a raw config. Models are strict (no "3" for 3, no True for 1): a config's values arrive typed from
YAML and Hydra, so a string or a bool where a number belongs is a typo the user should hear about.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spectr_repro.errors import UsageError
from spectr_repro.verify import VERIFIERS

Model = TypeVar("Model", bound=BaseModel)

# What a command's settings model starts from: strict types, frozen, and keys the model does not declare left to
# the config's own key check (launch.config.check_nested_keys names a typo with its closest key).
SETTINGS = ConfigDict(strict=True, frozen=True, extra="ignore")


def budget_field(unit: str) -> Any:
    """``<command>.budget_minutes``: None (no budget) or a finite number of minutes > 0; the run stops at a ``unit``
    boundary (launch.signals.Budget)."""
    return Field(None, gt=0, allow_inf_nan=False,
                 description=f"a number of minutes > 0 (the run stops at a {unit} boundary once the next would not "
                             f"fit) or null (no budget)")


def read_settings(model: type[Model], values: Mapping[str, Any], prefix: str) -> Model:
    """``model`` built from ``values`` (a config group as plain Python values); UsageError with one message
    naming ``prefix.<field>`` otherwise. A field's refusal reads "<prefix>.<field> must be <its description>,
    got <value>"; a check across fields (a model validator) gives its own message."""
    try:
        return model.model_validate(dict(values))
    except ValidationError as error:
        raise UsageError(refusal(model, error, prefix)) from None


def refusal(model: type[BaseModel], error: ValidationError, prefix: str) -> str:
    """The first problem of ``error`` as one sentence (a user fixes one thing at a time, as with every refusal)."""
    first = error.errors(include_url=False)[0]
    location = [part for part in first["loc"] if isinstance(part, str)]
    if not location:  # a model validator: its ValueError's message, as written
        return str(first.get("ctx", {}).get("error", first["msg"]))
    key = f"{prefix}.{location[0]}" if prefix else location[0]  # no prefix: a top-level key (K, temperature)
    field = model.model_fields.get(location[0])
    if field is not None and field.description:
        return f"{key} must be {field.description}, got {first['input']!r}"
    return f"{key}: {first['msg'].lower()}, got {first['input']!r}"  # pydantic's own words


class LoggerSettings(BaseModel):
    """The ``logger`` group (conf/logger/*.yaml), typed: a misspelt mode is refused at the door (exit 2), not
    taken for "log nothing"."""

    model_config = SETTINGS

    backend: Literal["wandb", "none"] = Field("none", description="wandb or none")
    mode: Literal["online", "offline", "disabled"] = Field("disabled", description="online, offline or disabled")
    project: str | None = Field(None, description="a W&B project name or null (WANDB_PROJECT, else spectr_repro)")
    entity: str | None = Field(None, description="a W&B entity or null (WANDB_ENTITY, else your default)")


def logger_settings(logger: LoggerSettings | Mapping[str, Any]) -> LoggerSettings:
    """The logger group's values checked (UsageError naming ``logger.<key>``); a LoggerSettings as it is."""
    if isinstance(logger, LoggerSettings):
        return logger
    values = OmegaConf.to_container(logger, resolve=True) if isinstance(logger, DictConfig) else dict(logger)
    return read_settings(LoggerSettings, values, "logger")


_COUNT = "an integer >= 1"


class HardwareSettings(BaseModel):
    """The ``hardware`` group (conf/hardware/*.yaml), typed. ``batch_prompts``/``timed_prompts`` null read as their
    defaults (1, 0), as they always have."""

    model_config = SETTINGS

    device: str = Field("cpu", description="a device name (cpu, cuda, cuda:1)")
    dtype: str | None = Field(None, description="a torch dtype name or null (the pair's own)")
    batch_prompts: int = Field(1, ge=1, description=_COUNT)
    timed_prompts: int = Field(0, ge=0, description="an integer >= 0")
    prefill_chunk: int | None = Field(None, ge=1, description=f"{_COUNT} or null (a prompt in one call)")
    compile: bool = Field(False, description="true or false")
    allow_offload: bool = Field(False, description="true or false")
    memory_gb: float | None = Field(None, gt=0, allow_inf_nan=False,
                                    description="a number of GB > 0 or null (the device's free memory now)")
    estimate: dict[str, Any] | None = None  # the cost model's roofline (spectr_repro.cost)

    @field_validator("batch_prompts", "timed_prompts", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info) -> Any:
        return cls.model_fields[info.field_name].default if value is None else value


class RunConfig(BaseModel):
    """One composed config (a sweep's cell, a replay's group, a bias setting, check's base), resolved and checked
    once at the command's door by :func:`run_config`; everything below the door takes it, never a raw config.

    ``values`` is the whole config resolved to plain Python (what identifies a cell, its config.yaml, W&B's config);
    the typed fields are read from it, so the two never disagree. Treat ``values`` as read-only: :meth:`replace`
    gives a changed copy."""

    model_config = SETTINGS

    K: int = Field(ge=1, description=f"{_COUNT} (drafts a block)")
    L: int = Field(ge=1, description=f"{_COUNT} (tokens a draft)")
    num_prompts: int = Field(ge=1, description=_COUNT)
    max_new_tokens: int = Field(ge=1, description=_COUNT)
    seed: int = Field(description="an integer")
    temperature: float = Field(ge=0, allow_inf_nan=False, description="a number >= 0 (0 = greedy)")
    method: str
    output_dir: str = Field(min_length=1, description="a path")
    experiment: str = Field(min_length=1, pattern=r"^[^/]+$", description="a plain name")
    force: bool = Field(False, description="true or false")
    choices: dict[str, str | None] = Field(default_factory=dict)  # config group -> the option composed
    hardware: HardwareSettings = Field(default_factory=HardwareSettings)
    logger: LoggerSettings | None = None
    values: dict[str, Any] = Field(default_factory=dict, repr=False)

    @classmethod
    def of_values(cls, values: Mapping[str, Any]) -> RunConfig:
        """Checked from a resolved config (UsageError with one message: the key, what it must be, what it was)."""
        method = values.get("method")
        name = method.get("name") if isinstance(method, Mapping) else None
        if name != "ar" and name not in VERIFIERS:
            raise UsageError(f"method config must name a known rule (ar, {', '.join(VERIFIERS)}), got {name!r}")
        fields = {key: values.get(key) for key in ("K", "L", "num_prompts", "max_new_tokens", "seed", "temperature",
                                                   "output_dir", "experiment")}
        if values.get("force") is not None:
            fields["force"] = values["force"]
        hardware = read_settings(HardwareSettings, values.get("hardware") or {}, "hardware")
        logger = logger_settings(values["logger"]) if values.get("logger") is not None else None
        return read_settings(cls, {**fields, "method": name, "choices": dict(values.get("choices") or {}),
                                   "hardware": hardware, "logger": logger, "values": dict(values)}, "")

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with top-level keys of ``values`` replaced (``method=`` a method group's values, whose name also
        becomes ``choices.method``), checked again."""
        values = copy.deepcopy(self.values)
        values.update(copy.deepcopy(changes))
        if "method" in changes:
            values["choices"] = {**values.get("choices", {}), "method": changes["method"]["name"]}
        return RunConfig.of_values(values)

    @property
    def method_options(self) -> dict[str, Any]:
        """The rule's options (``method.options``); {} when it has none."""
        return dict(self.values["method"].get("options") or {})

    @property
    def model_pair(self) -> str:
        """The pair's name (its config group option)."""
        return str(self.choices.get("model_pair"))

    @property
    def dataset(self) -> str:
        return str(self.choices.get("dataset"))

    @property
    def hardware_name(self) -> str:
        return str(self.choices.get("hardware"))

    @property
    def pair_values(self) -> dict[str, Any] | None:
        """The ``model_pair`` node resolved (None: the config names the pair only)."""
        node = self.values.get("model_pair")
        return copy.deepcopy(node) if node else None

    @property
    def named_pair_values(self) -> dict[str, Any]:
        """The pair's config with its name (``models.pair_config`` takes it)."""
        node = self.pair_values or {}
        return node | {"name": node.get("name") or self.model_pair}

    @property
    def dataset_values(self) -> dict[str, Any]:
        """The ``dataset`` node resolved, with its name (``data.load_examples`` takes it)."""
        node = copy.deepcopy(self.values.get("dataset") or {})
        node.setdefault("name", self.dataset)
        return node

    @property
    def dtype(self) -> str:
        """The dtype the target runs in: ``hardware.dtype``, else the pair's own (float32 by default)."""
        return str(self.hardware.dtype or (self.pair_values or {}).get("dtype") or "float32")

    def as_dict(self) -> dict[str, Any]:
        """The whole config resolved, a copy (W&B's config, a check's record)."""
        return copy.deepcopy(self.values)

    def group(self, name: str) -> dict[str, Any]:
        """Another section of the config (``replay``, ``bias``, ``runner``) as plain values; {} when absent."""
        node = self.values.get(name)
        return copy.deepcopy(node) if isinstance(node, Mapping) else {}


def run_config(cfg: DictConfig) -> RunConfig:
    """The door: a composed config resolved (Hydra's own node aside) and checked (UsageError, exit 2)."""
    values = OmegaConf.to_container(cfg, resolve=True)
    values.pop("hydra", None)
    return RunConfig.of_values(values)


__all__ = ["SETTINGS", "HardwareSettings", "LoggerSettings", "RunConfig", "budget_field", "logger_settings",
           "read_settings", "refusal", "run_config"]
