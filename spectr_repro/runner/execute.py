"""Running cells: their plan and order, claims and resume, one AR baseline per group, writing and W&B.

Computing one cell (decode -> records -> summary) is :func:`spectr_repro.runner.cell.compute_cell`; the pair
in memory is :class:`spectr_repro.launch.pairs.PairCache`'s.

A *group* is everything that fixes the AR baseline: model pair, hardware, dataset, temperature,
prompt set (num_prompts, seed) and max_new_tokens. The AR cell of a group (method "ar", K=1, L=1)
runs once, before the group's other methods, and every method cell's speed-up is
AR wall time / method wall time over the same prompts.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from tqdm.auto import tqdm

from spectr_repro import tracking
from spectr_repro.errors import ResourceError
from spectr_repro.launch import claims
from spectr_repro.launch.config import conf_dir, needs_single_draft, single_draft_message
from spectr_repro.launch.pairs import PairCache, echo_above_bars, pair_key
from spectr_repro.runner import store
from spectr_repro.runner.cell import Baseline, CellPlan, compute_cell
from spectr_repro.settings import RunConfig

# --------------------------------------------------------------------------------------------------
# Planning


@dataclass
class CellOutcome:
    plan: CellPlan
    status: str  # "ran", "finished earlier", "finished elsewhere", "claimed elsewhere", "skipped"
    summary: dict[str, Any] | None = None
    note: str | None = None


def ar_config(run: RunConfig) -> RunConfig:
    """The AR baseline cell of ``run``'s group: method ar, K=1, L=1, everything else equal."""
    ar = OmegaConf.to_container(OmegaConf.load(conf_dir() / "method" / "ar.yaml"), resolve=True)
    return run.replace(method=ar, K=1, L=1)


def plan_cells(runs: Sequence[RunConfig]) -> list[CellPlan]:
    """Plans in run order: pair by pair (all cells of one pair together, so that each pair is loaded once),
    per group the AR cell first; K>1 single-draft cells skipped."""
    plans: dict[str, CellPlan] = {}
    for run in runs:
        if run.method == "ar":
            run = ar_config(run)
        identifier = store.cell_id(run)
        if identifier in plans:
            continue
        if needs_single_draft(run):
            plans[identifier] = CellPlan(run, identifier, store.cell_dir(run, identifier), None,
                                         skip_note=single_draft_message(run))
            continue
        ar_id = None
        if run.method != "ar":
            ar = ar_config(run)
            ar_id = store.cell_id(ar)
            if ar_id not in plans:
                plans[ar_id] = CellPlan(ar, ar_id, store.cell_dir(ar, ar_id), None)
        plans[identifier] = CellPlan(run, identifier, store.cell_dir(run, identifier), ar_id)

    def order(plan: CellPlan):
        group = plan.ar_cell_id or plan.cell_id
        return (*pair_key(plan.run), group, plan.method != "ar")

    return sorted(plans.values(), key=order)  # sorted() is stable: grid order within a group


# --------------------------------------------------------------------------------------------------
# Running


