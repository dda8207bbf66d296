"""Speed-up against batch size, timed: B prompts decoded together (``engine.generate_batch``) by AR and by each
rule, in one process, and the one cost model's prediction for the same batches.

    python -m spectr_repro bench --preset batch_qwen

For each batch size B and dataset, ``groups`` groups of B distinct prompts; within a group every contender (AR and
each (rule, K, L)) decodes the same B prompts with the same seeds, EOS off, so all emit B x ``max_new_tokens``
tokens, in an order that rotates from group to group (the VM's drift falls on every contender alike). A group's
speed-up is AR's wall time over the rule's (AR at the same B: the baseline a server at that batch has); the
interval is a t interval over the groups (paired: each ratio is of one group's two decodes).

The prediction is made before any timed round, from costs measured in this process on other inputs: every forward
at the batch shapes (``cost.measure.measure_forward_costs``), the rules' calls on real blocks drafted from a prompt
no group decodes, and each section's overhead on real decodes of that prompt at B = 1
(``cost.measure.measure_section_residuals``). The timed groups' own target calls per prompt are then priced by
``cost.batch_speedup.batch_decode_seconds``: what is checked is the cost model at B, not a block efficiency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from scipy import stats
from tqdm.auto import tqdm

from spectr_repro.bench.measure import timed
from spectr_repro.cost.batch_speedup import batch_decode_seconds
from spectr_repro.cost.measure import (
    measure_forward_costs,
    measure_rule_seconds,
    measure_section_residuals,
    plan_shapes,
    record_blocks,
)
from spectr_repro.cost.model import CallCosts, SectionOverheads
from spectr_repro.engine import generate_batch

Contender = tuple[str, int, int]  # (method, K, L); AR is ("ar", 1, 1)
AR: Contender = ("ar", 1, 1)
WARMUP_TOKENS = 4


def calibrate(pair, prompt: torch.Tensor, contenders: Sequence[Contender], batches: Sequence[int],
              temperature: float, new_tokens: int, prefill_tokens: Sequence[int], prefill_chunk: int | None = None,
              repeats: int = 3) -> CallCosts:
    """The cost model of this pair here and now, measured on ``prompt`` (one no timed group decodes); prefills at
    ``prefill_tokens`` (the groups' shortest, median and longest prompt: interpolated between)."""
    rules = [c for c in contenders if c[0] != "ar"]
    Ks, Ls = sorted({K for _, K, _ in rules}), sorted({L for _, _, L in rules})
    context = int(prompt.numel()) + new_tokens // 2
    chunks = sorted({min(int(n), int(prefill_chunk or n)) for n in prefill_tokens})
    shapes = plan_shapes(Ks, Ls, chunks, batches)
    target = measure_forward_costs(pair.target, shapes["target"], repeats, context, pair.vocab_size)
    draft = measure_forward_costs(pair.draft, shapes["draft"], repeats, context, pair.vocab_size)
    blocks = record_blocks(pair.target, pair.draft, prompt.to(pair.device), max(Ks), max(Ls), 3, temperature,
                           pair.vocab_size, prefill_chunk)
    rule_seconds = measure_rule_seconds(blocks, rules)
    corners = sorted({(min(Ks), min(Ls)), (min(Ks), max(Ls)), (max(Ks), min(Ls)), (max(Ks), max(Ls))})
    residuals = measure_section_residuals(pair.target, pair.draft, prompt.to(pair.device), corners, target, draft,
                                          rule_seconds, temperature, calls=5, vocab_size=pair.vocab_size,
                                          prefill_chunk=prefill_chunk)
    return CallCosts(target, draft, rule_seconds, SectionOverheads.fit(residuals),
                     source="measured in this process before the timed groups, on a prompt no group decodes")


def decode_group(pair, prompts: Sequence[torch.Tensor], contender: Contender, temperature: float, new_tokens: int,
                 seed: int, prefill_chunk: int | None = None) -> dict[str, Any]:
    """One timed ``generate_batch`` of ``prompts`` (EOS off): wall seconds, tokens, each prompt's target calls."""
    method, K, L = contender
    seconds, out = timed(pair.device, lambda: generate_batch(
        pair.target, None if method == "ar" else pair.draft, [p.to(pair.device) for p in prompts], method=method,
        K=K, L=L, temperature=temperature, max_new_tokens=new_tokens, seeds=[seed + i for i in range(len(prompts))],
        eos_token_ids=(), vocab_size=pair.vocab_size, prefill_chunk=prefill_chunk))
    return {"seconds": seconds, "prefill_s": out.stats["time_s"].get("prefill", 0.0),
            "tokens": sum(len(o.new_tokens) for o in out.outputs), "calls": [o.target_calls for o in out.outputs]}


def time_groups(pair, prompts_by_dataset: dict[str, Sequence[torch.Tensor]], contenders: Sequence[Contender],
                batches: Sequence[int], groups: int, temperature: float, new_tokens: int,
                prefill_chunk: int | None = None) -> list[dict[str, Any]]:
    """One row per (B, dataset, group, contender): the group's decode (see the module docstring)."""
    contenders = [AR, *[c for c in contenders if c != AR]]
    rows, turn = [], 0
    plan = [(B, name, g) for B in batches for name in prompts_by_dataset for g in range(groups)]
    for B, name, g in tqdm(plan, desc=f"batches [{pair.name}]", unit="group", leave=False):
        chosen = list(prompts_by_dataset[name][g * B:(g + 1) * B])
        if len(chosen) < B:
            raise ValueError(f"{name} has {len(prompts_by_dataset[name])} prompts; group {g} at B={B} needs "
                             f"{(g + 1) * B}")
        if g == 0 and name == next(iter(prompts_by_dataset)):  # a warm-up at each B: threads, allocator, kernels
            for contender in (AR, contenders[-1]):
                decode_group(pair, chosen, contender, temperature, WARMUP_TOKENS, 10**6, prefill_chunk)
        order = contenders[turn % len(contenders):] + contenders[:turn % len(contenders)]
        turn += 1
        for contender in order:
            decoded = decode_group(pair, chosen, contender, temperature, new_tokens, 1000 * g, prefill_chunk)
            rows.append({"B": B, "dataset": name, "group": g, "method": contender[0], "K": contender[1],
                         "L": contender[2], "prompt_tokens": [int(p.numel()) for p in chosen], **decoded})
    return rows


def interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % t interval (NaN bounds from one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def summarise(rows: Sequence[dict[str, Any]], costs: CallCosts, new_tokens: int,
              prefill_chunk: int | None = None) -> list[dict[str, Any]]:
    """Per (rule, K, L, B): the measured speed-up over AR at the same B with its interval, tokens per call, and the
    cost model's speed-up for the same groups (their own calls per prompt) with its error."""
    def predicted(row) -> float:
        return batch_decode_seconds(costs, row["method"], row["K"], row["L"], row["prompt_tokens"], row["calls"],
                                    new_tokens, prefill_chunk)

    ar = {(r["B"], r["dataset"], r["group"]): r for r in rows if r["method"] == "ar"}
    cells: dict[tuple, list[tuple[float, float, dict]]] = {}
    for row in rows:
        if row["method"] == "ar":
            continue
        base = ar[(row["B"], row["dataset"], row["group"])]
        if row["tokens"] != base["tokens"]:
            raise ValueError(f"{row['method']} emitted {row['tokens']} tokens, AR {base['tokens']}: not comparable")
        cells.setdefault((row["method"], row["K"], row["L"], row["B"]), []).append(
            (base["seconds"] / row["seconds"], predicted(base) / predicted(row), row))
    summary = []
    for (method, K, L, B), values in sorted(cells.items(), key=lambda item: (item[0][3], item[0][:3])):
        measured, low, high = interval([m for m, _, _ in values])
        prediction = statistics.fmean(p for _, p, _ in values)
        tokens = sum(r["tokens"] for _, _, r in values)
        calls = sum(sum(r["calls"]) for _, _, r in values)
        summary.append({"method": method, "K": K, "L": L, "B": B, "groups": len(values),
                        "tokens_per_call": tokens / calls, "speedup": measured, "speedup_low": low,
                        "speedup_high": high, "predicted": prediction, "error": prediction / measured - 1.0})
    return summary


def bench_batches(pair, prompts_by_dataset: dict[str, Sequence[torch.Tensor]], calibration_prompt: torch.Tensor,
                  contenders: Sequence[Contender], batches: Sequence[int], groups: int, temperature: float,
                  new_tokens: int, prefill_chunk: int | None = None) -> dict[str, Any]:
    """Calibrate, time the groups, summarise (see the module docstring)."""
    lengths = sorted(int(p.numel()) for prompts in prompts_by_dataset.values()
                     for p in prompts[:groups * max(batches)])
    costs = calibrate(pair, calibration_prompt, contenders, batches, temperature, new_tokens,
                      [lengths[0], lengths[len(lengths) // 2], lengths[-1]], prefill_chunk)
    rows = time_groups(pair, prompts_by_dataset, contenders, batches, groups, temperature, new_tokens, prefill_chunk)
    cells = summarise(rows, costs, new_tokens, prefill_chunk)
    errors = [abs(c["error"]) for c in cells]
    return {"cells": cells, "groups": rows, "costs_source": costs.source,
            "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
            "settings": {"batches": list(batches), "groups": groups, "datasets": list(prompts_by_dataset),
                         "temperature": temperature, "max_new_tokens": new_tokens,
                         "contenders": [list(c) for c in contenders]}}


def markdown(result: dict[str, Any], pair_name: str) -> str:
    """The timed cells as a table, with the prediction's median and worst error."""
    settings = result["settings"]
    lines = [f"Speed-up against batch size on {pair_name} ({', '.join(settings['datasets'])}; {settings['groups']} "
             f"group(s) of B prompts per dataset; {settings['max_new_tokens']} tokens a prompt, EOS off; "
             f"T={settings['temperature']}; AR at the same B is 1.0):", "",
             "| rule | K | L | B | groups | tokens per call | measured (95 %) | predicted | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        bounds = "" if math.isnan(c["speedup_low"]) else f" [{c['speedup_low']:.2f}, {c['speedup_high']:.2f}]"
        lines.append(f"| {c['method']} | {c['K']} | {c['L']} | {c['B']} | {c['groups']} | {c['tokens_per_call']:.2f} | "
                     f"{c['speedup']:.2f}{bounds} | {c['predicted']:.2f} | {100 * c['error']:+.0f} % |")
    lines += ["", f"Prediction ({result['costs_source']}): median |error| {100 * result['median_abs_error']:.1f} %, "
              f"worst {100 * result['worst_abs_error']:.1f} % over {len(result['cells'])} cells."]
    return "\n".join(lines)


__all__ = ["AR", "bench_batches", "calibrate", "decode_group", "interval", "markdown", "summarise", "time_groups"]
