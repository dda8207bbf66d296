"""Running cells: models loaded once per pair, one AR baseline per group, warm-up, timing, records.

A *group* is everything that fixes the AR baseline: model pair, hardware, dataset, temperature,
prompt set (num_prompts, seed) and max_new_tokens. The AR cell of a group (method "ar", K=1, L=1)
runs once, before the group's other methods, and every method cell's speed-up is
AR wall time / method wall time over the same prompts.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from tqdm.auto import tqdm

from spectr_repro import tracking
from spectr_repro.environment import environment
from spectr_repro.records import CellSummary, PromptRecord, as_json, pooled_metrics
from spectr_repro.runner import batched, store
from spectr_repro.runner.config import conf_dir, needs_single_draft, single_draft_message

WARMUP_TOKENS = 8
WARMUP_PROMPT_TOKENS = 32  # warm-up needs the kernels, not the whole prompt (CPU prefill is slow)


# --------------------------------------------------------------------------------------------------
# Planning


class ResourceError(RuntimeError):
    """A model pair or dataset cannot be loaded (missing weights or data): reported without a traceback."""


@dataclass
class CellPlan:
    cfg: DictConfig
    cell_id: str
    directory: Path
    ar_cell_id: str | None  # None for the AR cell itself
    skip_note: str | None = None

    @property
    def method(self) -> str:
        return self.cfg.method.name


@dataclass
class CellOutcome:
    plan: CellPlan
    status: str  # "ran", "finished earlier", "skipped"
    summary: dict[str, Any] | None = None
    note: str | None = None


def ar_config(cfg: DictConfig) -> DictConfig:
    """The AR baseline cell of ``cfg``'s group: method ar, K=1, L=1, everything else equal."""
    ar = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(ar):
        ar.method = OmegaConf.load(conf_dir() / "method" / "ar.yaml")
        ar.choices.method = "ar"
        ar.K = 1
        ar.L = 1
    return ar


def plan_cells(cfgs: Sequence[DictConfig]) -> list[CellPlan]:
    """Plans in run order: per pair and group, the AR cell first; K>1 single-draft cells skipped."""
    plans: dict[str, CellPlan] = {}
    for cfg in cfgs:
        if cfg.method.name == "ar":
            cfg = ar_config(cfg)
        identifier = store.cell_id(cfg)
        if identifier in plans:
            continue
        if needs_single_draft(cfg):
            plans[identifier] = CellPlan(cfg, identifier, store.cell_dir(cfg, identifier), None,
                                         skip_note=single_draft_message(cfg))
            continue
        ar_id = None
        if cfg.method.name != "ar":
            ar = ar_config(cfg)
            ar_id = store.cell_id(ar)
            if ar_id not in plans:
                plans[ar_id] = CellPlan(ar, ar_id, store.cell_dir(ar, ar_id), None)
        plans[identifier] = CellPlan(cfg, identifier, store.cell_dir(cfg, identifier), ar_id)

    def order(plan: CellPlan):
        group = plan.ar_cell_id or plan.cell_id
        return (plan.cfg.choices.model_pair, plan.cfg.choices.hardware, group, plan.method != "ar")

    return sorted(plans.values(), key=order)  # sorted() is stable: grid order within a group


# --------------------------------------------------------------------------------------------------
# Prompts and stop strings


def stop_checker(tokenizer, stop_strings: Sequence[str]) -> Callable[[list[int]], bool] | None:
    """should_stop(new_tokens) for the engine: True once the decoded text contains a stop string."""
    stops = tuple(s for s in stop_strings if s)
    if not stops:
        return None

    def should_stop(new_tokens: list[int]) -> bool:
        text = tokenizer.decode(new_tokens, skip_special_tokens=True)
        return any(stop in text for stop in stops)

    return should_stop


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """The completion up to (not including) the earliest stop string."""
    cut = min((i for i in (text.find(s) for s in stop_strings if s) if i >= 0), default=len(text))
    return text[:cut]


# --------------------------------------------------------------------------------------------------
# Running


