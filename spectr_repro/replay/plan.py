"""The shared-block replay's part of ``plan``: what ``python -m spectr_repro replay <same arguments>`` costs.

An experiment that declares a ``replay:`` block (cpu_quick, paper_main; ``make reproduce`` runs its replay
after the sweep) gets its lines beside the timed cells (``plan`` adds the calibration its predictions need and
the total, ``spectr_repro.plan``). The groups (pair, dataset, temperature, ...) and their folders are the
replay's own (``replay.folders.parse``, ``GroupSettings.folder``, ``prompt_finished``); prompts already finished
there are counted and not planned again. Per prompt left:

    prefill of target and draft + iterations x (one target call over K_max x (L_max + 1) tokens
                                                + L_max draft forwards over K_max rows + rules seconds per block)

with iterations = ceil(max_new_tokens / the reference's block efficiency): measured in the group's folder (mean
``reference_tokens`` of its finished blocks), else what ``expected_block_efficiency`` gives a cell of the reference
(method, K, L) (the paper's value for the pair and dataset, at its T=0.4, or a finished cell here), else measured in
the replay's other groups, else (L+1)/2. Model calls cost what the cells' do (this machine's calibration when
``check`` wrote one, else ``hardware.estimate``), scaled by what the prompts finished on this machine (device model
and dtype) took, less their rules, over what that cost model gives the same prompts: the group's own prompts where
it has some, else all of the replay's (``hardware.estimate`` is fitted to one CPU and dtype; on a 2-core AVX2 Intel
Xeon in float32 a 1K-token context prompt took 3 times its price). The rules' seconds per block are the mean
``rule_seconds`` of the finished blocks of the replay's groups (same pair, hardware and grid), of those replayed on
this device's model in this dtype where there are any (a record from another CPU says little of this one); with none
finished they are not estimated (counted 0, and said so).

With ``replay.batch_prompts`` B > 1 the prompts left are priced a batch at a time (full batches, then a short last
one): a batch's prefills are its prompts' (each chunk on the context the earlier ones left), and each of its calls
is one target forward over B x K_max rows x (L_max + 1) tokens, the B prompts' pending tokens through the draft,
and L_max - 1 draft steps over B x K_max rows, on the calls' mean context (``cost.prompt_seconds(batch=B)``: from
the calibration, interpolated in rows x tokens where it did not measure B x K_max rows; else from the hardware's
estimate, whose forwards read the weights once for all B x K_max rows and pay attention per row over its cached
context). The rules' seconds per block do not change with B (each prompt's rules run on its own blocks).

A long-input bucket that the context window or the memory cannot hold (``launch.fit.check_context_fits``, the check
the replay makes before loading: ``hardware.memory_gb`` when set, else the memory free now) is still priced, with a
note that the replay refuses it and why.

The default ``replay:`` block of config.yaml (datasets null) is no planned replay: ``plan K=3`` prints none.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from spectr_repro.cost import (
    CellSpec,
    calibration_for,
    expected_block_efficiency,
    model_calls_source,
    prompt_seconds,
)
from spectr_repro.cost.model import rule_seconds_per_block
from spectr_repro.environment import device_name
from spectr_repro.errors import UsageError
from spectr_repro.launch.config import conf_dir, context_window
from spectr_repro.launch.fit import check_batch_fits, check_context_fits
from spectr_repro.launch.pairs import pair_config_of
from spectr_repro.logs import format_duration
from spectr_repro.records import read_record_text
from spectr_repro.replay.folders import (
    BLOCKS_FILE,
    changed_settings,
    parse,
    prompt_directory,
    prompt_finished,
    prompt_state,
)
from spectr_repro.settings import RunConfig


@dataclass
class ReplayGroup:
    dataset: str
    temperature: float
    prompts: int  # the group's num_prompts
    finished: int = 0
    block_efficiency: float = 1.0  # the reference's tokens per block
    block_efficiency_source: str = ""
    iterations: int = 0  # blocks per prompt left
    model_seconds: float = 0.0  # model calls of the prompts left
    blocks: int = 0  # blocks of the prompts left (their rules are rules seconds per block x this)
    rule_seconds_per_block: float | None = None  # measured at this temperature; None: the replay's pooled mean
    note: str = ""  # e.g. the folder holds a replay with other settings

    @property
    def to_replay(self) -> int:
        return self.prompts - self.finished


@dataclass
class ReplayPlan:
    command: str
    pair: str = ""
    hardware: str = ""
    K_max: int = 0
    L_max: int = 0
    reference: str = ""
    folder: Path | None = None
    groups: list[ReplayGroup] = field(default_factory=list)
    model_note: str = ""
    rule_seconds_per_block: float | None = None
    rules_note: str = "rules not estimated (no finished replay here)"
    error: str = ""  # the replay refuses these arguments
    arguments: tuple[str, ...] = ()  # the command's arguments (``check`` calibrates the same experiment)
    K_values: tuple[int, ...] = ()  # the replay's grid of K and L (and its reference's): the shapes whose
    L_values: tuple[int, ...] = ()  # seconds per call its predictions need (``spectr_repro.plan.calibration``)
    configs: list[RunConfig] = field(default_factory=list)  # one per group (dataset x temperature)

    @property
    def model_seconds(self) -> float:
        return sum(g.model_seconds for g in self.groups)

    @property
    def rule_seconds(self) -> float:
        return sum(self.group_rule_seconds(g) for g in self.groups)

    def group_rule_seconds(self, group: ReplayGroup) -> float:
        """The group's blocks at its temperature's seconds per block (the rules' work grows with T: SpecTr's
        exact rho at T = 0.7 takes several times its T = 0.1 time on the same shapes), else at the pooled mean."""
        pooled = self.rule_seconds_per_block or 0.0
        return (pooled if group.rule_seconds_per_block is None else group.rule_seconds_per_block) * group.blocks

    @property
    def seconds(self) -> float:
        return self.model_seconds + self.rule_seconds


def declares_replay(experiment: str | None, argv: Sequence[str]) -> bool:
    """The experiment's config has a ``replay:`` block, or the command line sets ``replay.*`` keys."""
    if any(a.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "replay" for a in argv):
        return True
    if not experiment:
        return False
    path = conf_dir() / "experiment" / f"{experiment}.yaml"
    return path.is_file() and "replay" in (OmegaConf.load(path) or {})


