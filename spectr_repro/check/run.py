"""One ``check`` run: compose the command line, run the items in order, collect the result (``check.json``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from spectr_repro import models
from spectr_repro.check.checker import Checker
from spectr_repro.check.correctness import correctness_items, correctness_models, load_models
from spectr_repro.check.costs import (
    calibration_item,
    call_costs_item,
    measured_contexts,
    prediction_item,
    prompt_contexts,
    timing_item,
)
from spectr_repro.check.environment import environment_items, memory_item
from spectr_repro.cost import write_calibration
from spectr_repro.data import typical_prompt_tokens
from spectr_repro.errors import ResourceError
from spectr_repro.launch.config import Composer, UsageError, check_before_loading, expand, parse_arguments
from spectr_repro.settings import RunConfig, run_config
from spectr_repro.verify import VERIFIERS


def compose(argv: Sequence[str]):
    """(base config, every cell config) of the command line, through the runner's Hydra machinery, read at the door
    (``settings.RunConfig``)."""
    args = parse_arguments(argv)
    if args.sweeps:
        raise UsageError("check takes one value per key (an experiment gives it a grid's shapes)")
    if args.launcher_overrides:
        raise UsageError("hydra/launcher overrides apply to `sweep` only")
    with Composer() as composer:
        cells = [run_config(cfg) for cfg in expand(composer, args, use_grid=True)]  # first: it refuses unknown
        base = run_config(composer.compose(args.fixed))                            # nested keys by name
    check_before_loading([base, *cells])  # the checks every command that loads models shares
    return base, cells


def run_shapes(base: RunConfig, cells: Sequence[RunConfig], quick: bool = False) -> dict[str, Any]:
    """K, L, prefill chunks and prompt batch sizes of the cells of the base config's pair and of the experiment's
    replay grid (the base config's alone without either), the rules the cells and the replay run (their calls are
    timed on real blocks), and the context the forwards are measured on: the experiment's typical prompt plus half
    its new tokens (the mean context of a decoding call), and ``contexts`` (that one and each long-input bucket's
    input plus half its new tokens) when the replay has buckets. ``quick``: only the smallest and largest L and prefill
    chunk (the costs between are interpolated, see ``cost.calibration``)."""
    Ks, Ls, chunks, batches = {1, base.K}, {base.L}, set(), {1}
    methods = {base.method} - {"ar"}
    prompts = [typical_prompt_tokens(base.dataset)]
    for cell in cells:
        if cell.model_pair != base.model_pair:
            continue
        if cell.method != "ar":
            Ks.add(cell.K)
            Ls.add(cell.L)
            methods.add(cell.method)
        batches.add(cell.hardware.batch_prompts)
        prompt = typical_prompt_tokens(cell.dataset)
        prompts.append(prompt)
        chunk = cell.hardware.prefill_chunk or prompt
        chunks.update([min(chunk, prompt)] + ([prompt % chunk] if prompt > chunk and prompt % chunk else []))
    replay = base.group("replay")
    if replay.get("datasets"):  # an experiment's replay (config.yaml's default block names none)
        Ks.update(int(k) for k in [*(replay.get("K") or []), replay.get("reference_K") or base.K])
        Ls.update(int(v) for v in [*(replay.get("L") or []), replay.get("reference_L") or base.L])
        methods.update(str(m) for m in replay.get("methods") or VERIFIERS)
        prompts += [typical_prompt_tokens(name) for name in replay.get("datasets") or []]
    chunks.add(32)  # the runner's warm-up prompt
    if quick:
        Ls, chunks = {min(Ls), max(Ls)}, {min(chunks), max(chunks)}
    half = base.max_new_tokens // 2
    context = int(sorted(prompts)[len(prompts) // 2] + half)
    # the datasets the cells and the replay decode (the base config's alone without either)
    datasets = sorted({*(c.dataset for c in cells if c.model_pair == base.model_pair),
                       *(str(name) for name in replay.get("datasets") or [])} or {base.dataset})
    contexts, decode_contexts = measured_contexts({name: typical_prompt_tokens(name) + half for name in datasets})
    return {"Ks": sorted(Ks), "Ls": sorted(Ls), "prefill_chunks": sorted(chunks), "batch_sizes": sorted(batches),
            "methods": sorted(m for m in methods if m in VERIFIERS), "context": context,
            "contexts": contexts if not quick else [context],
            "decode_contexts": decode_contexts if not quick else [context], "datasets": datasets}


def run_check(argv: Sequence[str]) -> tuple[int, dict[str, Any]]:
    started = time.perf_counter()
    base, cells = compose(argv)
    settings = base.group("check")
    quick, random_weights = bool(settings.get("quick")), bool(settings.get("random_weights"))
    pair_cfg = models.pair_config(base.named_pair_values)
    shapes = run_shapes(base, cells, quick)
    checker = Checker()
    print(f"check: model pair {base.model_pair} on hardware={base.hardware_name}"
          f"{' (random weights)' if random_weights else ''}{' (quick)' if quick else ''}", file=sys.stderr)
    env = environment_items(checker, base)
    try:
        fits = memory_item(checker, base, pair_cfg, shapes, env["memory_free_bytes"])
    except ValueError as error:  # no config of the pair's architecture here: say so, load as usual
        fits = None
        checker.add("memory", "fits without offload", "skip", str(error))
    result: dict[str, Any] = {"model_pair": base.model_pair, "hardware": base.hardware_name,
                              "random_weights": random_weights, "quick": quick, "shapes": shapes,
                              "output": str(settings.get("output")), "environment": env}
    loaded = None
    if fits is False:
        checker.add("models", "load", "skip", "the pair does not fit: nothing loaded, no calibration")
    else:
        start = time.perf_counter()
        try:
            loaded = load_models(base, pair_cfg, random_weights)
            checker.add("models", "load", "pass", loaded.what, required=True, seconds=time.perf_counter() - start)
        except (ValueError, OSError, ImportError, ResourceError) as error:
            checker.add("models", "load", "fail", " ".join(str(error).split())[:400], required=True,
                        seconds=time.perf_counter() - start)
    if loaded is not None:
        target, draft = correctness_models(loaded, pair_cfg)
        correctness_items(checker, target, draft, loaded.vocab_size, quick)
        del target, draft
        if not quick:
            prompt_contexts(base, loaded, shapes)  # the real prompts' lengths in the pair's tokens, when it has some
        calibration = calibration_item(checker, base, pair_cfg, loaded, shapes, quick, env["device_name"])
        overhead = timing_item(checker, base, loaded, calibration, quick)
        if calibration is not None:
            if overhead is not None:
                calibration.extra["overhead_s_per_call"] = overhead
            if not (quick and random_weights):  # make reproduce's gate: the real-weight check after it times these
                call_costs_item(checker, base, loaded, calibration, shapes, quick)
            path = write_calibration(calibration)
            checker.add("calibration", "written", "info", f"{calibration.note} -> {path}")
            result["calibration"] = {"path": str(path), **calibration.to_json()}
            if settings.get("replay_summary"):
                result["prediction"] = prediction_item(checker, base, calibration, str(settings["replay_summary"]))
    result["items"] = [asdict(item) for item in checker.items]
    result["passed"] = checker.passed and loaded is not None
    result["wall_time_s"] = time.perf_counter() - started
    return (0 if result["passed"] else 1), result


__all__ = ["compose", "run_check", "run_shapes"]
