"""Speed-up against batch size, timed: B prompts decoded together (``engine.generate_batch``) by AR and by each
rule, in one process, and the one cost model's prediction for the same batches.

    python -m spectr_repro bench --preset batch_qwen

One pool of prompts, the datasets' taken in turn (a server's batch mixes requests); at each batch size B the pool
is cut into groups of B. Within a group every contender (AR and each (rule, K, L)) decodes the same B prompts with
the same seeds, EOS off, so all emit B x ``max_new_tokens`` tokens, in an order that rotates from group to group
(the VM's drift falls on every contender alike). A group's speed-up is AR's wall time over the rule's (AR at the
same B: the baseline a server at that batch has), end to end and after the prefill (a server prefills apart, and
each prompt's prefill here is the same work for every contender); the interval is a t interval over the groups
(paired: each ratio is of one group's two decodes; none from a single group).

The prediction is made before any timed round, from costs measured in this process on other inputs: every forward
at the batch shapes (``cost.measure.measure_forward_costs``), the rules' calls on real blocks drafted from a prompt
no group decodes, and each section's overhead on real decodes of that prompt at B = 1 and the largest B
(``cost.measure.measure_section_residuals``). The timed groups' own target calls per prompt are then priced by
``cost.batch_speedup.batch_decode_seconds``: what is checked is the cost model at B, not a block efficiency.

With ``retime_repeats`` > 0, the forwards a group makes are timed again just before it, on random tokens over a
cache as wide as the group's (:func:`retime_forwards`), and the group is priced from those (``predicted``) as well
as from the calibration alone (``calibration_predicted``). A shared VM's speed moved 1.4-1.6x between two
calibrations of the same shapes an hour apart (2026-12-07), and not alike for the draft and the target: priced
from a calibration made an hour before, a group's error is the machine's drift as much as the model's.

A run takes an hour or more on a CPU, so it keeps what it measured as it goes (:class:`BatchCheckpoint`, a JSON
file beside the output): the calibration once made, then each group once every contender has decoded it. Rerun the
same command and it resumes from there, provided it measures the same thing (settings, pair, dtype) on the same
kind of machine (device name, torch, threads); a checkpoint of anything else is set aside, never mixed in. A group
is the unit kept: its contenders' ratios are only fair when they were timed back to back in one process.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from scipy import stats
from tqdm.auto import tqdm

from spectr_repro.bench.measure import timed
from spectr_repro.cost.batch_speedup import batch_decode_seconds
from spectr_repro.cost.calibration import ForwardCosts
from spectr_repro.cost.measure import (
    measure_forward_costs,
    measure_rule_seconds,
    measure_section_residuals,
    plan_shapes,
    record_blocks,
)
from spectr_repro.cost.model import CallCosts, SectionOverheads
from spectr_repro.engine import generate_batch
from spectr_repro.environment import device_name
from spectr_repro.files import atomic_write_text

Contender = tuple[str, int, int]  # (method, K, L); AR is ("ar", 1, 1)
AR: Contender = ("ar", 1, 1)
WARMUP_TOKENS = 4


def rule_Ks_Ls(contenders: Sequence[Contender]) -> tuple[list[int], list[int]]:
    """The K and the L values of the speculative contenders (AR has none), sorted."""
    rules = [c for c in contenders if c[0] != "ar"]
    return sorted({K for _, K, _ in rules}), sorted({L for _, _, L in rules})


def calibrate(pair, prompt: torch.Tensor, contenders: Sequence[Contender], batches: Sequence[int],
              temperature: float, new_tokens: int, prefill_tokens: Sequence[int], prefill_chunk: int | None = None,
              repeats: int = 3) -> CallCosts:
    """The cost model of this pair here and now, measured on ``prompt`` (one no timed group decodes); prefills at
    ``prefill_tokens`` (the groups' shortest, median and longest prompt: interpolated between).

    The forwards are timed on caches as wide as a group's can be: its longest prompt plus half the new tokens, at
    the shortest, median and longest prompt (``batch_decode_seconds`` prices a group there). A batch's cache is
    left-padded to its longest prompt, and its cost grows with rows x width far faster than the attention's FLOPs
    (the key and value heads are expanded per row over the whole width): on the Qwen pair (2026-12-07, Intel Xeon,
    float32) the target's 24 x 7 forward took 2.9 s on 326 cached tokens and 6.3 s on 700, its 8 x 7 forward
    1.31 s and 1.35 s. The sections' overheads come from ``generate_batch``, the path the groups time, at B = 1 and at
    the largest B (copies of ``prompt``): what a call pays once apart from what it pays per prompt."""
    rules = [c for c in contenders if c[0] != "ar"]
    Ks, Ls = rule_Ks_Ls(contenders)
    widths = sorted({int(n) + new_tokens // 2 for n in prefill_tokens})
    chunks = sorted({min(int(n), int(prefill_chunk or n)) for n in prefill_tokens})
    shapes = plan_shapes(Ks, Ls, chunks, batches)
    target = measure_forward_costs(pair.target, shapes["target"], repeats, widths, pair.vocab_size)
    draft = measure_forward_costs(pair.draft, shapes["draft"], repeats, widths, pair.vocab_size)
    blocks = record_blocks(pair.target, pair.draft, prompt.to(pair.device), max(Ks), max(Ls), 3, temperature,
                           pair.vocab_size, prefill_chunk)
    rule_seconds = measure_rule_seconds(blocks, rules)
    corners = sorted({(min(Ks), min(Ls)), (min(Ks), max(Ls)), (max(Ks), min(Ls)), (max(Ks), max(Ls))})
    residuals = []
    for batch in sorted({1, max(batches)}):  # two batch sizes tell per call from per prompt (SectionOverheads)
        residuals += measure_section_residuals(pair.target, pair.draft, prompt.to(pair.device), corners, target,
                                               draft, rule_seconds, temperature, calls=5, vocab_size=pair.vocab_size,
                                               prefill_chunk=prefill_chunk, batched=True, batch=batch)
    return CallCosts(target, draft, rule_seconds, SectionOverheads.fit(residuals),
                     source="measured in this process before the timed groups, on a prompt no group decodes")


def retime_forwards(pair, prompts: Sequence[torch.Tensor], contenders: Sequence[Contender], batches: Sequence[int],
                    new_tokens: int, prefill_chunk: int | None = None, repeats: int = 2) -> dict[str, Any]:
    """The forwards a group of ``prompts`` makes, timed now, as the calibration times them (random tokens, the
    shapes of ``plan_shapes`` for the batch sizes up to the group's, the prompts' shortest, median and longest first
    chunks) on one cache as wide as the group's: its longest prompt plus half the new tokens. JSON, as the
    calibration keeps its forwards."""
    Ks, Ls = rule_Ks_Ls(contenders)
    lengths = sorted(int(p.numel()) for p in prompts)
    firsts = [min(n, int(prefill_chunk or n)) for n in lengths]
    chunks = sorted({firsts[0], firsts[len(firsts) // 2], firsts[-1]})
    shapes = plan_shapes(Ks, Ls, chunks, [b for b in batches if b <= len(prompts)])
    width = lengths[-1] + new_tokens // 2
    return {role: measure_forward_costs(model, shapes[role], repeats, [width], pair.vocab_size).to_json()
            for role, model in (("target", pair.target), ("draft", pair.draft))}


def group_plan(pool_size: int, batches: Sequence[int], groups: dict[int, int] | None = None) -> list[tuple[int, int]]:
    """(B, group) in the order they are timed: at each B, groups of B prompts from the start of the pool, as many as
    ``groups[B]`` (default: every whole group the pool holds). A larger pool than the small B need gives the large B
    two groups, hence an interval, without doubling the small B's groups."""
    unknown = sorted(set(groups or {}) - set(batches))
    if unknown:
        raise ValueError(f"groups are asked at B = {', '.join(map(str, unknown))}, which is not among B = "
                         f"{', '.join(map(str, batches))}")
    plan = []
    for B in batches:
        count = pool_size // B if groups is None or B not in groups else int(groups[B])
        if count < 1 or count * B > pool_size:
            raise ValueError(f"{count} group(s) of {B} need {max(count, 1) * B} prompts; the pool has {pool_size}")
        plan += [(B, g) for g in range(count)]
    return plan


def decode_group(pair, prompts: Sequence[torch.Tensor], contender: Contender, temperature: float, new_tokens: int,
                 seed: int, prefill_chunk: int | None = None) -> dict[str, Any]:
    """One timed ``generate_batch`` of ``prompts`` (EOS off): wall seconds, tokens, each prompt's target calls, and
    the engine's seconds by section (``sections_s``: prefill, draft, target, verify and its total), so that a miss
    can be traced to a section from the file alone."""
    method, K, L = contender
    seconds, out = timed(pair.device, lambda: generate_batch(
        pair.target, None if method == "ar" else pair.draft, [p.to(pair.device) for p in prompts], method=method,
        K=K, L=L, temperature=temperature, max_new_tokens=new_tokens, seeds=[seed + i for i in range(len(prompts))],
        eos_token_ids=(), vocab_size=pair.vocab_size, prefill_chunk=prefill_chunk))
    sections = {name: float(value) for name, value in out.stats["time_s"].items()}
    return {"seconds": seconds, "prefill_s": sections.get("prefill", 0.0), "sections_s": sections,
            "tokens": sum(len(o.new_tokens) for o in out.outputs), "calls": [o.target_calls for o in out.outputs]}


def prompt_pool(prompts_by_dataset: dict[str, Sequence[torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """(dataset, prompt), the datasets' prompts taken in turn."""
    pool = []
    for i in range(max(len(prompts) for prompts in prompts_by_dataset.values())):
        pool += [(name, prompts[i]) for name, prompts in prompts_by_dataset.items() if i < len(prompts)]
    return pool


def time_groups(pair, pool: Sequence[tuple[str, torch.Tensor]], contenders: Sequence[Contender],
                batches: Sequence[int], temperature: float, new_tokens: int, prefill_chunk: int | None = None,
                done: dict[tuple[int, int], list[dict[str, Any]]] | None = None,
                on_group: Callable[[list[dict[str, Any]]], None] | None = None,
                groups: dict[int, int] | None = None, retime_repeats: int = 0) -> list[dict[str, Any]]:
    """One row per (B, group, contender): the group's decode (see the module docstring). ``done`` holds groups
    timed before (by (B, group)): kept, not decoded again; ``on_group`` gets each new group's rows when it ends;
    ``groups``: how many groups at each B (:func:`group_plan`). ``retime_repeats`` > 0: the group's forwards timed
    again before its decodes (:func:`retime_forwards`), kept on its AR row as ``forwards``."""
    contenders = [AR, *[c for c in contenders if c != AR]]
    done = done or {}
    if any(B > len(pool) for B in batches):
        raise ValueError(f"a batch of {max(batches)} needs that many prompts; the pool has {len(pool)}")
    plan = group_plan(len(pool), batches, groups)
    rows, warm = [], set()
    for turn, (B, g) in enumerate(tqdm(plan, desc=f"batches [{pair.name}]", unit="group", leave=False)):
        if (B, g) in done:
            rows += done[(B, g)]
            continue
        chosen = pool[g * B:(g + 1) * B]
        prompts = [prompt for _, prompt in chosen]
        if B not in warm:  # a warm-up at each B in this process: threads, allocator, kernels
            warm.add(B)
            for contender in (AR, contenders[-1]):
                decode_group(pair, prompts, contender, temperature, WARMUP_TOKENS, 10**6, prefill_chunk)
        # the order rotates with the group's place in the plan, so a resumed run times each group as a whole run would
        order = contenders[turn % len(contenders):] + contenders[:turn % len(contenders)]
        forwards = (retime_forwards(pair, prompts, contenders, batches, new_tokens, prefill_chunk, retime_repeats)
                    if retime_repeats > 0 else None)
        group = []
        for contender in order:
            decoded = decode_group(pair, prompts, contender, temperature, new_tokens, 1000 * g, prefill_chunk)
            group.append({"B": B, "group": g, "datasets": [name for name, _ in chosen], "method": contender[0],
                          "K": contender[1], "L": contender[2], "prompt_tokens": [int(p.numel()) for p in prompts],
                          **decoded})
            if forwards is not None and contender == AR:
                group[-1]["forwards"] = forwards
        rows += group
        if on_group is not None:
            on_group(group)
    return rows


def checkpoint_identity(pair, batches: dict[str, Any], temperature: float, new_tokens: int,
                        prefill_chunk: int | None) -> dict[str, Any]:
    """What must match for a kept group to be paired with new ones: what is measured (``batches``: the preset's
    section of that name, as plain values; the decoding settings, the pair and its dtype) and the kind of machine it
    is timed on."""
    return {"batches": batches, "temperature": float(temperature),
            "max_new_tokens": int(new_tokens), "prefill_chunk": prefill_chunk, "pair": pair.name,
            "dtype": str(pair.dtype), "device_name": device_name(str(pair.device)), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


class BatchCheckpoint:
    """What a batch bench has measured so far, in one JSON file: ``identity`` (what is measured, where), the
    calibration's ``costs`` and the finished groups' ``rows``. Written whole after each step (atomically)."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path, self.identity = Path(path), json.loads(json.dumps(identity))
        self.costs: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
        self.note = ""
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            saved = json.loads(self.path.read_text())
            same = saved.get("identity") == self.identity
        except (OSError, ValueError, AttributeError) as error:
            saved, same = {}, False
            self.note = f"{self.path} could not be read ({error}): "
        if not same:
            # stamped, as units.set_aside names a unit's: a second mismatch must not overwrite the first
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
            aside = self.path.with_name(f"{self.path.stem}.set-aside-{stamp}{self.path.suffix}")
            os.replace(self.path, aside)
            differs = sorted(k for k in {*self.identity, *saved.get("identity", {})}
                             if self.identity.get(k) != saved.get("identity", {}).get(k))
            self.note += (f"set aside {aside.name}: it measured something else ({', '.join(differs) or 'unreadable'}"
                          " differ); starting afresh")
            return
        self.costs, self.rows = saved.get("costs"), list(saved.get("rows", []))
        groups = len({(r["B"], r["group"]) for r in self.rows})
        self.note = (f"resuming {self.path.name}: " + ("the calibration" if self.costs else "no calibration")
                     + f" and {groups} group{'s' * (groups != 1)} kept")

    def done(self) -> dict[tuple[int, int], list[dict[str, Any]]]:
        groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for row in self.rows:
            groups.setdefault((row["B"], row["group"]), []).append(row)
        return groups

    def save_costs(self, costs: CallCosts) -> None:
        self.costs = costs.to_json()
        self._write()

    def add_group(self, rows: list[dict[str, Any]]) -> None:
        self.rows += rows
        self._write()

    def _write(self) -> None:
        atomic_write_text(self.path, json.dumps({"identity": self.identity, "costs": self.costs, "rows": self.rows}))


def interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % t interval (NaN bounds from one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def group_costs(costs: CallCosts, base: dict[str, Any]) -> CallCosts:
    """``costs`` with the forwards timed again just before the group of AR row ``base``, where it has them."""
    forwards = base.get("forwards")
    if not forwards:
        return costs
    return dataclasses.replace(costs, target=ForwardCosts.from_json(forwards["target"]),
                               draft=ForwardCosts.from_json(forwards["draft"]))


def _ar_groups(rows: Sequence[dict[str, Any]], costs: CallCosts) -> dict[tuple[int, int], tuple[dict, CallCosts]]:
    """{(B, group): (its AR row, the costs that price the group)}: its forwards timed again where it has them
    (``group_costs``), parsed once."""
    return {(r["B"], r["group"]): (r, group_costs(costs, r)) for r in rows if r["method"] == "ar"}


def summarise(rows: Sequence[dict[str, Any]], costs: CallCosts, new_tokens: int,
              prefill_chunk: int | None = None) -> list[dict[str, Any]]:
    """Per (rule, K, L, B): the measured speed-up over AR at the same B with its interval, end to end and after the
    prefill (``decode_``), tokens per call, and the cost model's speed-ups for the same groups (their own calls per
    prompt) with their errors. Groups whose forwards were timed again before them (``forwards`` on their AR row) are
    priced from those, and from ``costs`` alone as ``calibration_predicted`` / ``calibration_error``."""
    def predicted(row, prefill: bool, with_costs: CallCosts) -> float:
        return batch_decode_seconds(with_costs, row["method"], row["K"], row["L"], row["prompt_tokens"], row["calls"],
                                    new_tokens, prefill_chunk, prefill)

    ar = _ar_groups(rows, costs)
    cells: dict[tuple, list[tuple[dict, dict, CallCosts]]] = {}
    for row in rows:
        if row["method"] == "ar":
            continue
        base, priced = ar[(row["B"], row["group"])]
        if row["tokens"] != base["tokens"]:
            raise ValueError(f"{row['method']} emitted {row['tokens']} tokens, AR {base['tokens']}: not comparable")
        cells.setdefault((row["method"], row["K"], row["L"], row["B"]), []).append((base, row, priced))
    summary = []
    for (method, K, L, B), pairs in sorted(cells.items(), key=lambda item: (item[0][3], item[0][:3])):
        cell = {"method": method, "K": K, "L": L, "B": B, "groups": len(pairs),
                "tokens_per_call": sum(r["tokens"] for _, r, _ in pairs) / sum(sum(r["calls"]) for _, r, _ in pairs)}
        for prefix, prefill in (("", True), ("decode_", False)):
            def seconds(row, prefill=prefill):
                return row["seconds"] - (0.0 if prefill else row["prefill_s"])

            measured, low, high = interval([seconds(base) / seconds(row) for base, row, _ in pairs])
            prediction = statistics.fmean(predicted(base, prefill, priced) / predicted(row, prefill, priced)
                                          for base, row, priced in pairs)
            cell |= {f"{prefix}speedup": measured, f"{prefix}speedup_low": low, f"{prefix}speedup_high": high,
                     f"{prefix}predicted": prediction, f"{prefix}error": prediction / measured - 1.0}
            if any(base.get("forwards") for base, _, _ in pairs):
                static = statistics.fmean(predicted(base, prefill, costs) / predicted(row, prefill, costs)
                                          for base, row, _ in pairs)
                cell |= {f"{prefix}calibration_predicted": static, f"{prefix}calibration_error": static / measured - 1}
        summary.append(cell)
    return summary


def seconds_against_prediction(result: dict[str, Any]) -> dict[str, Any]:
    """Where a run's prediction went wrong, from its file alone: per B, the median of measured over predicted seconds
    after the prefill, for AR and for the rules (each group priced as ``summarise`` prices it); and, for groups whose
    forwards were timed again, the median of those forwards' seconds over the calibration's at the same shapes (the
    machine's drift between the calibration and the groups)."""
    costs, new_tokens = CallCosts.from_json(result["costs"]), int(result["settings"]["max_new_tokens"])
    chunk = result["settings"].get("prefill_chunk")
    ar = _ar_groups(result["groups"], costs)
    ratios: dict[str, dict[int, list[float]]] = {"ar": {}, "rules": {}}
    for row in result["groups"]:
        predicted = batch_decode_seconds(ar[(row["B"], row["group"])][1], row["method"], row["K"], row["L"],
                                         row["prompt_tokens"], row["calls"], new_tokens, chunk, False)
        kind = "ar" if row["method"] == "ar" else "rules"
        ratios[kind].setdefault(row["B"], []).append((row["seconds"] - row["prefill_s"]) / predicted)
    out: dict[str, Any] = {kind: {B: statistics.median(v) for B, v in sorted(by_B.items())}
                           for kind, by_B in ratios.items()}
    for role in ("target", "draft"):
        calibrated = getattr(costs, role).by_shape()
        again = [seconds / calibrated[shape] for base, priced in ar.values() if base.get("forwards")
                 for shape, seconds in getattr(priced, role).by_shape().items() if shape in calibrated]
        if again:
            out[f"{role}_drift"] = (statistics.median(again), len(again))
    return out


def rescore(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells of a batch bench's result (the ``batches`` section of its file) scored again by the cost model as it
    is now, from what the run kept: its groups and its calibration's costs. A revised model is checked against the
    timed groups without timing anything again; the committed file's own cells must come out unchanged."""
    if not result.get("costs"):
        raise ValueError("this batch bench kept no calibration (files written before 2026-12-07 did not): "
                         "time it again to score the model")
    settings = result["settings"]
    return summarise(result["groups"], CallCosts.from_json(result["costs"]), int(settings["max_new_tokens"]),
                     settings.get("prefill_chunk"))


def bench_batches(pair, prompts_by_dataset: dict[str, Sequence[torch.Tensor]], calibration_prompt: torch.Tensor,
                  contenders: Sequence[Contender], batches: Sequence[int], temperature: float,
                  new_tokens: int, prefill_chunk: int | None = None,
                  checkpoint: BatchCheckpoint | None = None, groups: dict[int, int] | None = None,
                  retime_repeats: int = 0) -> dict[str, Any]:
    """Calibrate, time the groups, summarise (see the module docstring); with ``checkpoint``, from what it kept.
    ``groups``: how many groups at each B (default: every whole group of the pool); ``retime_repeats`` > 0: each
    group's forwards timed again just before it (:func:`retime_forwards`)."""
    pool = prompt_pool(prompts_by_dataset)
    lengths = sorted(int(p.numel()) for _, p in pool)
    if checkpoint is not None and checkpoint.costs is not None:
        costs = CallCosts.from_json(checkpoint.costs)
    else:
        costs = calibrate(pair, calibration_prompt, contenders, batches, temperature, new_tokens,
                          [lengths[0], lengths[len(lengths) // 2], lengths[-1]], prefill_chunk)
        if checkpoint is not None:
            checkpoint.save_costs(costs)
    rows = time_groups(pair, pool, contenders, batches, temperature, new_tokens, prefill_chunk,
                       done=checkpoint.done() if checkpoint else None,
                       on_group=checkpoint.add_group if checkpoint else None, groups=groups,
                       retime_repeats=retime_repeats)
    cells = summarise(rows, costs, new_tokens, prefill_chunk)
    # the costs are kept with the groups: the prediction can be scored again from the file (``rescore``)
    result: dict[str, Any] = {"cells": cells, "groups": rows, "costs_source": costs.source, "costs": costs.to_json()}
    result |= error_summary(cells)
    result["settings"] = {"batches": list(batches), "datasets": list(prompts_by_dataset), "prompts": len(pool),
                          "temperature": temperature, "max_new_tokens": new_tokens, "prefill_chunk": prefill_chunk,
                          "contenders": [list(c) for c in contenders], "groups": groups,
                          "retime_repeats": retime_repeats}
    result["seconds_against_prediction"] = seconds_against_prediction(result)
    return result


def error_summary(cells: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median and worst |error| of the cells' predictions, end to end and after the prefill (``decode_``), and of
    the calibration's alone (``calibration_``) where the groups' forwards were timed again."""
    summary = {}
    for prefix in ("", "decode_"):
        for source in ("", "calibration_"):
            errors = [abs(c[f"{prefix}{source}error"]) for c in cells if f"{prefix}{source}error" in c]
            if errors:
                summary |= {f"{prefix}{source}median_abs_error": statistics.median(errors),
                            f"{prefix}{source}worst_abs_error": max(errors)}
    return summary


__all__ = ["AR", "BatchCheckpoint", "bench_batches", "calibrate", "checkpoint_identity", "decode_group",
           "error_summary", "group_costs", "group_plan", "interval", "prompt_pool", "rescore", "retime_forwards",
           "rule_Ks_Ls", "seconds_against_prediction", "summarise", "time_groups"]