def replay_only(experiment: str | None) -> bool:
    """The experiment is a replay and nothing else: a ``replay:`` block and no ``grid`` (e.g. replay_qwen).
    Its cells are not part of its plan: ``sweep`` would run only the base cell, which nobody asked for."""
    if not experiment:
        return False
    path = conf_dir() / "experiment" / f"{experiment}.yaml"
    config = (OmegaConf.load(path) or {}) if path.is_file() else {}
    return "replay" in config and "grid" not in config


def plan_replays(commands: Sequence[tuple[Sequence[str], str | None]], measured: dict[tuple, float]
                 ) -> list[ReplayPlan]:
    """The replay plan of each (arguments, experiment name) of the plan whose experiment declares a replay,
    one per (pair, hardware) of its groups. ``measured``: block efficiency of finished cells (``Plan``'s)."""
    plans = []
    for argv, experiment in commands:
        if not declares_replay(experiment, argv):
            continue
        command = f"python -m spectr_repro replay {' '.join(argv)}".strip()
        try:
            groups = parse(argv)
        except UsageError as error:
            plans.append(ReplayPlan(command, error=str(error)))
            continue
        by_pair: dict[tuple[str, str], list] = {}
        for group in groups:
            by_pair.setdefault((group.model_pair, group.run.hardware_name), []).append(group)
        plans.extend(_plan_pair(command, members, measured, tuple(argv)) for members in by_pair.values())
    return plans


def batch_prices(groups: Sequence) -> dict[Path, float]:
    """Seconds a batch (``replay.batch_prompts``) of each group's prompts left should take, model calls and rules,
    at the plan's price: what a budgeted replay expects of a group it has not timed yet (a T = 0.7 batch takes
    several times a T = 0.1 one, a 16K prompt several times an 8K one). Groups with nothing left are absent."""
    by_pair: dict[tuple[str, str], list] = {}
    for group in groups:
        by_pair.setdefault((group.model_pair, group.run.hardware_name), []).append(group)
    prices = {}
    for members in by_pair.values():
        plan = _plan_pair("", members, {}, check_fits=False)
        for member, group in zip(members, plan.groups):
            if group.to_replay > 0:
                seconds = group.model_seconds + plan.group_rule_seconds(group)
                prices[member.folder] = seconds / group.to_replay * min(member.settings.batch_prompts,
                                                                        group.to_replay)
    return prices