@dataclass
class Session:
    """State shared by the cells of one command: loaded pairs, prompt sets, AR timings."""

    force: bool = False
    echo: Callable[[str], None] = field(default=lambda message: tqdm.write(message, file=sys.stderr))
    progress: bool = True
    _examples: dict[tuple, list] = field(default_factory=dict)
    _ar_times: dict[str, tuple[dict[str, float], bool]] = field(default_factory=dict)
    _ran: set[str] = field(default_factory=set)

    # -- resources -----------------------------------------------------------------------------
    def pair(self, cfg: DictConfig):
        from spectr_repro.models import load_pair  # cached per process by the models module

        try:
            return load_pair(_pair_argument(cfg), device=cfg.hardware.device, dtype=cfg.hardware.dtype)
        except (ValueError, OSError, ImportError) as error:  # missing weights, unreachable hub, bad config
            raise ResourceError(f"cannot load model pair {cfg.choices.model_pair}: {error}") from error

    def examples(self, cfg: DictConfig, tokenizer) -> list:
        from spectr_repro.data import load_examples

        dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
        dataset.setdefault("name", cfg.choices.dataset)
        key = (cfg.choices.model_pair, repr(dataset), cfg.num_prompts, cfg.seed)
        if key not in self._examples:
            try:
                self._examples[key] = load_examples(dataset, cfg.num_prompts, seed=cfg.seed,
                                                    tokenizer=tokenizer)
            except (ValueError, OSError, ImportError) as error:  # missing data folder or file
                raise ResourceError(f"cannot load dataset {cfg.choices.dataset}: {error}") from error
        return self._examples[key]

    # -- cells -----------------------------------------------------------------------------------
    def run(self, plans: Sequence[CellPlan], on_cell: Callable[[CellOutcome], None] | None = None
            ) -> list[CellOutcome]:
        outcomes = []
        bar = tqdm(plans, desc="cells", unit="cell", file=sys.stderr, disable=not self.progress,
                   dynamic_ncols=True)
        for plan in bar:
            bar.set_postfix_str(plan.cell_id[:60])
            outcome = self.run_one(plan)
            outcomes.append(outcome)
            if on_cell is not None:
                on_cell(outcome)
        bar.close()
        return outcomes

    def run_one(self, plan: CellPlan) -> CellOutcome:
        if plan.skip_note:
            self.echo(f"skip {plan.cell_id}: {plan.skip_note}")
            return CellOutcome(plan, "skipped", note=plan.skip_note)
        recompute = self.force and plan.cell_id not in self._ran
        if store.is_finished(plan.directory) and not recompute:
            if plan.cell_id not in self._ran:
                self.echo(f"skip {plan.cell_id}: finished earlier ({plan.directory / 'summary.json'})")
            summary = store.read_summary(plan.directory)
            return CellOutcome(plan, "finished earlier" if plan.cell_id not in self._ran else "ran", summary)
        summary = self._compute(plan)
        self._ran.add(plan.cell_id)
        return CellOutcome(plan, "ran", summary)

    def _ar_times_for(self, plan: CellPlan) -> tuple[dict[str, float], bool]:
        """Per-prompt AR wall times of the plan's group, and whether they were measured in this process."""
        if plan.ar_cell_id in self._ar_times:
            return self._ar_times[plan.ar_cell_id]
        directory = store.cell_dir(plan.cfg, plan.ar_cell_id)
        if not store.is_finished(directory):
            raise RuntimeError(f"AR baseline {plan.ar_cell_id} is missing; it must run before {plan.cell_id}")
        times = {r["prompt_id"]: r["wall_time_s"] for r in store.read_records(directory)}
        self._ar_times[plan.ar_cell_id] = (times, False)
        return self._ar_times[plan.ar_cell_id]

    def _compute(self, plan: CellPlan) -> dict[str, Any]:
        from spectr_repro.data import encode_prompt
        from spectr_repro.engine.loop import acceptance_by_position, generate
        from spectr_repro.engine.timing import SectionTimer

        cfg = plan.cfg
        method = plan.method
        pair = self.pair(cfg)
        examples = self.examples(cfg, pair.tokenizer)
        if not examples:
            raise RuntimeError(f"dataset {cfg.choices.dataset} gave no prompts")
        ar_times, ar_same_process = ({}, True) if method == "ar" else self._ar_times_for(plan)
        options = cfg.method.get("options")
        options = OmegaConf.to_container(options, resolve=True) if options is not None else {}
        temperature = float(cfg.temperature)

        def decode(input_ids, max_new_tokens, seed, should_stop=None):
            return generate(pair.target, pair.draft, input_ids, method=method, K=cfg.K, L=cfg.L,
                            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                            eos_token_ids=pair.eos_token_ids, should_stop=should_stop,
                            verifier_options=options or None, vocab_size=pair.vocab_size,
                            prefill_chunk=cfg.hardware.get("prefill_chunk"),
                            compile=bool(cfg.hardware.get("compile", False)))

        prompts = [encode_prompt(pair.tokenizer, example)[0].tolist() for example in examples]
        # Warm-up (kernels, allocator, lazy init) so the first timed prompt is not charged for it.
        decode(prompts[0][-WARMUP_PROMPT_TOKENS:], min(WARMUP_TOKENS, cfg.max_new_tokens), seed=cfg.seed + 10**9)

        def seed_of(index):
            return cfg.seed * 100_003 + index

        def stop_of(index):
            return stop_checker(pair.tokenizer, tuple(getattr(examples[index], "stop_strings", ()) or ()))

        # Batched block efficiency (hardware.batch_prompts > 1, runner.batched): all but the timed prompts.
        split = batched.split_prompts(cfg.hardware, len(prompts))
        batched_outputs, batched_wall = batched.decode_batches(pair, cfg, method, options, prompts, split, seed_of,
                                                               stop_of, self.progress)

        timer = SectionTimer(pair.device)
        records, pooled_accepted, pooled_blocks, time_split = [], [], [], {}
        bar = tqdm(list(zip(examples, prompts)), desc=f"{method} K={cfg.K} L={cfg.L}", unit="prompt",
                   leave=False, file=sys.stderr, disable=not self.progress, dynamic_ncols=True)
        tokens = calls = 0
        for index, (example, input_ids) in enumerate(bar):
            stop_strings = tuple(getattr(example, "stop_strings", ()) or ())
            key = f"wall_{index}"
            if index in batched_outputs:
                out, wall = batched_outputs[index], None  # decoded in a batch: BE only, never timed
            else:
                with timer(key):
                    out = decode(input_ids, cfg.max_new_tokens, seed=seed_of(index),
                                 should_stop=stop_checker(pair.tokenizer, stop_strings))
                wall = timer.seconds.pop(key)
            tokens += len(out.new_tokens)
            calls += out.target_calls
            accepted = list(out.stats.get("accepted_lengths", []))
            blocks = list(out.stats.get("block_lengths", []))
            pooled_accepted.extend(accepted)
            pooled_blocks.extend(blocks)
            for section, seconds in out.stats.get("time_s", {}).items():
                time_split[section] = time_split.get(section, 0.0) + seconds
            text = pair.tokenizer.decode(out.new_tokens, skip_special_tokens=True)
            prompt_id = str(example.id)
            records.append(PromptRecord(
                prompt_id=prompt_id,
                method=method,
                K=cfg.K,
                L=cfg.L,
                temperature=temperature,
                seed=cfg.seed,
                prompt_tokens=len(input_ids),
                new_tokens=len(out.new_tokens),
                target_calls=out.target_calls,
                block_efficiency=out.block_efficiency,
                wall_time_s=wall,
                ar_wall_time_s=None if wall is None else wall if method == "ar" else ar_times.get(prompt_id),
                completion=truncate_at_stop(text, stop_strings),
                reference=getattr(example, "reference", None),
                accepted_lengths=accepted,
                block_lengths=blocks,
                dataset=cfg.choices.dataset,
                model_pair=cfg.choices.model_pair,
                batch_prompts=out.stats.get("batch_prompts", 1),
            ))
            bar.set_postfix(BE=f"{tokens / calls:.2f}" if calls else "-")
        bar.close()

        missing = [r.prompt_id for r in records if r.wall_time_s is not None and r.ar_wall_time_s is None]
        if missing:
            raise RuntimeError(f"AR baseline {plan.ar_cell_id} has no record for prompts {missing[:5]}")
        rows = [as_json(r) for r in records]
        summary = CellSummary(
            experiment=cfg.experiment,
            cell_id=plan.cell_id,
            method=method,
            method_options=options,
            dataset=cfg.choices.dataset,
            model_pair=cfg.choices.model_pair,
            hardware=cfg.choices.hardware,
            K=cfg.K,
            L=cfg.L,
            temperature=temperature,
            seed=cfg.seed,
            max_new_tokens=cfg.max_new_tokens,
            **pooled_metrics(rows),  # tokens, target calls, pooled BE, wall times, speed-up, tokens/s
            acceptance_by_position=(
                [] if method == "ar" else acceptance_by_position(pooled_accepted, cfg.L, pooled_blocks)),
            time_split=time_split,
            ar_cell_id=plan.ar_cell_id or plan.cell_id,
            ar_same_process=ar_same_process,
            environment=environment(str(pair.device)),
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            batch_prompts=split.batch_prompts,
            batched_wall_time_s=batched_wall,
        )
        summary = as_json(summary)
        store.write_cell(plan.directory, rows, summary, config=plan.cfg)
        if method == "ar":
            self._ar_times[plan.cell_id] = ({r["prompt_id"]: r["wall_time_s"] for r in rows}, True)
        self._log(plan, summary, rows)
        return summary

    def _log(self, plan: CellPlan, summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
        if not tracking.enabled(plan.cfg.logger):
            return
        started = time.perf_counter()
        config = OmegaConf.to_container(plan.cfg, resolve=True)
        config["cell_id"] = plan.cell_id
        try:
            run_dir = tracking.log_cell(plan.cfg.logger, store.experiment_dir(plan.cfg), plan.cfg.experiment,
                                        plan.cell_id, config, summary, records)
        except Exception as error:  # records are safe on disk; a tracker hiccup must not end a sweep
            self.echo(f"warning: W&B logging failed for {plan.cell_id}: {type(error).__name__}: {error}")
            return
        if run_dir is not None:
            self.echo(f"W&B {plan.cfg.logger.mode} run: {run_dir} ({time.perf_counter() - started:.1f}s)")


def _pair_argument(cfg: DictConfig):
    """What models.load_pair receives: the pair's config (with its name) or just the name."""
    node = OmegaConf.to_container(cfg.model_pair, resolve=True) if cfg.get("model_pair") else {}
    if isinstance(node, dict) and node:
        node.setdefault("name", cfg.choices.model_pair)
        return node
    return cfg.choices.model_pair


__all__ = ["CellOutcome", "CellPlan", "ResourceError", "Session", "ar_config", "environment", "plan_cells",
           "stop_checker", "truncate_at_stop"]