@dataclass
class Session:
    """State shared by the cells of one command: the pair cache, AR timings, claims, what ran.

    Cells run pair by pair (``plan_cells`` orders them so); the previous pair is released before the next
    one is loaded (:class:`~spectr_repro.launch.pairs.PairCache`). Every cell is claimed before it is computed
    (:mod:`spectr_repro.launch.claims`): a cell another live runner holds is left to it, and waited for only
    when a later cell of this command needs it (the AR baseline of its group). Computing a cell is
    :func:`~spectr_repro.runner.cell.compute_cell`; the session writes what it returns and logs it to W&B.
    """

    force: bool = False
    echo: Callable[[str], None] = field(default=echo_above_bars)
    progress: bool = True
    poll_s: float = 5.0  # how often a blocked runner looks again at a cell another runner computes
    runner: claims.Runner = field(default_factory=claims.Runner)
    pairs: PairCache | None = None  # None: one that echoes with ``echo`` and tells ``runner`` it is loading
    _ar_times: dict[str, Baseline] = field(default_factory=dict)
    _ran: set[str] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)
    _unfinished: set[str] = field(default_factory=set)  # cells seen unfinished by this session
    current: CellPlan | None = None  # the cell being computed
    interrupted: CellPlan | None = None  # the cell whose computation an exception or signal ended

    def __post_init__(self) -> None:
        if self.pairs is None:
            self.pairs = PairCache(echo=self.echo, on_load=lambda name: self.runner.set_state("loading", name))

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
                self.pairs.release()
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
                                                else store.cell_dir(plan.run, plan.ar_cell_id))
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
            if not self._state_of(plan.run, plan.ar_cell_id).finished:
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
        return self._state_of(plan.run, plan.cell_id)

    def _state_of(self, run: RunConfig, identifier: str) -> store.CellState:
        """The cell's state; a damaged cell is warned about once (file and problem) and counts as unfinished."""
        state = store.cell_state(store.cell_dir(run, identifier))
        if state.status == "damaged" and identifier not in self._warned:
            self._warned.add(identifier)
            self.echo(f"warning: {state.problem}; the cell will be computed again")
        return state

    def _baseline(self, plan: CellPlan) -> Baseline:
        """The AR baseline of the plan's group: measured in this process, or read from its finished cell."""
        if plan.ar_cell_id in self._ar_times:
            return self._ar_times[plan.ar_cell_id]
        state = self._state_of(plan.run, plan.ar_cell_id)
        if not state.finished:
            raise ResourceError(f"AR baseline {plan.ar_cell_id} is not finished ({state.problem or state.status}); "
                                f"it must run before {plan.cell_id}")
        times = {r["prompt_id"]: r["wall_time_s"] for r in state.records}
        self._ar_times[plan.ar_cell_id] = Baseline(times, False, list(state.summary.get("speedup_caveats") or []))
        return self._ar_times[plan.ar_cell_id]

    def _compute(self, plan: CellPlan) -> dict[str, Any]:
        """Compute the cell (decode, records, summary), write it and log it; return the summary."""
        run = plan.run
        pair = self.pairs.pair(run)
        examples = self.pairs.examples(run, pair.tokenizer)
        if not examples:
            raise RuntimeError(f"dataset {run.dataset} gave no prompts")
        baseline = Baseline() if plan.method == "ar" else self._baseline(plan)
        missing_ar = [str(e.id) for e in examples if plan.method != "ar" and str(e.id) not in baseline.times]
        if missing_ar:  # checked before any decoding: no work is lost to a baseline that cannot serve it
            raise ResourceError(f"AR baseline {plan.ar_cell_id} has no record for prompts {missing_ar[:5]}")
        watch = claims.ContentionWatch(self.runner, plan.directory.parent)
        rows, summary = compute_cell(plan, pair, examples, baseline, watch, self.progress)
        try:
            store.write_cell(plan.directory, rows, summary, config=plan.run)
        except OSError as error:
            raise ResourceError(f"cannot write cell {plan.cell_id} into {plan.directory}: {error}") from error
        if plan.method == "ar":
            times = {r["prompt_id"]: r["wall_time_s"] for r in rows}
            self._ar_times[plan.cell_id] = Baseline(times, True, list(summary["speedup_caveats"]))
        self._log(plan, summary, rows)
        return summary

    def _log(self, plan: CellPlan, summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
        logger = plan.run.logger
        if logger is None or not tracking.enabled(logger):
            return
        started = time.perf_counter()
        config = plan.run.as_dict() | {"cell_id": plan.cell_id}
        try:
            run_dir = tracking.log_cell(logger, store.experiment_dir(plan.run), plan.run.experiment,
                                        plan.cell_id, config, summary, records)
        except Exception as error:  # records are safe on disk; a tracker hiccup must not end a sweep
            self.echo(f"warning: W&B logging failed for {plan.cell_id}: {type(error).__name__}: {error}")
            return
        if run_dir is not None:
            self.echo(f"W&B {tracking.mode(logger)} run: {run_dir} ({time.perf_counter() - started:.1f}s)")


def _by_pair(plans: Sequence[CellPlan]) -> list[list[CellPlan]]:
    """Plans grouped by (pair, hardware), in first-appearance order (plan_cells already sorts by pair)."""
    groups: dict[tuple, list[CellPlan]] = {}
    for plan in plans:
        groups.setdefault(pair_key(plan.run), []).append(plan)
    return list(groups.values())


__all__ = ["CellOutcome", "CellPlan", "ResourceError", "Session", "ar_config", "plan_cells"]