def _plan_pair(command: str, groups: list, measured: dict[tuple, float], arguments: tuple[str, ...] = (),
               check_fits: bool = True) -> ReplayPlan:
    """The replay groups of one pair and hardware (one experiment's folder); ``check_fits`` False: price only (the
    replay itself checked the batch against the memory at its door, before this memory was its own)."""
    first = groups[0]
    run, settings = first.run, first.settings
    plan = ReplayPlan(command, pair=run.model_pair, hardware=run.hardware_name, K_max=settings.K_max,
                      L_max=settings.L_max, reference=f"{settings.reference} K={settings.reference_K} "
                      f"L={settings.reference_L}", folder=first.root, arguments=arguments,
                      K_values=tuple(sorted({*settings.K_values, settings.reference_K})),
                      L_values=tuple(sorted({*settings.L_values, settings.reference_L})),
                      configs=[group.run for group in groups])
    for group in groups if check_fits else ():  # a batch that cannot fit is refused here too, before any pricing
        check_batch_fits(group.run, group.settings.batch_prompts, group.settings.K_max, group.settings.L_max,
                         "replay.batch_prompts")
    calibration = calibration_for(run)
    plan.model_note = model_calls_source(CellSpec.of(run), calibration)
    if settings.batch_prompts > 1:
        plan.model_note += (f"; {settings.batch_prompts} prompts a batch ({settings.batch_prompts} x "
                            f"{settings.K_max} rows a call)")
    folders = [(group.folder, [] if group.force else changed_settings(group.folder, group.meta())) for group in groups]
    finished = [[] if changed else _finished(folder) for folder, changed in folders]
    blocks = [[block for prompt in own for block in prompt.blocks] for own in finished]
    # Seconds are measured on this device's model in this dtype where there are any (the same rules and forwards
    # take twice as long on another CPU kind), else on whatever replayed the prompts.
    here = [[prompt for prompt in own if prompt.device == device_name(run.hardware.device)
             and prompt.dtype == run.dtype] for own in finished]
    per_temperature = _price_rules(plan, groups, blocks, here, run)
    pooled = [b["reference_tokens"] for group in blocks for b in group if "reference_tokens" in b]
    pair = pair_config_of(run) if calibration is None else None
    scales = [_measured_over_modelled(CellSpec.of(member.run), pair, member.settings, calibration, own)
              for member, own in zip(groups, here)]
    pooled_scale = _pooled_scale(scales)
    if pooled_scale is not None:
        prompts = sum(n for _, _, n in filter(None, scales))
        plan.model_note += (f"; x {pooled_scale:.2f}, what {prompts} prompt(s) finished here took over what it "
                            f"gives them (each group's own where it has some)")
    for member, (folder, changed), own, scale in zip(groups, folders, blocks, scales):
        run, settings = member.run, member.settings
        cell = CellSpec.of(run)
        group = ReplayGroup(run.dataset, run.temperature, settings.num_prompts)
        group.finished = _finished_prompts(folder, settings.num_prompts) if not (changed or run.force) else 0
        if changed:
            group.note = (f"{folder.name} holds a replay with other settings ({', '.join(changed)}): the replay "
                          f"refuses it without force=true")
        try:  # a long-input bucket the context window or the memory cannot hold: priced, and named here
            check_context_fits(run, settings.K_max, settings.L_max, context_window(run.pair_values))
        except UsageError as error:
            group.note = f"the replay refuses {run.dataset} here: {error}"
        group.block_efficiency, group.block_efficiency_source = _reference_block_efficiency(
            cell, settings, own, pooled, measured)
        group.iterations = math.ceil(run.max_new_tokens / group.block_efficiency)
        group.blocks = group.to_replay * group.iterations
        factor = (scale[0] / scale[1]) if scale else (pooled_scale or 1.0)
        group.model_seconds = factor * _model_seconds(cell, pair, settings, calibration, group.to_replay,
                                                      group.iterations)
        group.rule_seconds_per_block = per_temperature[run.temperature]
        plan.groups.append(group)
    return plan


