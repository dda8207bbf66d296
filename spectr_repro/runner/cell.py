"""One cell: its plan, and computing it: decode its prompts -> their records -> the cell's summary.

:func:`compute_cell` is the whole computation and writes nothing: the session
(:class:`~spectr_repro.runner.execute.Session`) claims the cell, hands it the pair, the prompts and the AR
baseline of the cell's group, and writes what it returns.
"""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from spectr_repro.data import encode_prompt
from spectr_repro.engine.loop import acceptance_by_position, generate
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.environment import environment
from spectr_repro.launch import claims
from spectr_repro.launch.stops import stop_checker, truncate_at_stop
from spectr_repro.records import CellSummary, PromptRecord, as_json, pooled_metrics, records_digest
from spectr_repro.runner import batched, store
from spectr_repro.settings import RunConfig

WARMUP_TOKENS = 8
WARMUP_PROMPT_TOKENS = 32  # warm-up needs the kernels, not the whole prompt (CPU prefill is slow)


@dataclass
class CellPlan:
    run: RunConfig
    cell_id: str
    directory: Path
    ar_cell_id: str | None  # None for the AR cell itself
    skip_note: str | None = None

    @property
    def method(self) -> str:
        return self.run.method


@dataclass(frozen=True)
class Baseline:
    """The AR baseline of a cell's group: per-prompt wall times, whether they were measured in this process,
    and the AR cell's own caveats (offload, contention). The AR cell itself has the empty one."""

    times: dict[str, float] = field(default_factory=dict)
    same_process: bool = True
    caveats: list[str] = field(default_factory=list)


@dataclass
class Decoded:
    """What :func:`decode_prompts` returns: per prompt (in order) its token ids, its output and its wall time
    (None: decoded in a batch, never timed); the split, the batches' wall time and the contention seen."""

    prompts: list[list[int]]
    outputs: list[Any]  # engine.loop.GenerationOutput
    walls: list[float | None]
    split: batched.PromptSplit
    batched_wall: float
    contention: dict[str, Any]


