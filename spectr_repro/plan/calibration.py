"""The calibration's part of ``plan``: what ``python -m spectr_repro check <experiment>`` with the real weights
costs, for each pair and hardware whose replay the predicted speed-ups come from.

A speed-up is predicted as the replay's tokens per call over the seconds per call measured here (issue 34):
the calibration times one forward of target and draft at every shape those calls use, at every K and L of
the replay's grid and of the timed cells (``cost.measure.plan_shapes``). ``cost.measure.measure_forward_costs``
runs, per model, one forward over its cached context, two untimed decode forwards, then every shape once per
round in ``CHECK_ROUNDS`` rounds (a warm-up round and ``check``'s timed repeats), at the shortest and the longest
context of the replay's datasets. Then the rest of the call cost model: ``BLOCKS`` real blocks drafted at the
largest K and L on which every rule's call is timed (priced at the rules' seconds this machine measured, else
left out and said), and ``DECODE_CALLS`` real decoding calls at the four corners of the (K, L) grid at each
context, plus AR's. Each forward costs what the cost model says (this machine's calibration when one exists,
else ``hardware.estimate``'s roofline), and the weights are read once from the local disk (``LOAD_GBS``). The
correctness items ``check`` also runs (the draft model in float32, a few dozen tokens) are left out: they are
small against the loading.

Nothing here loads a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spectr_repro import models
from spectr_repro.cost import calibration_for, model_calls_source
from spectr_repro.cost.measure import AR_DECODES, CONTEXT_TOKENS, plan_shapes
from spectr_repro.cost.model import GB, CellSpec, estimate_forward_costs, prefill_pieces
from spectr_repro.data import typical_prompt_tokens
from spectr_repro.launch.pairs import pair_config_of
from spectr_repro.logs import format_duration
from spectr_repro.settings import RunConfig

CHECK_REPEATS = 3  # check.costs.calibration_item's rounds that are timed (medians of 3)
CHECK_ROUNDS = CHECK_REPEATS + 1  # plus the warm-up round (kernel selection) measure_forward_costs runs first
WARMUP_TOKENS = 32  # the runner's warm-up prompt, a prefill shape check measures as well
BLOCKS = 3  # check.costs.call_costs_item: real blocks the rules' calls are timed on
DECODE_CALLS = 5  # ... and calls of each overhead decode (AR: 4 x DECODE_CALLS tokens)
# Assumed, not measured: safetensors read from a local NVMe SSD into host memory, then copied to the device;
# 1 GB/s is below a data-centre NVMe's sequential read (2-7 GB/s), so the loading is not under-priced.
LOAD_GBS = 1.0


@dataclass
class CalibrationPlan:
    command: str
    pair: str
    hardware: str
    Ks: tuple[int, ...]
    Ls: tuple[int, ...]
    target_shapes: int
    draft_shapes: int
    forward_seconds: float | None  # None: no cost model for this hardware (not estimated)
    weight_bytes: int
    source: str  # where the forwards' seconds come from
    contexts: int = 1  # contexts the forwards and decodes are measured at
    decode_seconds: float | None = None  # the blocks and the overhead decodes (None: not estimated)
    rule_seconds: float | None = None  # the rules' calls on the blocks (None: no measured rule seconds here)

    @property
    def load_seconds(self) -> float:
        return self.weight_bytes / (LOAD_GBS * GB)

    @property
    def seconds(self) -> float:
        return ((self.forward_seconds or 0.0) + (self.decode_seconds or 0.0) + (self.rule_seconds or 0.0)
                + self.load_seconds)


def calibration_shapes(replay_configs: Sequence[RunConfig], replay_Ks: Iterable[int], replay_Ls: Iterable[int],
                       cells: Iterable[RunConfig]) -> dict:
    """The K, L, prefill chunks and prompt batch sizes to calibrate for one pair: the replay's grid and the
    pair's timed cells (their K and L, AR's aside), the datasets' prefill chunks and the warm-up prompt."""
    base = replay_configs[0]
    Ks, Ls = {1, base.K, *map(int, replay_Ks)}, {base.L, *map(int, replay_Ls)}
    chunks, batches = {WARMUP_TOKENS}, {1}
    for run in cells:
        if run.method != "ar":  # AR's K and L are placeholders: it calls the target on one token
            Ks.add(run.K)
            Ls.add(run.L)
    for run in [*replay_configs, *cells]:
        chunks.update(prefill_pieces(CellSpec.of(run)))
        batches.add(run.hardware.batch_prompts)
    return {"Ks": sorted(Ks), "Ls": sorted(Ls), "prefill_chunks": sorted(chunks), "batch_sizes": sorted(batches)}


