"""The replay's settings, typed at the door: the ``replay:`` config group and the command line's grid (``method=``,
``K=``, ``L=``) read once into a frozen :class:`ReplaySettings`, or refused with one message (exit 2)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from spectr_repro.errors import UsageError
from spectr_repro.replay.core import ROW_GROUPS, check_grid
from spectr_repro.replay.support import SUPPORT_TAIL_MASS
from spectr_repro.settings import SETTINGS, LoggerSettings, RunConfig, budget_field, logger_settings, read_settings
from spectr_repro.verify import VERIFIERS

_LOSSLESS = ", ".join(name for name, spec in VERIFIERS.items() if spec.lossless)
_INTEGER = "an integer >= 1"


class ReplaySettings(BaseModel):
    """What one replay computes on each block (the grid, the reference that walks the trajectory, the draws) and
    how (batch, support, budget). ``as_dict`` is the part a group's folder is tied to."""

    model_config = SETTINGS

    methods: tuple[str, ...]
    K_values: tuple[int, ...]
    L_values: tuple[int, ...]
    reference: str = Field("sbv", description=f"a lossless rule ({_LOSSLESS}): its text must have the target's law")
    reference_K: int = Field(3, ge=1, description=_INTEGER)
    reference_L: int = Field(6, ge=1, description=_INTEGER)
    draws: int = Field(8, ge=1, description=f"{_INTEGER} (Monte-Carlo draws a block of a sampled rule)")
    num_prompts: int = Field(ge=1, description=_INTEGER)
    row_groups: str = Field("disjoint", description=f"one of {', '.join(ROW_GROUPS)}")
    sampled: tuple[str, ...] = ()  # rules taken by their sampler's draws (replay.sampled), not their closed form
    # Prompts replayed together (replay.batch_prompts): how the blocks are computed, not which blocks, so it is
    # not a setting of the group's folder (as_dict): a folder started at one batch size resumes at another.
    batch_prompts: int = Field(1, ge=1, description=f"{_INTEGER} (prompts replayed together)")
    # Rules judged on each block's support (replay.support_mass; replay/support.py): also how, not which blocks (the
    # values move within the rules' float rounding), so not a setting of the folder either. None: every token.
    support_mass: float | None = Field(
        SUPPORT_TAIL_MASS, gt=0, lt=1, allow_inf_nan=False,
        description="a number in (0, 1) (the most mass of a row pooled into the block's tail token) or null "
                    "(every token)")
    # replay.budget_minutes: the command's, not the folder's (None: no budget)
    budget_minutes: float | None = budget_field("prompt")

    @field_validator("reference")
    @classmethod
    def _lossless_reference(cls, reference: str) -> str:
        if reference not in VERIFIERS or not VERIFIERS[reference].lossless:
            raise ValueError("not a lossless rule")
        return reference

    @field_validator("row_groups")
    @classmethod
    def _known_row_groups(cls, row_groups: str) -> str:
        if row_groups not in ROW_GROUPS:
            raise ValueError("unknown row groups")
        return row_groups

    @model_validator(mode="after")
    def _consistent(self) -> ReplaySettings:
        check_grid(list(self.methods), list(self.K_values), list(self.L_values), self.draws)
        if VERIFIERS[self.reference].single_draft and self.reference_K != 1:
            raise ValueError(f"replay.reference {self.reference} verifies a single draft: set replay.reference_K=1")
        unknown = [m for m in self.sampled if m not in self.methods]
        if unknown:
            raise ValueError(f"replay.sampled names rules the replay does not run: {', '.join(unknown)} "
                             f"(it runs {', '.join(self.methods)})")
        return self

    @property
    def K_max(self) -> int:
        return max(*self.K_values, self.reference_K)

    @property
    def L_max(self) -> int:
        return max(*self.L_values, self.reference_L)

    def as_dict(self) -> dict[str, Any]:
        return {"methods": list(self.methods), "K": list(self.K_values), "L": list(self.L_values),
                "reference": self.reference, "reference_K": self.reference_K, "reference_L": self.reference_L,
                "draws": self.draws, "row_groups": self.row_groups,
                **({"sampled": list(self.sampled)} if self.sampled else {})}


