"""``check``'s cost items: the calibration of ``plan`` (seconds per forward), the timing sanity check (and the
overhead per call it measures), the predicted fastest configuration from a replay (``spectr_repro.cost``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from spectr_repro.check.checker import Checker
from spectr_repro.check.correctness import LoadedPair, random_prompts
from spectr_repro.cost import (
    Calibration,
    best_configuration,
    describe_best,
    predict_tokens_per_s,
    read_replay_summary,
    seconds_per_call,
    today,
)
from spectr_repro.cost.measure import (
    CONTEXT_TOKENS,
    machine_roofline_figures,
    measure_forward_costs,
    measure_rule_seconds,
    measure_section_residuals,
    plan_shapes,
    record_blocks,
)
from spectr_repro.cost.model import CallCosts, SectionOverheads, rule_key
from spectr_repro.data import bucket_tokens, encode_prompt, load_examples, typical_prompt_tokens
from spectr_repro.engine import generate
from spectr_repro.verify import VERIFIERS

TIMING_TOLERANCE = 0.05  # section times vs synchronised wall time (issue 26)


def calibration_item(checker: Checker, base, pair_cfg, loaded: LoadedPair, shapes, quick: bool, device_name: str):
    wanted = plan_shapes(shapes["Ks"], shapes["Ls"], shapes["prefill_chunks"], shapes["batch_sizes"])
    repeats = 3  # medians of 3 rounds, quick too: one timed forward per shape once read 880 ms for a 320 ms shape

    # the shortest and longest ordinary context and every long-input bucket's (check.run.measured_contexts);
    # ForwardCosts interpolates between them
    context = int(shapes.get("context") or CONTEXT_TOKENS)
    contexts = [int(c) for c in shapes.get("contexts") or [context]]

    def measure():
        target = measure_forward_costs(loaded.target, wanted["target"], repeats, contexts, loaded.vocab_size)
        draft = measure_forward_costs(loaded.draft, wanted["draft"], repeats, contexts, loaded.vocab_size)
        calibration = Calibration(
            hardware=base.hardware_name, model_pair=base.model_pair,
            dtype=base.dtype, device=device_name, date=today(),
            random_weights=loaded.what.startswith("random"), target=target, draft=draft,
            extra={"repeats": repeats, "shapes": shapes,
                   # this machine's two roofs, for the report's roofline against these calibrated forwards
                   **machine_roofline_figures(next(loaded.target.parameters()).device, loaded.target.dtype)})
        detail = (f"{len(wanted['target'])} target and {len(wanted['draft'])} draft shapes on "
                  f"{', '.join(f'{c:,}' for c in contexts)} cached tokens; decode "
                  f"{1e3 * target.seconds(1, 1):.1f} / {1e3 * draft.seconds(1, 1):.1f} ms (target / draft)")
        return None, detail, calibration

    return checker.run("calibration", "seconds per forward", measure, required=True)


def call_costs_item(checker: Checker, base, loaded: LoadedPair, calibration, shapes, quick: bool) -> None:
    """The rest of the call cost model (``cost.model.CallCosts``), into ``calibration.extra``: every rule's seconds
    per call at the run's (K, L), timed on real blocks of the pair (``cost.measure.record_blocks``; random weights
    give random blocks, and the note says so), and each engine section's overhead fitted on real decodes at the
    corners of the grid (``cost.measure.measure_section_residuals``)."""
    Ks, Ls, methods = shapes["Ks"], shapes["Ls"], shapes.get("methods") or ["sd"]
    grid = [(rule, K, L) for rule in dict.fromkeys([*methods, "sd", "spectr"]) for K in Ks for L in Ls
            if not (VERIFIERS[rule].single_draft and K != 1)]
    temperature = base.temperature
    device = next(loaded.target.parameters()).device
    context = int(shapes.get("context") or 64)
    decode_contexts = [int(c) for c in shapes.get("decode_contexts") or shapes.get("contexts") or [context]]
    prompt, *decode_prompts = calibration_prompts(base, loaded, [context, *decode_contexts], device)
    prefill_chunk = base.hardware.prefill_chunk

    def rules():
        blocks = record_blocks(loaded.target, loaded.draft, prompt, max(Ks), max(Ls), 2 if quick else 3,
                               temperature, loaded.vocab_size, prefill_chunk)
        seconds = measure_rule_seconds(blocks, grid)
        calibration.extra["rule_seconds"] = {rule_key(*key): value for key, value in seconds.items()}
        slowest = max(seconds, key=seconds.get)
        return None, (f"{len(seconds)} (rule, K, L) on {len(blocks)} {loaded.what.split(',')[0]} block(s); slowest "
                      f"{rule_key(*slowest)} {1e3 * seconds[slowest]:.1f} ms"), seconds

    def overheads():
        corners = sorted({(min(Ks), min(Ls)), (min(Ks), max(Ls)), (max(Ks), min(Ls)), (max(Ks), max(Ls))})
        rule_seconds = _decoded_rule_seconds(calibration)
        residuals = []
        # Each shape at every context back to back (and AR's token, whose cost beyond the forward also grows with
        # the context), so that the machine's drift is not read as a cost of context.
        for shape in [*corners, None]:
            for at_context in decode_prompts:
                residuals += measure_section_residuals(loaded.target, loaded.draft, at_context,
                                                       [shape] if shape else [], calibration.target,
                                                       calibration.draft, rule_seconds, temperature,
                                                       calls=3 if quick else 5, vocab_size=loaded.vocab_size,
                                                       prefill_chunk=prefill_chunk, ar=shape is None)
        fitted = SectionOverheads.fit(residuals)
        calibration.extra["section_overheads"] = fitted.to_json()
        calibration.extra["section_residuals"] = residuals
        K, L = max(Ks), max(Ls)
        parts = ", ".join(f"{section} {1e3 * fitted.seconds(section, K, L):.1f}" for section in fitted.fits)
        decoded = sum(row["K"] > 0 for row in residuals)
        return None, f"{decoded} decodes; at K={K} L={L} (ms per call beyond forwards and rule): {parts}", None

    checker.run("calibration", "rule calls on real blocks", rules, required=False)
    checker.run("calibration", "section overheads", overheads, required=False)


def _decoded_rule_seconds(calibration) -> dict:
    return CallCosts.from_calibration(calibration).rule_seconds


def measured_contexts(by_dataset: dict[str, int]) -> tuple[list[int], list[int]]:
    """The contexts ``check`` measures forwards at, and those it decodes at, from each dataset's mean context of a
    call. Forwards: the shortest and the longest ordinary context (the costs are interpolated between them: a cell
    of 528-token HumanEval prompts priced at a 204-token median context ran 10-30 % slower than predicted,
    2026-12-03) and every long-input bucket's, so that its calls are priced from a measurement, not extrapolated.
    Decodes (each a prefill of its context and a few calls at every corner of the grid): the two ordinary ends, or
    the shortest bucket without ordinary datasets; the context terms of the overheads extend them."""
    ordinary = [c for name, c in by_dataset.items() if bucket_tokens(name) is None]
    buckets = [c for name, c in by_dataset.items() if bucket_tokens(name) is not None]
    decode = sorted({min(ordinary), max(ordinary)}) if ordinary else [min(buckets)]
    return sorted({*decode, *buckets}), decode


def prompt_contexts(base, loaded: LoadedPair, shapes: dict, most: int = 16) -> None:
    """``shapes["contexts"]`` from the datasets' real prompts in the pair's tokens (the first ``num_prompts`` a run
    decodes, at most ``most``, each plus half the new tokens; their shortest and longest mean), instead of the
    registry's typical lengths: the first four HumanEval prompts a run decodes on the Qwen pair average 528 tokens,
    against a typical 180 (2026-12-03). Unchanged without a tokenizer or a local copy of the data."""
    if loaded.tokenizer is None:
        return

    means = {}
    for name in shapes.get("datasets") or [base.dataset]:
        try:
            examples = load_examples(name, min(base.num_prompts, most), seed=base.seed,
                                     tokenizer=loaded.tokenizer)
        except (OSError, ValueError, KeyError):
            continue
        lengths = [encode_prompt(loaded.tokenizer, example).shape[-1] for example in examples]
        means[name] = round(sum(lengths) / len(lengths)) + base.max_new_tokens // 2
    if means:
        shapes["contexts"], shapes["decode_contexts"] = measured_contexts(means)


CALIBRATION_PROMPTS = 16  # dataset prompts, one after another, that the calibration's contexts are cut from


def calibration_prompts(base, loaded: LoadedPair, lengths: Sequence[int], device) -> list:
    """One prompt of each length in ``lengths`` (the contexts the forwards were measured on): the last ``length``
    tokens of the experiment's dataset's first prompts one after another when the pair has a tokenizer (real blocks
    need real text, and a long context is real text too), else random tokens. The prompts are tokenized once for
    every length: each a list of 16 prompts through the tokenizer would cost a real tokenizer seconds per context."""
    text = None
    if loaded.tokenizer is not None:
        try:
            examples = load_examples(base.dataset, CALIBRATION_PROMPTS, seed=0,
                                     tokenizer=loaded.tokenizer)
            text = torch.cat([encode_prompt(loaded.tokenizer, example)[0] for example in examples]).to(device)
        except (OSError, ValueError) as error:  # no local copy of the dataset: random tokens, said in the item
            print(f"check: calibration prompt from random tokens ({error})", file=sys.stderr)
    random = random_prompts(1, max(lengths), loaded.vocab_size, device, seed=3)[0].to(torch.long)
    return [text[-length:] if text is not None and text.numel() >= length else random[:length] for length in lengths]


def timing_item(checker: Checker, base, loaded: LoadedPair, calibration, quick: bool):
    """One prompt decoded at the configured method: sections vs wall time; the overhead per call that the
    forwards do not explain (sampling, verification, cache bookkeeping) goes into the calibration."""
    method = base.method
    K = 1 if method == "ar" or VERIFIERS[method].single_draft else base.K
    L = 1 if method == "ar" else base.L
    device = next(loaded.target.parameters()).device
    prompt = random_prompts(1, 48, loaded.vocab_size, device, seed=2)[0]

    def check():
        out = generate(loaded.target, loaded.draft, prompt, method=method, K=K, L=L, temperature=float(
            base.temperature), max_new_tokens=16 if quick else 32, seed=0, vocab_size=loaded.vocab_size,
            prefill_chunk=base.hardware.prefill_chunk)
        times = out.stats["time_s"]
        sections = sum(v for k, v in times.items() if k != "total")
        gap = abs(times["total"] - sections) / times["total"]
        overhead = None
        if calibration is not None and method != "ar" and out.target_calls > 1:
            forwards = seconds_per_call(calibration.target, calibration.draft, K, L)
            decode = times["total"] - times.get("prefill", 0.0)
            overhead = max(0.0, decode / (out.target_calls - 1) - forwards)
        detail = (f"{method} K={K} L={L}: sections {sections:.3f} s, wall {times['total']:.3f} s "
                  f"({100 * gap:.1f} % apart, tolerance {100 * TIMING_TOLERANCE:.0f} %)")
        if overhead is not None:
            detail += f"; {1e3 * overhead:.1f} ms per call outside the forwards"
        return gap <= TIMING_TOLERANCE, detail, overhead

    return checker.run("timing", "sections sum to the synchronised wall time", check)


def prediction_item(checker: Checker, base, calibration, replay_summary: str) -> dict | None:
    def predict():
        table = read_replay_summary(replay_summary, _replay_filters(base, replay_summary))
        predictions = predict_tokens_per_s(table, CallCosts.from_calibration(calibration),
                                           typical_prompt_tokens(base.dataset), base.max_new_tokens)
        best = best_configuration(predictions)
        return None, describe_best(best), {"best": best, "predictions": predictions.to_dict("records")}

    return checker.run("prediction", "fastest lossless configuration", predict, required=False)


def _replay_filters(base, path: str) -> dict[str, Any]:
    """Select the replay rows of this command's pair, dataset and temperature where the CSV has those columns."""
    columns = set(pd.read_csv(path, nrows=0).columns)
    wanted = {"model_pair": base.model_pair, "dataset": base.dataset, "temperature": base.temperature}
    return {key: value for key, value in wanted.items() if key in columns}


__all__ = ["CALIBRATION_PROMPTS", "TIMING_TOLERANCE", "calibration_item", "calibration_prompts", "call_costs_item",
           "prediction_item", "timing_item"]