def plan_calibration(command: str, replay_configs: Sequence[RunConfig], replay_Ks: Iterable[int],
                     replay_Ls: Iterable[int], cells: Sequence[RunConfig] = ()) -> CalibrationPlan:
    """The calibration of the pair and hardware of ``replay_configs`` (one replay's groups) at its K x L grid
    and at the shapes of ``cells`` (the timed cells of the same pair and hardware)."""
    run = replay_configs[0]
    mine = [c for c in cells if (c.model_pair, c.hardware_name) == (run.model_pair, run.hardware_name)]
    shapes = calibration_shapes(replay_configs, replay_Ks, replay_Ls, mine)
    wanted = plan_shapes(shapes["Ks"], shapes["Ls"], shapes["prefill_chunks"], shapes["batch_sizes"])
    pair = pair_config_of(run)
    calibration = calibration_for(run)
    contexts = 2 if len({typical_prompt_tokens(c.dataset) for c in [*replay_configs, *mine]}) > 1 else 1
    seconds, decodes = 0.0, 0.0
    costs = {role: _forward_cost(CellSpec.of(run), pair, role, calibration) for role in ("target", "draft")}
    if None in costs.values():
        seconds = decodes = None
    else:
        for role, one in costs.items():
            # the context, two untimed decode forwards, then every shape once a round, at each context
            seconds += contexts * (one(1, CONTEXT_TOKENS, "last") + 2 * one(1, 1, "last") + CHECK_ROUNDS * sum(
                one(rows, tokens, logits) for rows, tokens, logits in wanted[role]))
        decodes = _decode_seconds(costs["target"], costs["draft"], shapes["Ks"], shapes["Ls"], contexts)
    rules = _rule_seconds(calibration, shapes["Ks"], shapes["Ls"])
    return CalibrationPlan(command=command, pair=run.model_pair, hardware=run.hardware_name,
                           Ks=tuple(shapes["Ks"]), Ls=tuple(shapes["Ls"]), target_shapes=len(wanted["target"]),
                           draft_shapes=len(wanted["draft"]), forward_seconds=seconds,
                           weight_bytes=_weight_bytes(pair), source=model_calls_source(CellSpec.of(run), calibration),
                           contexts=contexts, decode_seconds=decodes, rule_seconds=rules)


def _decode_seconds(target, draft, Ks: Sequence[int], Ls: Sequence[int], contexts: int) -> float:
    """The blocks drafted for the rules' timing and the overhead decodes (see the module docstring), by their
    forwards: a call at (K, L) is the draft's pending tokens, L-1 steps over K rows and the target over K(L+1)."""
    def call(K: int, L: int) -> float:
        return (target(K, L + 1, "all") + draft(1, 2, "last") + (L - 1) * draft(K, 1, "last"))

    corners = {(min(Ks), min(Ls)), (min(Ks), max(Ls)), (max(Ks), min(Ls)), (max(Ks), max(Ls))}
    blocks = BLOCKS * call(max(Ks), max(Ls))
    decodes = contexts * DECODE_CALLS * sum(call(K, L) for K, L in corners)
    return blocks + decodes + contexts * AR_DECODES * 4 * DECODE_CALLS * target(1, 1, "last")


def _rule_seconds(calibration, Ks: Sequence[int], Ls: Sequence[int]) -> float | None:
    """The rules' calls on the blocks at this machine's measured rule seconds (every rule at each K and L, once a
    block); None when this machine has none measured."""
    measured = (calibration.extra.get("rule_seconds") if calibration is not None else None) or {}
    if not measured:
        return None
    return BLOCKS * float(sum(measured.values()))


def _forward_cost(cell: CellSpec, pair: dict, role: str, calibration):
    """Seconds of one forward of ``role`` at (rows, tokens, logits): measured here, else the hardware's estimate at
    the calibration's context (None without ``hardware.estimate``)."""
    if calibration is not None:
        return calibration.costs(role).seconds
    costs = estimate_forward_costs(cell, pair, CONTEXT_TOKENS)
    if costs is None:
        return None
    return costs[0 if role == "target" else 1].seconds


def _weight_bytes(pair: dict) -> int:
    """Bytes of both checkpoints as shipped (``params_b`` x 2: bfloat16/float16); 0 for a pair built in code."""
    if pair.get("source") == "tiny":
        return 0
    return sum(models.checkpoint_bytes(pair, role) or 0 for role in ("target", "draft"))


def check_command(arguments: Sequence[str]) -> str:
    """The ``check`` command that calibrates what ``replay <arguments>`` replays (real weights: the default)."""
    kept = [a for a in arguments if a.lstrip("+~").split("=", 1)[0].split(".", 1)[0] != "replay"]
    return f"python -m spectr_repro check {' '.join(kept)}".strip()


def format_calibration(plan: CalibrationPlan) -> list[str]:
    def shown(seconds: float | None, missing: str = "not estimated") -> str:
        return missing if seconds is None else format_duration(seconds)

    return [f"Calibration (`{plan.command}`, real weights): {plan.pair} on {plan.hardware}, est. "
            f"{format_duration(plan.seconds)} (forwards {shown(plan.forward_seconds)} + decodes "
            f"{shown(plan.decode_seconds)} + rules {shown(plan.rule_seconds, 'not priced: none timed here yet')} + "
            f"loading {format_duration(plan.load_seconds)})",
            f"  {plan.target_shapes} target and {plan.draft_shapes} draft shapes (K {', '.join(map(str, plan.Ks))}"
            f" x L {', '.join(map(str, plan.Ls))}, prefill chunks, decode) x {CHECK_ROUNDS} rounds "
            f"({CHECK_REPEATS} timed + 1 warm-up) at {plan.contexts} context(s); {BLOCKS} blocks for the rules' "
            f"calls; {DECODE_CALLS} calls at each corner of the (K, L) grid; forwards: {plan.source}; loading: "
            f"{plan.weight_bytes / GB:.1f} GB at an assumed {LOAD_GBS:g} GB/s from the local disk"]


__all__ = ["BLOCKS", "CHECK_REPEATS", "CHECK_ROUNDS", "DECODE_CALLS", "LOAD_GBS", "CalibrationPlan",
           "calibration_shapes", "check_command", "format_calibration", "plan_calibration"]