@dataclass(frozen=True)
class GroupSettings:
    """One group of a replay command (a pair, dataset and temperature: one folder): its trajectories' settings,
    typed, and the replay's. ``run``, the composed config read at the door, is what the runner's pair cache, prompt
    loader and the checks every command shares take."""

    model_pair: str
    dataset: str
    temperature: float
    max_new_tokens: int
    seed: int
    dtype: str  # hardware.dtype ("None": the pair's own): how the models run, recorded per prompt, not the folder's
    device: str
    prefill_chunk: int | None
    force: bool
    output_dir: Path
    experiment: str
    logger: LoggerSettings  # the logger group
    settings: ReplaySettings
    run: RunConfig = field(repr=False, compare=False)

    @classmethod
    def of(cls, run: RunConfig, settings: ReplaySettings) -> GroupSettings:
        return cls(model_pair=run.model_pair, dataset=run.dataset, temperature=run.temperature,
                   max_new_tokens=run.max_new_tokens, seed=run.seed, dtype=str(run.hardware.dtype),
                   device=run.hardware.device, prefill_chunk=run.hardware.prefill_chunk, force=run.force,
                   output_dir=Path(run.output_dir), experiment=run.experiment,
                   logger=logger_settings(run.logger or {}), settings=settings, run=run)

    @property
    def root(self) -> Path:
        """``<output_dir>/<experiment>/replay``: the folder of every group of the experiment."""
        return self.output_dir / self.experiment / "replay"

    @property
    def name(self) -> str:
        """One folder per (pair, dataset, temperature, length, seed, reference, device). Not the number of prompts:
        a larger num_prompts extends a smaller one (the seeded selection keeps its first prompts), so a replay
        grows in its folder, prompt by prompt. Not the dtype either: which dtype is fast depends on the CPU (bfloat16
        on AVX512-BF16, float32 on AVX2 only, 3-4x apart on the verify forward), and a folder accumulates prompts
        over sessions on machines of either kind, as it does over CPU models. Each prompt's done.json records the
        dtype it ran in (its environment); the report compares laws, which rounding does not move."""
        s = self.settings
        identity = {"model_pair": self.model_pair, "dataset": self.dataset, "temperature": self.temperature,
                    "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                    "reference": [s.reference, s.reference_K, s.reference_L], "device": self.device}
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.model_pair}__{self.dataset}__T{self.temperature:g}__{digest}"

    @property
    def folder(self) -> Path:
        return self.root / self.name

    def meta(self) -> dict[str, Any]:
        """replay.json: the settings the group's folder is tied to (num_prompts aside, which a later run extends;
        the dtype is each prompt's, in its done.json)."""
        return {"model_pair": self.model_pair, "dataset": self.dataset, "temperature": self.temperature,
                "num_prompts": self.settings.num_prompts, "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                **self.settings.as_dict()}

    def prompt_seed(self, index: int) -> int:
        """The engine's seed of prompt ``index`` (the replay's own draws derive from it:
        ``trajectories.replay_generator``)."""
        return self.seed * 100_003 + index


def _integers(key: str, values: Sequence[Any]) -> tuple[int, ...]:
    """The command line's K= / L= values (strings) or the config's, as distinct integers in their order."""
    try:
        numbers = [int(str(v)) for v in values]
    except ValueError:
        raise UsageError(f"{key} must be integers >= 1, got {','.join(map(str, values))}") from None
    return tuple(dict.fromkeys(numbers))


def settings_of(run: RunConfig, grid: dict[str, list[str]]) -> ReplaySettings:
    """The replay's grid and reference, checked (UsageError with one message). ``grid``: the command line's
    method=/K=/L= values, which override the experiment's replay.methods/K/L."""
    replay = run.group("replay")
    methods = grid.get("method") or replay.get("methods") or list(VERIFIERS)
    values = {**replay,
              "methods": tuple(dict.fromkeys(str(m) for m in methods)),
              "K_values": _integers("K", grid.get("K") or replay.get("K") or [1]),
              "L_values": _integers("L", grid.get("L") or replay.get("L") or [run.L]),
              "num_prompts": replay.get("num_prompts") or run.num_prompts,
              "sampled": tuple(str(m) for m in replay.get("sampled") or ())}
    return read_settings(ReplaySettings, values, "replay")


__all__ = ["GroupSettings", "ReplaySettings", "settings_of"]
