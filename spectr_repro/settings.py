"""Typed settings at a command's door: a config group's values checked by a pydantic model, and every refusal one
UsageError message in the project's words ("replay.batch_prompts must be an integer >= 1 ..., got 0").

A command declares its settings as a frozen pydantic model (types, ranges and each field's description say what
is allowed), reads them once with :func:`read_settings`, and passes the typed object down: nothing below the door
re-checks a raw config. Models are strict (no "3" for 3, no True for 1): a config's values arrive typed from
YAML and Hydra, so a string or a bool where a number belongs is a typo the user should hear about.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spectr_repro.errors import UsageError

Model = TypeVar("Model", bound=BaseModel)

# What a command's settings model starts from: strict types, frozen, and keys the model does not declare left to
# the config's own key check (runner.config.check_nested_keys names a typo with its closest key).
SETTINGS = ConfigDict(strict=True, frozen=True, extra="ignore")


def budget_field(unit: str) -> Any:
    """``<command>.budget_minutes``: None (no budget) or a finite number of minutes > 0; the run stops at a ``unit``
    boundary (runner.signals.Budget)."""
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
    field = model.model_fields.get(location[0])
    if field is not None and field.description:
        return f"{prefix}.{location[0]} must be {field.description}, got {first['input']!r}"
    return f"{prefix}.{location[0]}: {first['msg'].lower()}, got {first['input']!r}"  # pydantic's own words


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


__all__ = ["SETTINGS", "LoggerSettings", "budget_field", "logger_settings", "read_settings", "refusal"]
