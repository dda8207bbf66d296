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
from spectr_repro.errors import ResourceError
from spectr_repro.records import CellSummary, PromptRecord, as_json, pooled_metrics, records_digest
from spectr_repro.runner import batched, claims, store
from spectr_repro.runner.config import conf_dir, needs_single_draft, single_draft_message

WARMUP_TOKENS = 8
WARMUP_PROMPT_TOKENS = 32  # warm-up needs the kernels, not the whole prompt (CPU prefill is slow)


# --------------------------------------------------------------------------------------------------
# Planning



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
    status: str  # "ran", "finished earlier", "finished elsewhere", "claimed elsewhere", "skipped"
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
    """Plans in run order: pair by pair (all cells of one pair together, so that each pair is loaded once),
    per group the AR cell first; K>1 single-draft cells skipped."""
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
        return (*_pair_key(plan.cfg), group, plan.method != "ar")

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
    """State shared by the cells of one command: the pair in memory, prompt sets, AR timings, claims.

    Cells run pair by pair (``plan_cells`` orders them so); the previous pair is released before the next
    one is loaded. Every cell is claimed before it is computed (:mod:`spectr_repro.runner.claims`): a cell
    another live runner holds is left to it, and waited for only when a later cell of this command needs
    it (the AR baseline of its group).
    """

    force: bool = False
    echo: Callable[[str], None] = field(default=lambda message: tqdm.write(message, file=sys.stderr))
    progress: bool = True
    poll_s: float = 5.0  # how often a blocked runner looks again at a cell another runner computes
    runner: claims.Runner = field(default_factory=claims.Runner)
    _examples: dict[tuple, list] = field(default_factory=dict)
    _ar_times: dict[str, tuple[dict[str, float], bool, list[str]]] = field(default_factory=dict)
    _ran: set[str] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)
    _unfinished: set[str] = field(default_factory=set)  # cells seen unfinished by this session
    current: CellPlan | None = None  # the cell being computed
    interrupted: CellPlan | None = None  # the cell whose computation an exception or signal ended
    _pair_key: tuple | None = None  # the pair (config, hardware) this session holds in memory

    # -- resources -----------------------------------------------------------------------------
    def pair(self, cfg: DictConfig):
        """The cell's pair: released and reloaded only when the pair changes; refused when offloaded."""
        from spectr_repro import models

        wanted = cfg.choices.model_pair
        key = _pair_key(cfg)
        if self._pair_key is not None and self._pair_key != key:
            self.release_pair()
        if models.loaded_pair_name() is None or self._pair_key != key:
            self.echo(f"loading model pair {wanted}")
            self.runner.set_state("loading", wanted)
            self._pair_key = key
        try:
            pair = models.load_pair(_pair_argument(cfg), device=cfg.hardware.device, dtype=cfg.hardware.dtype)
        except (ValueError, OSError, ImportError) as error:  # missing weights, unreachable hub, bad config
            raise ResourceError(f"cannot load model pair {wanted}: {error}") from error
        if pair.offloaded and not cfg.hardware.get("allow_offload", False):
            raise ResourceError(models.offload_message(pair))
        return pair

    def release_pair(self) -> None:
        from spectr_repro import models

        self._pair_key = None
        name = models.release_pair()
        if name is not None:
            self.echo(f"released model pair {name} (memory freed before the next pair)")

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
        """Every plan's outcome, in plan order. Pairs are visited one after the other, never twice."""
        outcomes: dict[str, CellOutcome] = {}
        bar = tqdm(total=len(plans), desc="cells", unit="cell", file=sys.stderr, disable=not self.progress,
                   dynamic_ncols=True)

        def done(outcome: CellOutcome) -> None:
            outcomes[outcome.plan.cell_id] = outcome
            bar.update(1)
            if on_cell is not None:
                on_cell(outcome)

        try:
            with self.runner:
                for pair_plans in _by_pair(plans):
                    self._run_pair(pair_plans, done)
                self.release_pair()
        finally:
            bar.close()
        return [outcomes[plan.cell_id] for plan in plans]

    def _run_pair(self, plans: list[CellPlan], done: Callable[[CellOutcome], None]) -> None:
        """Claim and compute the pair's cells; cells blocked on an AR baseline another runner computes are
        retried every ``poll_s`` seconds (others' cells are left to them)."""
        pending, announced = list(plans), set()
        while pending:
            blocked = []
            for plan in pending:
                outcome = self.run_one(plan)
                if outcome is None:
                    blocked.append(plan)
                else:
                    done(outcome)
            if len(blocked) == len(pending):
                for plan in blocked:
                    holder = claims.read_holder(plan.directory if plan.method == "ar"
                                                else store.cell_dir(plan.cfg, plan.ar_cell_id))
                    key = plan.ar_cell_id or plan.cell_id
                    if key not in announced:
                        announced.add(key)
                        who = holder.describe() if holder else "another runner"
                        self.echo(f"waiting for AR baseline {key}: {who} is computing it")
                self.runner.set_state("waiting")
                time.sleep(self.poll_s)
            pending = blocked

    def run_one(self, plan: CellPlan) -> CellOutcome | None:
        """Compute ``plan`` if it is not finished and this runner can claim it.

        None when the cell cannot run yet: its AR baseline (or, for an AR cell, the cell itself) is being
        computed by another live runner and this command needs it.
        """
        if plan.skip_note:
            self.echo(f"skip {plan.cell_id}: {plan.skip_note}")
            return CellOutcome(plan, "skipped", note=plan.skip_note)
        recompute = self.force and plan.cell_id not in self._ran
        state = self._state(plan)
        if state.finished and not recompute:
            if plan.cell_id in self._ran:
                return CellOutcome(plan, "ran", state.summary)
            if plan.cell_id in self._unfinished:  # finished by another runner while this one ran
                self.echo(f"skip {plan.cell_id}: finished by another runner")
                return CellOutcome(plan, "finished elsewhere", state.summary)
            self.echo(f"skip {plan.cell_id}: finished earlier ({plan.directory / 'summary.json'})")
            return CellOutcome(plan, "finished earlier", state.summary)
        self._unfinished.add(plan.cell_id)
        if plan.ar_cell_id is not None and plan.ar_cell_id not in self._ar_times:
            if not self._state_of(plan.cfg, plan.ar_cell_id).finished:
                # Another runner computes it (or its runner just died: the AR cell, earlier in this command's
                # order, is taken over on the next pass). Either way: not yet.
                return None
        try:
            claim = self.runner.claim(plan.directory)
        except OSError as error:
            raise ResourceError(f"cannot write into {plan.directory}: {error}") from error
        if not claim.acquired:
            if plan.method == "ar":
                return None  # later cells of this command need it: wait
            note = f"computed by {claim.holder.describe() if claim.holder else 'another runner'}"
            self.echo(f"skip {plan.cell_id}: {note}")
            return CellOutcome(plan, "claimed elsewhere", note=note)
        try:
            if claim.took_over is not None:
                self.echo(f"took over {plan.cell_id} from {claim.took_over.describe()}: that runner is gone")
            state = self._state(plan)  # another runner may have finished it between our look and the claim
            if state.finished and not recompute:
                return CellOutcome(plan, "finished elsewhere", state.summary)
            self.current = plan
            self.runner.set_state("computing", plan.cell_id)
            summary = self._compute(plan)
        except BaseException:
            self.interrupted = self.current
            raise
        finally:
            self.current = None
            self.runner.set_state("idle")
            self.runner.release(plan.directory)
        self._ran.add(plan.cell_id)
        return CellOutcome(plan, "ran", summary)

    def written_cells(self, plans: Sequence[CellPlan]) -> set[str]:
        """Cells this session found unfinished that are finished on disk now (read from the files: a signal can
        land between a cell's summary being written and its outcome being returned)."""
        return {plan.cell_id for plan in plans
                if plan.cell_id in self._unfinished and store.cell_state(plan.directory).finished}

    def _state(self, plan: CellPlan) -> store.CellState:
        return self._state_of(plan.cfg, plan.cell_id)

    def _state_of(self, cfg: DictConfig, identifier: str) -> store.CellState:
        """The cell's state; a damaged cell is warned about once (file and problem) and counts as unfinished."""
        state = store.cell_state(store.cell_dir(cfg, identifier))
        if state.status == "damaged" and identifier not in self._warned:
            self._warned.add(identifier)
            self.echo(f"warning: {state.problem}; the cell will be computed again")
        return state

    def _ar_times_for(self, plan: CellPlan) -> tuple[dict[str, float], bool, list[str]]:
        """Per-prompt AR wall times of the plan's group, whether they were measured in this process, and
        the AR cell's own caveats (offload, contention)."""
        if plan.ar_cell_id in self._ar_times:
            return self._ar_times[plan.ar_cell_id]
        state = self._state_of(plan.cfg, plan.ar_cell_id)
        if not state.finished:
            raise ResourceError(f"AR baseline {plan.ar_cell_id} is not finished ({state.problem or state.status}); "
                                f"it must run before {plan.cell_id}")
        times = {r["prompt_id"]: r["wall_time_s"] for r in state.records}
        self._ar_times[plan.ar_cell_id] = (times, False, list(state.summary.get("speedup_caveats") or []))
        return self._ar_times[plan.ar_cell_id]

    def _compute(self, plan: CellPlan) -> dict[str, Any]:
        """Decode the cell's prompts, then its records, then its summary; write them; return the summary."""
        cfg = plan.cfg
        method = plan.method
        pair = self.pair(cfg)
        examples = self.examples(cfg, pair.tokenizer)
        if not examples:
            raise RuntimeError(f"dataset {cfg.choices.dataset} gave no prompts")
        ar_times, ar_same_process, ar_caveats = ({}, True, []) if method == "ar" else self._ar_times_for(plan)
        missing_ar = [str(e.id) for e in examples if method != "ar" and str(e.id) not in ar_times]
        if missing_ar:  # checked before any decoding: no work is lost to a baseline that cannot serve it
            raise ResourceError(f"AR baseline {plan.ar_cell_id} has no record for prompts {missing_ar[:5]}")
        options = cfg.method.get("options")
        options = OmegaConf.to_container(options, resolve=True) if options is not None else {}

        decoded = self._decode(plan, pair, examples, options)
        records = prompt_records(cfg, pair.tokenizer, examples, decoded, ar_times)
        rows = [as_json(r) for r in records]
        caveats = timing_caveats(bool(pair.offloaded), decoded.contention)
        caveats += [f"AR baseline: {caveat}" for caveat in ar_caveats]
        summary = as_json(cell_summary(plan, pair, options, decoded, rows, ar_same_process, caveats))
        try:
            store.write_cell(plan.directory, rows, summary, config=plan.cfg)
        except OSError as error:
            raise ResourceError(f"cannot write cell {plan.cell_id} into {plan.directory}: {error}") from error
        if method == "ar":
            self._ar_times[plan.cell_id] = ({r["prompt_id"]: r["wall_time_s"] for r in rows}, True, caveats)
        self._log(plan, summary, rows)
        return summary

    def _decode(self, plan: CellPlan, pair, examples: Sequence[Any], options: dict[str, Any]) -> Decoded:
        """A warm-up, the batched prompts (block efficiency only), then every other prompt alone, timed."""
        from spectr_repro.data import encode_prompt
        from spectr_repro.engine.loop import generate
        from spectr_repro.engine.timing import SectionTimer

        cfg = plan.cfg
        method = plan.method

        def decode(input_ids, max_new_tokens, seed, should_stop=None):
            return generate(pair.target, pair.draft, input_ids, method=method, K=cfg.K, L=cfg.L,
                            temperature=float(cfg.temperature), max_new_tokens=max_new_tokens, seed=seed,
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
            return stop_checker(pair.tokenizer, _stop_strings(examples[index]))

        # Batched block efficiency (hardware.batch_prompts > 1, runner.batched): all but the timed prompts.
        split = batched.split_prompts(cfg.hardware, len(prompts))
        batched_outputs, batched_wall = batched.decode_batches(pair, cfg, method, options, prompts, split, seed_of,
                                                               stop_of, self.progress)

        timer = SectionTimer(pair.device)
        watch = claims.ContentionWatch(self.runner, plan.directory.parent)
        watch.sample()
        outputs, walls = [], []
        bar = tqdm(prompts, desc=f"{method} K={cfg.K} L={cfg.L}", unit="prompt",
                   leave=False, file=sys.stderr, disable=not self.progress, dynamic_ncols=True)
        tokens = calls = 0
        for index, input_ids in enumerate(bar):
            key = f"wall_{index}"
            if index in batched_outputs:
                out, wall = batched_outputs[index], None  # decoded in a batch: BE only, never timed
            else:
                with timer(key):
                    out = decode(input_ids, cfg.max_new_tokens, seed=seed_of(index), should_stop=stop_of(index))
                wall = timer.seconds.pop(key)
                watch.sample()
            outputs.append(out)
            walls.append(wall)
            tokens += len(out.new_tokens)
            calls += out.target_calls
            bar.set_postfix(BE=f"{tokens / calls:.2f}" if calls else "-")
        bar.close()
        return Decoded(prompts, outputs, walls, split, batched_wall, watch.result())

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


@dataclass
class Decoded:
    """What ``Session._decode`` returns: per prompt (in order) its token ids, its output and its wall time
    (None: decoded in a batch, never timed); the split, the batches' wall time and the contention seen."""

    prompts: list[list[int]]
    outputs: list[Any]  # engine.loop.GenerationOutput
    walls: list[float | None]
    split: batched.PromptSplit
    batched_wall: float
    contention: dict[str, Any]


def _stop_strings(example) -> tuple[str, ...]:
    return tuple(getattr(example, "stop_strings", ()) or ())


def prompt_records(cfg: DictConfig, tokenizer, examples: Sequence[Any], decoded: Decoded,
                   ar_times: dict[str, float]) -> list[PromptRecord]:
    """One record per prompt: the decoded output, its wall time and the AR baseline's on the same prompt."""
    method = cfg.method.name
    records = []
    for example, input_ids, out, wall in zip(examples, decoded.prompts, decoded.outputs, decoded.walls):
        text = tokenizer.decode(out.new_tokens, skip_special_tokens=True)
        prompt_id = str(example.id)
        records.append(PromptRecord(
            prompt_id=prompt_id,
            method=method,
            K=cfg.K,
            L=cfg.L,
            temperature=float(cfg.temperature),
            seed=cfg.seed,
            prompt_tokens=len(input_ids),
            new_tokens=len(out.new_tokens),
            target_calls=out.target_calls,
            block_efficiency=out.block_efficiency,
            wall_time_s=wall,
            ar_wall_time_s=None if wall is None else wall if method == "ar" else ar_times.get(prompt_id),
            completion=truncate_at_stop(text, _stop_strings(example)),
            reference=getattr(example, "reference", None),
            accepted_lengths=list(out.stats.get("accepted_lengths", [])),
            block_lengths=list(out.stats.get("block_lengths", [])),
            dataset=cfg.choices.dataset,
            model_pair=cfg.choices.model_pair,
            batch_prompts=out.stats.get("batch_prompts", 1),
        ))
    return records


def cell_summary(plan: CellPlan, pair, options: dict[str, Any], decoded: Decoded, rows: list[dict[str, Any]],
                 ar_same_process: bool, caveats: list[str]) -> CellSummary:
    """The cell's summary: its settings, the metrics pooled over ``rows``, acceptance by position, the time
    split, the environment and what makes its wall times incomparable (``caveats``)."""
    from spectr_repro.engine.loop import acceptance_by_position

    cfg, method = plan.cfg, plan.method
    pooled_accepted = [a for out in decoded.outputs for a in out.stats.get("accepted_lengths", [])]
    pooled_blocks = [b for out in decoded.outputs for b in out.stats.get("block_lengths", [])]
    time_split: dict[str, float] = {}
    for out in decoded.outputs:
        for section, seconds in out.stats.get("time_s", {}).items():
            time_split[section] = time_split.get(section, 0.0) + seconds
    return CellSummary(
        experiment=cfg.experiment,
        cell_id=plan.cell_id,
        method=method,
        method_options=options,
        dataset=cfg.choices.dataset,
        model_pair=cfg.choices.model_pair,
        hardware=cfg.choices.hardware,
        K=cfg.K,
        L=cfg.L,
        temperature=float(cfg.temperature),
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
        prompt_ids=[r["prompt_id"] for r in rows],
        records_sha256=records_digest(store.records_text(rows)),
        offloaded=bool(pair.offloaded),
        contention=decoded.contention,
        speedup_caveats=caveats,
        model_revisions=pair.revisions,
        batch_prompts=decoded.split.batch_prompts,
        batched_wall_time_s=decoded.batched_wall,
    )


def timing_caveats(offloaded: bool, contention: dict[str, Any]) -> list[str]:
    """Why a cell's wall times are not comparable with a clean run ([] when they are)."""
    caveats = []
    if offloaded:
        caveats.append("offloaded: part of the pair sat on CPU/disk while timed (hardware.allow_offload=true)")
    if contention.get("other_runners"):
        caveats.append("contention: other runners were busy on this machine while it was timed ("
                       + "; ".join(contention["other_runners"][:3]) + ")")
    return caveats


def _by_pair(plans: Sequence[CellPlan]) -> list[list[CellPlan]]:
    """Plans grouped by (pair, hardware), in first-appearance order (plan_cells already sorts by pair)."""
    groups: dict[tuple, list[CellPlan]] = {}
    for plan in plans:
        groups.setdefault(_pair_key(plan.cfg), []).append(plan)
    return list(groups.values())


def _pair_key(cfg: DictConfig) -> tuple:
    """What fixes the models in memory: the pair's resolved config and the hardware (device, dtype)."""
    pair = OmegaConf.to_container(cfg.model_pair, resolve=True) if cfg.get("model_pair") else None
    hardware = OmegaConf.to_container(cfg.hardware, resolve=True)
    return (cfg.choices.model_pair, repr(pair), repr(hardware))


def _pair_argument(cfg: DictConfig):
    """What models.load_pair receives: the pair's config (with its name) or just the name."""
    node = OmegaConf.to_container(cfg.model_pair, resolve=True) if cfg.get("model_pair") else {}
    if isinstance(node, dict) and node:
        node.setdefault("name", cfg.choices.model_pair)
        return node
    return cfg.choices.model_pair


__all__ = ["CellOutcome", "CellPlan", "ResourceError", "Session", "ar_config", "environment", "plan_cells",
           "stop_checker", "timing_caveats", "truncate_at_stop"]
