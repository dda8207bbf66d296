"""One bench preset, measured: composed with the hardware config (``compose_preset``), then every section it names
run in this process (``run``): AR against transformers' generate, SD against assisted generation, best against
best, the methods, the batch groups and the verification calls. ``bench.cli`` is the command around it."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from spectr_repro.bench import suites
from spectr_repro.bench.batches import BatchCheckpoint, bench_batches, checkpoint_identity, group_plan
from spectr_repro.bench.contenders import encode_prompts
from spectr_repro.cost import calibration
from spectr_repro.cost.measure import measure_forward_costs, plan_shapes
from spectr_repro.cost.model import CallCosts
from spectr_repro.cost.predict import best_configuration, predict_tokens_per_s, read_replay_summary
from spectr_repro.environment import environment
from spectr_repro.errors import UsageError
from spectr_repro.launch.config import Composer, check_device
from spectr_repro.launch.fit import check_batch_fits
from spectr_repro.models import clear_cache, load_pair
from spectr_repro.settings import run_config


def default_device(asked: str | None) -> str:
    """``asked``, else cuda where there is one, else cpu; refused (UsageError) where it is not here."""
    device = asked or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device, "--device cpu")  # the message every command that loads models gives, before any loads
    return device


def compose_preset(name: str, device: str):
    """The bench preset ``name`` and the hardware config of ``device`` (cpu or cuda), through Hydra. A preset with
    ``batches`` is refused here, before any model loads, when its largest batch does not fit the device's memory
    (UsageError naming the largest B that does)."""
    with Composer() as composer:
        cfg = composer.compose([f"+bench={name}", f"hardware={device}"])
        batches = cfg.bench.get("batches")
        if batches:
            whole = composer.compose([f"+bench={name}", f"hardware={device}", f"model_pair={cfg.bench.pair}",
                                      f"dataset={batches.datasets[0]}", f"max_new_tokens={cfg.bench.max_new_tokens}"])
            check_batch_fits(run_config(whole), max(int(b) for b in batches.B),
                             max(int(c[1]) for c in batches.contenders), max(int(c[2]) for c in batches.contenders),
                             f"bench.batches.B (preset {name})")
            check_groups(batches, name)
    return cfg.bench, cfg.hardware


def check_groups(batches, name: str) -> None:
    """``bench.batches.groups`` refused at the door (UsageError), before any model loads, where the pool of
    ``prompts_per_dataset`` × datasets cannot hold the groups it asks for or it names a B the preset does not time."""
    groups = batches.get("groups")
    try:
        group_plan(int(batches.prompts_per_dataset) * len(batches.datasets), [int(b) for b in batches.B],
                   {int(b): int(n) for b, n in groups.items()} if groups else None)
    except ValueError as error:
        raise UsageError(f"bench.batches.groups (preset {name}): {error}") from None


def predicted_pick(replay_summary: str, hardware, preset, pair, prompts, calibrate=None) -> dict:
    """ours_best predicted from a replay summary and the pair's costs measured here, in this process, just before
    the rounds (``cost.measure.measure_forward_costs`` at the shapes the replay's K and L call): a cost
    file written earlier by ``check`` can be off by the machine's drift since (measured: 120 ms, then 207 ms,
    for one decode forward on the shared 2-core VM); its per-call overhead is used where there is one.
    ``calibrate``: (pair, shapes) -> (target costs, draft costs), for tests."""
    try:
        columns = pd.read_csv(replay_summary, nrows=0).columns
        # The replay's rows at the bench's setting: its temperature and, for a replay of several datasets, its dataset.
        wanted = {"temperature": float(preset.temperature), "dataset": preset.get("dataset")}
        table = read_replay_summary(replay_summary, {key: value for key, value in wanted.items()
                                                     if key in columns and value is not None})
    except (OSError, ValueError) as error:
        raise UsageError(str(error)) from None
    prompt_tokens = round(sum(len(p) for p in prompts) / len(prompts))
    shapes = plan_shapes(sorted(set(table["K"].astype(int))), sorted(set(table["L"].astype(int))), [prompt_tokens])

    def measure(pair, shapes):
        return tuple(measure_forward_costs(model, shapes[role], repeats=3, vocab_size=pair.vocab_size)
                     for model, role in ((pair.target, "target"), (pair.draft, "draft")))

    target, draft = (calibrate or measure)(pair, shapes)
    stored = calibration.find_calibration("cuda" if pair.device.type == "cuda" else "cpu", preset.pair,
                                          str(pair.dtype).removeprefix("torch."))
    # The forwards from this process; the rules' calls and the sections' overheads from `check`'s calibration.
    stored_costs = CallCosts.from_calibration(stored) if stored is not None else CallCosts(target, draft)
    costs = dataclasses.replace(stored_costs, target=target, draft=draft)
    predictions = predict_tokens_per_s(table, costs, prompt_tokens, int(preset.max_new_tokens))
    return best_configuration(predictions) | {
        "calibration": (f"forwards measured in this process before the rounds, {calibration.today()}"
                        + (f"; rules and overheads {stored.note}" if stored is not None else "")),
        "predictions": json.loads(predictions.head(10).to_json(orient="records"))}


def run(preset, hardware, device: str | None, dtype: str | None, replay_summary: str | None = None,
        checkpoint: Path | None = None) -> dict:
    """Every section of ``preset``; the batch section keeps its progress in ``checkpoint`` and resumes from it."""
    chunk = hardware.get("prefill_chunk")
    # A preset may leave sections out (e.g. verification_qwen: the verification rows only).
    results: dict = {"settings": {key: preset.get(key) for key in ("dataset", "num_prompts", "max_new_tokens",
                                                                    "temperature", "repeats", "assist_L")},
                     "ar_vs_hf_generate": {}, "sd_vs_hf_assisted": {}, "methods": {}}
    T, n, m, repeats = preset.temperature, preset.num_prompts, preset.max_new_tokens, preset.repeats
    started = time.perf_counter()
    for name in preset.get("pairs_ar") or []:
        if name == preset.pair:
            continue  # measured below, with the pair loaded once
        pair = load_pair(name, device=device, dtype=dtype)
        prompts = encode_prompts(pair, preset.dataset, n)
        results["ar_vs_hf_generate"][name] = suites.bench_ar_vs_hf(pair, prompts, T, m, repeats, chunk)
        del pair
        clear_cache()  # one pair in memory at a time
    pair = load_pair(preset.pair, device=device, dtype=dtype)
    prompts = encode_prompts(pair, preset.dataset, n)
    if preset.pair in (preset.get("pairs_ar") or []):
        results["ar_vs_hf_generate"][pair.name] = suites.bench_ar_vs_hf(pair, prompts, T, m, repeats, chunk)
    if preset.get("assist_L"):
        results["sd_vs_hf_assisted"][pair.name] = suites.bench_sd_vs_assisted(pair, prompts, T, m, preset.assist_L,
                                                                             repeats, chunk)
    best = preset.get("best_vs_best")
    if best:
        pick = predicted_pick(replay_summary, hardware, preset, pair, prompts) if replay_summary else None
        results["best_vs_best"] = {pair.name: suites.bench_best_vs_best(
            pair, prompts, T, m, best.equal_L, [tuple(c) for c in best.candidates], repeats, chunk, pick=pick)}
    if preset.get("methods"):
        results["methods"][pair.name] = suites.bench_methods(pair, prompts, T, m,
                                                             [tuple(p) for p in preset.methods], chunk)
    if preset.get("batches"):
        results["batches"] = {"pair": pair.name, **_batches(pair, preset.batches, T, m, chunk, checkpoint)}
    ver = preset.get("verification")
    if ver:
        results["verification"] = {"target_model": pair.name, "rows": suites.bench_verification(
            pair, prompts[0], list(ver.Ks), list(ver.Ls), ver.repeats, ver.blocks_per_shape, chunk,
            rules=list(ver.get("rules") or []) or None)}
    results["environment"] = environment(str(pair.device))
    results["wall_time_s"] = time.perf_counter() - started
    return results


def _batches(pair, spec, temperature: float, new_tokens: int, chunk, checkpoint: Path | None = None) -> dict:
    """The timed batch groups of ``spec`` (``bench.batches``): each dataset's first ``prompts_per_dataset`` prompts,
    and the next prompt of the first dataset for the calibration (decoded by no group)."""
    needed = int(spec.prompts_per_dataset)
    prompts = {str(name): encode_prompts(pair, str(name), needed + (1 if i == 0 else 0))
               for i, name in enumerate(spec.datasets)}
    calibration_prompt = prompts[str(spec.datasets[0])].pop()
    kept = None
    if checkpoint is not None:
        identity = checkpoint_identity(pair, OmegaConf.to_container(spec, resolve=True), temperature, new_tokens, chunk)
        kept = BatchCheckpoint(checkpoint, identity)
        if kept.note:
            print(kept.note, file=sys.stderr)
    groups = spec.get("groups")
    return bench_batches(pair, prompts, calibration_prompt, [tuple(c) for c in spec.contenders],
                         [int(b) for b in spec.B], temperature, new_tokens, chunk, kept,
                         groups={int(b): int(n) for b, n in groups.items()} if groups else None,
                         retime_repeats=int(spec.get("retime_repeats", 0)))


def checkpoint_path(out: Path) -> Path:
    """Where a bench writing ``out`` keeps its progress (the batch section: an hour or more on a CPU)."""
    return out.with_name(f"{out.stem}.partial.json")


__all__ = ["checkpoint_path", "compose_preset", "default_device", "predicted_pick", "run"]