def _price_rules(plan: ReplayPlan, groups: list, blocks: list[list[dict]], here: list[list[FinishedPrompt]],
                 run: RunConfig) -> dict[float, float | None]:
    """The rules' seconds per block, pooled (``plan.rule_seconds_per_block``, said in ``plan.rules_note``) and at
    each temperature: of the blocks replayed here (``here``, per group) where there are any, else of every block."""
    timed = [[block for prompt in own for block in prompt.blocks] for own in here] if any(here) else blocks
    plan.rule_seconds_per_block, plan.rules_note = rule_seconds_per_block(b for group in timed for b in group)
    if any(here):
        plan.rules_note += f" (replayed on this {device_name(run.hardware.device)} in {run.dtype})"
    by_temperature: dict[float, list[dict]] = {}
    for member, own in zip(groups, timed):
        by_temperature.setdefault(member.temperature, []).extend(own)
    per_temperature = {T: rule_seconds_per_block(own)[0] for T, own in by_temperature.items()}
    if sum(seconds is not None for seconds in per_temperature.values()) > 1:
        plan.rules_note += " (by temperature: " + ", ".join(
            f"T={T:g} {seconds:.3g} s" for T, seconds in sorted(per_temperature.items()) if seconds is not None
        ) + (", the mean where a temperature has none)" if None in per_temperature.values() else ")")
    return per_temperature


def _model_seconds(cell: CellSpec, pair: dict | None, settings, calibration, prompts: int, iterations: int
                   ) -> float:
    """The model calls of ``prompts`` prompts of ``iterations`` blocks each, replayed ``settings.batch_prompts`` at
    a time (full batches and a last short one, B x K_max rows a call): this machine's calibration, else the
    hardware's estimate (``cost.prompt_seconds``)."""
    batch = max(1, int(settings.batch_prompts))
    full, rest = divmod(prompts, batch)
    return sum(prompt_seconds(cell, pair, calibration, settings.K_max, settings.L_max, iterations, size) or 0.0
               for size in [batch] * full + ([rest] if rest else []))


def _reference_block_efficiency(cell: CellSpec, settings, own: list[dict], pooled: list[float],
                                measured: dict[tuple, float]) -> tuple[float, str]:
    """The reference's tokens per block in this group, and where the number comes from."""
    tokens = [b["reference_tokens"] for b in own if "reference_tokens" in b]
    if tokens:
        return statistics.fmean(tokens), f"measured: {len(tokens)} block(s) of this group here"
    reference = dataclasses.replace(cell, method=settings.reference, K=settings.reference_K, L=settings.reference_L)
    value, source = expected_block_efficiency(reference, measured)
    if source in ("paper", "measured"):
        return value, source if source == "paper" else "measured by finished cells here"
    if pooled:
        return statistics.fmean(pooled), f"measured: {len(pooled)} block(s) of other groups of this replay"
    return value, source


def _finished_prompts(folder: Path, num_prompts: int) -> int:
    """Prompts 0 .. num_prompts-1 of the group already replayed (``done.json`` written)."""
    return sum(prompt_finished(prompt_directory(folder, index)) for index in range(num_prompts))


@dataclass
class FinishedPrompt:
    """What the plan reads of one finished prompt: its block lines, its wall time (a batch's share), and where."""

    blocks: list[dict]
    seconds: float | None  # done.json's (None: not recorded)
    batch: int  # prompts replayed together with it
    device: str | None  # the device model it was replayed on
    dtype: str | None

    @property
    def model_seconds(self) -> float | None:
        """Its wall time less its blocks' rules: the model calls, prefill and bookkeeping (None: not recorded)."""
        if self.seconds is None:
            return None
        return self.seconds - sum(block.get("rule_seconds", 0.0) for block in self.blocks)