def compute_cell(plan: CellPlan, pair, examples: Sequence[Any], baseline: Baseline, watch: claims.ContentionWatch,
                 progress: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Decode the cell's prompts, then its records, then its summary: (record rows, summary) as JSON."""
    options = plan.run.method_options
    decoded = decode_prompts(plan, pair, examples, options, watch, progress)
    records = prompt_records(plan.run, pair.tokenizer, examples, decoded, baseline.times)
    rows = [as_json(r) for r in records]
    caveats = timing_caveats(bool(pair.offloaded), decoded.contention)
    caveats += [f"AR baseline: {caveat}" for caveat in baseline.caveats]
    summary = as_json(cell_summary(plan, pair, options, decoded, rows, baseline.same_process, caveats))
    return rows, summary


def decode_prompts(plan: CellPlan, pair, examples: Sequence[Any], options: dict[str, Any],
                   watch: claims.ContentionWatch, progress: bool = True) -> Decoded:
    """A warm-up, the batched prompts (block efficiency only), then every other prompt alone, timed."""
    run = plan.run
    method = plan.method

    def decode(input_ids, max_new_tokens, seed, should_stop=None):
        return generate(pair.target, pair.draft, input_ids, method=method, K=run.K, L=run.L,
                        temperature=run.temperature, max_new_tokens=max_new_tokens, seed=seed,
                        eos_token_ids=pair.eos_token_ids, should_stop=should_stop,
                        verifier_options=options or None, vocab_size=pair.vocab_size,
                        prefill_chunk=run.hardware.prefill_chunk, compile=run.hardware.compile)

    prompts = [encode_prompt(pair.tokenizer, example)[0].tolist() for example in examples]
    # One checker per prompt (each generation needs a fresh one), built before anything is timed: the first
    # one of a tokenizer builds the stop-string tables from its whole vocabulary.
    checkers = [stop_checker(pair.tokenizer, stop_strings(example)) for example in examples]
    # Warm-up (kernels, allocator, lazy init) so the first timed prompt is not charged for it.
    decode(prompts[0][-WARMUP_PROMPT_TOKENS:], min(WARMUP_TOKENS, run.max_new_tokens), seed=run.seed + 10**9)

    def seed_of(index):
        return run.seed * 100_003 + index

    # Batched block efficiency (hardware.batch_prompts > 1, runner.batched): all but the timed prompts.
    split = batched.split_prompts(run.hardware.batch_prompts, run.hardware.timed_prompts, len(prompts))
    batched_outputs, batched_wall = batched.decode_batches(pair, run, method, options, prompts, split, seed_of,
                                                           checkers.__getitem__, progress)

    timer = SectionTimer(pair.device)
    watch.sample()
    outputs, walls = [], []
    bar = tqdm(prompts, desc=f"{method} K={run.K} L={run.L}", unit="prompt",
               leave=False, file=sys.stderr, disable=not progress, dynamic_ncols=True)
    tokens = calls = 0
    for index, input_ids in enumerate(bar):
        key = f"wall_{index}"
        if index in batched_outputs:
            out, wall = batched_outputs[index], None  # decoded in a batch: BE only, never timed
        else:
            with timer(key):
                out = decode(input_ids, run.max_new_tokens, seed=seed_of(index), should_stop=checkers[index])
            wall = timer.seconds.pop(key)
            watch.sample()
        outputs.append(out)
        walls.append(wall)
        tokens += len(out.new_tokens)
        calls += out.target_calls
        bar.set_postfix(BE=f"{tokens / calls:.2f}" if calls else "-")
    bar.close()
    return Decoded(prompts, outputs, walls, split, batched_wall, watch.result())


def stop_strings(example) -> tuple[str, ...]:
    return tuple(getattr(example, "stop_strings", ()) or ())


def prompt_records(run: RunConfig, tokenizer, examples: Sequence[Any], decoded: Decoded,
                   ar_times: dict[str, float]) -> list[PromptRecord]:
    """One record per prompt: the decoded output, its wall time and the AR baseline's on the same prompt."""
    method = run.method
    records = []
    for example, input_ids, out, wall in zip(examples, decoded.prompts, decoded.outputs, decoded.walls):
        text = tokenizer.decode(out.new_tokens, skip_special_tokens=True)
        prompt_id = str(example.id)
        records.append(PromptRecord(
            prompt_id=prompt_id,
            method=method,
            K=run.K,
            L=run.L,
            temperature=run.temperature,
            seed=run.seed,
            prompt_tokens=len(input_ids),
            new_tokens=len(out.new_tokens),
            target_calls=out.target_calls,
            block_efficiency=out.block_efficiency,
            wall_time_s=wall,
            ar_wall_time_s=None if wall is None else wall if method == "ar" else ar_times.get(prompt_id),
            completion=truncate_at_stop(text, stop_strings(example)),
            reference=getattr(example, "reference", None),
            accepted_lengths=list(out.stats.get("accepted_lengths", [])),
            block_lengths=list(out.stats.get("block_lengths", [])),
            dataset=run.dataset,
            model_pair=run.model_pair,
            batch_prompts=out.stats.get("batch_prompts", 1),
        ))
    return records


def cell_summary(plan: CellPlan, pair, options: dict[str, Any], decoded: Decoded, rows: list[dict[str, Any]],
                 ar_same_process: bool, caveats: list[str]) -> CellSummary:
    """The cell's summary: its settings, the metrics pooled over ``rows``, acceptance by position, the time
    split, the environment and what makes its wall times incomparable (``caveats``)."""
    run, method = plan.run, plan.method
    pooled_accepted = [a for out in decoded.outputs for a in out.stats.get("accepted_lengths", [])]
    pooled_blocks = [b for out in decoded.outputs for b in out.stats.get("block_lengths", [])]
    time_split: dict[str, float] = {}
    for out in decoded.outputs:
        for section, seconds in out.stats.get("time_s", {}).items():
            time_split[section] = time_split.get(section, 0.0) + seconds
    return CellSummary(
        experiment=run.experiment,
        cell_id=plan.cell_id,
        method=method,
        method_options=options,
        dataset=run.dataset,
        model_pair=run.model_pair,
        hardware=run.hardware_name,
        K=run.K,
        L=run.L,
        temperature=run.temperature,
        seed=run.seed,
        max_new_tokens=run.max_new_tokens,
        **pooled_metrics(rows),  # tokens, target calls, pooled BE, wall times, speed-up, tokens/s
        acceptance_by_position=(
            [] if method == "ar" else acceptance_by_position(pooled_accepted, run.L, pooled_blocks)),
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


__all__ = ["Baseline", "CellPlan", "Decoded", "cell_summary", "compute_cell", "decode_prompts",
           "prompt_records", "stop_strings", "timing_caveats"]