def _finished(folder: Path) -> list[FinishedPrompt]:
    """Every finished prompt of the group's folder (those beyond num_prompts too)."""
    prompts = []
    for directory in sorted((folder / "prompts").glob("*")):
        state = prompt_state(directory)
        if state.finished:
            done = state.done or {}
            recorded = done.get("environment") or {}
            text = read_record_text(directory / BLOCKS_FILE)  # as written, or its sealed .gz copy (committed results)
            prompts.append(FinishedPrompt([json.loads(line) for line in text.splitlines() if line],
                                          done.get("seconds"), int(done.get("batch_prompts", 1)),
                                          recorded.get("device_name"), recorded.get("dtype")))
    return prompts


def _measured_over_modelled(cell: CellSpec, pair: dict | None, settings, calibration,
                            prompts: list[FinishedPrompt]) -> tuple[float, float, int] | None:
    """(measured model seconds, what the cost model gives the same prompts, prompts) of a group's prompts finished
    on this machine; None without any. Their ratio scales the group's price: the cost model's rates are fitted to
    one CPU and dtype (conf/hardware/cpu.yaml), its own prompts say what this machine does."""
    pairs = []
    for prompt in prompts:
        measured = prompt.model_seconds
        modelled = prompt_seconds(cell, pair, calibration, settings.K_max, settings.L_max, len(prompt.blocks),
                                  prompt.batch)
        if measured is not None and measured > 0 and modelled:
            pairs.append((measured, modelled / prompt.batch))
    if not pairs:
        return None
    return sum(m for m, _ in pairs), sum(m for _, m in pairs), len(pairs)


def _pooled_scale(scales: list[tuple[float, float, int] | None]) -> float | None:
    """Measured over modelled, over every group's prompts finished here (the scale of a group without any)."""
    known = [scale for scale in scales if scale]
    if not known:
        return None
    return sum(m for m, _, _ in known) / sum(m for _, m, _ in known)


# --------------------------------------------------------------------------------------------------
# Text


def format_replay(plan: ReplayPlan) -> list[str]:
    if plan.error:
        return [f"Replay (shared blocks, `{plan.command}`): not planned, the replay refuses these arguments: "
                f"{plan.error}"]
    datasets = len(dict.fromkeys(g.dataset for g in plan.groups))
    temperatures = len(dict.fromkeys(g.temperature for g in plan.groups))
    prompts = "/".join(str(p) for p in dict.fromkeys(g.prompts for g in plan.groups))
    values = [g.block_efficiency for g in plan.groups if g.to_replay]
    sources = ", ".join(f"{s} ({n} group{'s' * (n > 1)})" for s, n in Counter(
        g.block_efficiency_source for g in plan.groups if g.to_replay).items())
    efficiency = (f"{min(values):.2f}" if min(values) == max(values) else f"{min(values):.2f}-{max(values):.2f}"
                  ) if values else "-"
    rules = format_duration(plan.rule_seconds) if plan.rule_seconds_per_block is not None else "0 s"
    lines = [f"Replay (shared blocks, `{plan.command}`): {datasets} dataset{'s' * (datasets > 1)} x "
             f"{temperatures} temperature{'s' * (temperatures > 1)} x {prompts} prompts, blocks of K_max x L_max = "
             f"{plan.K_max} x {plan.L_max}, est. {format_duration(plan.seconds)} (model calls "
             f"{format_duration(plan.model_seconds)} + rules {rules}; model calls: {plan.model_note}; "
             f"{plan.rules_note})"]
    total = sum(g.prompts for g in plan.groups)
    finished = sum(g.finished for g in plan.groups)
    lines.append(f"  {plan.pair} on {plan.hardware}: {total:,} prompts, {finished:,} finished, {total - finished:,} "
                 f"to replay, {sum(g.blocks for g in plan.groups):,} blocks (reference {plan.reference}: "
                 f"{efficiency} tokens per block, {sources or 'nothing left'}); in {plan.folder}")
    lines += [f"  note: {g.note}" for g in plan.groups if g.note]
    return lines


def replay_lines(replays: Sequence[ReplayPlan]) -> list[str]:
    """The replays' own lines (``plan`` adds the calibration and the total)."""
    return [line for replay in replays for line in format_replay(replay)]


__all__ = ["ReplayGroup", "ReplayPlan", "batch_prices", "declares_replay", "format_replay", "plan_replays",
           "replay_lines", "replay_only"]
