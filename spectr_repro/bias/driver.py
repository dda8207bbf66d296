"""``python -m spectr_repro bias``: does a rule change the law of the first token it emits? Real models.

    python -m spectr_repro bias model_pair=tiny_random method=spectr_gbv,sbv K=3 L=6 bias.samples=32
    python -m spectr_repro bias experiment=bias_qwen          # the experiment's grid of settings

Keys are those of ``sweep`` (composed and validated by :mod:`spectr_repro.runner.config`: the same keys,
the same messages), plus ``bias.*`` (conf/config.yaml). Cells sharing everything but the method form one
setting. For each of its contexts (per prompt, ``bias.contexts_per_prompt`` cuts of an AR continuation
sampled from the target, where its top token has probability nearest 1/2: see ``contexts_of``) it draws
``bias.samples`` independent draft sets, B = ``bias.batch`` at a time (the draft model on B*K rows, then
the target on the same B*K rows), and every method of the setting -- plus the negative controls -- is
applied to the SAME draft sets and target rows. p(.|context) is the target's row 0, from the same
forward. Estimators and the test: :mod:`spectr_repro.bias.estimators`.

Output: ``<output_dir>/<experiment>/bias/bias.csv`` (rebuilt from one JSON per (setting, context, method)
under ``bias/contexts/``, written as each context finishes: a rerun skips finished contexts, so an
interrupted run resumes). Bad input: one message, exit 2, before any model loads, nothing written.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from spectr_repro.bias import estimators
from spectr_repro.runner.config import (
    Composer,
    UsageError,
    check_device,
    check_writable,
    expand,
    parse_arguments,
    print_help_if_asked,
    single_draft_message,
    validate,
)
from spectr_repro.runner.pairs import PairCache
from spectr_repro.verify import VERIFIERS, get_verifier

CSV_COLUMNS = ["model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature", "context",
               "samples", "tv_estimate", "interval", "p_value", "detectable_tv", "verdict", "estimator",
               "acceptance", "exact_tv"]
TOP_TOKENS = 12  # tokens kept per (method, context) for the report's figure


def bias_folder(cfg: DictConfig) -> Path:
    return Path(cfg.output_dir).expanduser() / cfg.experiment / "bias"


def check_bias_config(cfg: DictConfig) -> None:
    """The bias-specific keys and the single-draft rule (UsageError, before any model loads)."""
    settings = cfg.get("bias")
    if not isinstance(settings, DictConfig):
        raise UsageError("the config has no `bias` section (conf/config.yaml)")
    for key in ("samples", "batch", "rule_calls", "continuation_tokens", "contexts_per_prompt"):
        value = settings.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"bias.{key} must be an integer, got {value!r}")
    if settings.samples < 1:
        raise UsageError(f"bias.samples must be >= 1 (draft sets per context), got {settings.samples}")
    for key in ("batch", "rule_calls", "contexts_per_prompt"):
        if settings[key] < 1:
            raise UsageError(f"bias.{key} must be >= 1, got {settings[key]}")
    if settings.continuation_tokens < 0:
        raise UsageError(f"bias.continuation_tokens must be >= 0, got {settings.continuation_tokens}")
    draft_temperature = settings.get("draft_temperature")
    if draft_temperature is not None and (isinstance(draft_temperature, bool)
                                          or not isinstance(draft_temperature, int | float) or draft_temperature <= 0):
        raise UsageError(f"bias.draft_temperature must be null or a number > 0, got {draft_temperature!r}")
    if float(cfg.temperature) <= 0:
        raise UsageError("bias needs temperature > 0 (at 0 every rule emits the target's argmax)")
    caps = settings.get("sample_cap") or {}
    for method, cap in caps.items():
        if method not in VERIFIERS or not isinstance(cap, int) or cap < 1:
            raise UsageError(f"bias.sample_cap maps known methods to integers >= 1, got {method}: {cap!r}")
    method = cfg.method.name
    if method == "ar":
        raise UsageError("method ar has no verification rule to measure; name rules (method=spectr_gbv,sbv,...)")
    if VERIFIERS[method].single_draft and cfg.K != 1:
        raise UsageError(single_draft_message(cfg))


def setting_of(cfg: DictConfig) -> dict:
    """What the draft sets depend on (every cell with the same setting shares them)."""
    return {
        "model_pair": cfg.choices.model_pair, "dataset": cfg.choices.dataset, "K": int(cfg.K), "L": int(cfg.L),
        "temperature": float(cfg.temperature), "draft_temperature": _draft_temperature(cfg),
        "seed": int(cfg.seed), "num_prompts": int(cfg.num_prompts),
        "samples": int(cfg.bias.samples), "batch": int(cfg.bias.batch), "rule_calls": int(cfg.bias.rule_calls),
        "continuation_tokens": int(cfg.bias.continuation_tokens),
        "contexts_per_prompt": int(cfg.bias.contexts_per_prompt),
        "sample_cap": {str(k): int(v) for k, v in (cfg.bias.get("sample_cap") or {}).items()},
        "contexts": "cuts where max p is nearest 1/2",  # the rule of contexts_of (a change of it is a new setting)
        "hardware": OmegaConf.to_container(cfg.hardware, resolve=True),
        "model_pair_config": OmegaConf.to_container(cfg.model_pair, resolve=True),
    }


def _draft_temperature(cfg: DictConfig) -> float:
    value = cfg.bias.get("draft_temperature")
    return float(cfg.temperature) if value is None else float(value)


def setting_id(setting: dict) -> str:
    digest = hashlib.sha1(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:8]
    return (f"{setting['model_pair']}__{setting['dataset']}__K{setting['K']}_L{setting['L']}"
            f"_T{setting['temperature']:g}_Tq{setting['draft_temperature']:g}__{digest}")


def group_settings(cfgs: Sequence[DictConfig]) -> list[tuple[dict, DictConfig, list[str]]]:
    """(setting, one cfg of it, its methods in order), settings in grid order."""
    groups: dict[str, tuple[dict, DictConfig, list[str]]] = {}
    for cfg in cfgs:
        setting = setting_of(cfg)
        key = setting_id(setting)
        if key not in groups:
            groups[key] = (setting, cfg, [])
        if cfg.method.name not in groups[key][2]:
            groups[key][2].append(cfg.method.name)
    return list(groups.values())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        args = parse_arguments(argv)
        if args.launcher_overrides:
            raise UsageError("bias runs in one process (hydra/launcher overrides apply to `sweep` only)")
        with Composer() as composer:
            cfgs = expand(composer, args, use_grid=True)
        for cfg in cfgs:
            validate(cfg)
            check_bias_config(cfg)
        for cfg in cfgs:
            check_device(cfg.hardware.get("device"))
            check_writable(cfg.output_dir, [bias_folder(cfg)])
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt) if _main_thread() else None
    started = time.perf_counter()
    pairs = PairCache()  # settings of one pair share it: loaded once
    try:
        for setting, cfg, methods in group_settings(cfgs):
            run_setting(setting, cfg, methods, pairs)
    except KeyboardInterrupt:
        print(f"\nstopped: finished contexts are kept under {bias_folder(cfgs[0])}; the context being computed "
              "starts over. Rerun the same command to resume.", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    path = write_csv(bias_folder(cfgs[0]))
    print(f"bias: {path} (wall time {time.perf_counter() - started:.0f} s)")
    return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


# --------------------------------------------------------------------------------------------------
# One setting


def contexts_of(pair, cfg: DictConfig, examples) -> list[tuple[str, list[int]]]:
    """(name, token ids): per prompt, the ``bias.contexts_per_prompt`` cuts of an AR continuation from p
    (``bias.continuation_tokens`` long; cut 0 is the prompt itself) where the target's most likely next token
    has probability nearest 1/2. Why: where p is (nearly) a point mass every rule emits that token and no bias
    can show (code at T=0.4 is like that at most positions); where p is flat the stated alternatives (mass
    moved off the top token, at most p_top) cannot reach a detectable TV."""
    from transformers import DynamicCache

    from spectr_repro.data import encode_prompt
    from spectr_repro.engine.forward import forward_chunked
    from spectr_repro.engine.loop import generate
    from spectr_repro.sampling import probs_from_logits

    temperature, chunk = float(cfg.temperature), cfg.hardware.get("prefill_chunk")
    contexts = []
    for index, example in enumerate(examples):
        prompt = encode_prompt(pair.tokenizer, example)[0].tolist()
        continuation: list[int] = []
        if cfg.bias.continuation_tokens > 0:
            continuation = generate(pair.target, None, prompt, method="ar", temperature=temperature,
                                    max_new_tokens=cfg.bias.continuation_tokens, seed=int(cfg.seed) * 100_003 + index,
                                    eos_token_ids=pair.eos_token_ids, vocab_size=pair.vocab_size,
                                    prefill_chunk=chunk).new_tokens
        eos = set(pair.eos_token_ids)
        usable = next((i for i, token in enumerate(continuation) if token in eos), len(continuation))
        ids = torch.tensor([prompt + continuation[:usable]], device=pair.device)
        with torch.inference_mode():  # p at every cut 0..usable: one target forward
            logits = forward_chunked(pair.target, ids, DynamicCache(), pair.vocab_size, usable + 1, chunk)[0]
            top = probs_from_logits(logits, temperature).amax(-1).float().cpu()
        cuts = sorted(torch.argsort((top - 0.5).abs(), stable=True)[: cfg.bias.contexts_per_prompt].tolist())
        for cut in cuts:
            contexts.append((f"{example.id}+{cut}", prompt + continuation[:cut]))
    return contexts


_CONTEXTS: dict[tuple, list[tuple[str, list[int]]]] = {}  # this process's contexts, by what fixes them


def run_setting(setting: dict, cfg: DictConfig, methods: list[str], pairs: PairCache) -> None:
    folder = bias_folder(cfg) / "contexts" / setting_id(setting)
    pair = pairs.pair(cfg)
    examples = pairs.examples(cfg, pair.tokenizer)
    key = (setting["model_pair"], setting["dataset"], setting["temperature"], setting["seed"],
           setting["num_prompts"], setting["continuation_tokens"], setting["contexts_per_prompt"])
    if key not in _CONTEXTS:  # settings that differ only by method, K or L share their contexts
        _CONTEXTS[key] = contexts_of(pair, cfg, examples)
    contexts = _CONTEXTS[key]
    all_methods = [*methods, *estimators.CONTROLS]
    bar = tqdm(total=len(contexts) * setting["samples"], desc=f"bias K={setting['K']} T={setting['temperature']:g}",
               unit="draft set", file=sys.stderr)
    for number, (name, ids) in enumerate(contexts):
        directory = folder / _safe(name)
        missing = [m for m in all_methods if not (directory / f"{m}.json").exists()]
        if not missing:
            bar.update(setting["samples"])
            continue
        results = measure_context(pair, cfg, setting, ids, missing, number, bar)
        directory.mkdir(parents=True, exist_ok=True)
        for method, record in results.items():
            record.update(context=name, context_tokens=len(ids),
                          top_strings=[pair.tokenizer.decode([token]) for token in record["top_tokens"]])
            _write_json(directory / f"{method}.json", record)
        _write_json(folder / "setting.json", setting)
        write_csv(bias_folder(cfg))
    bar.close()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "+-_." else "_" for c in name)


def _write_json(path: Path, payload: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload))
    os.replace(temporary, path)  # atomic: a killed run never leaves half a record


@torch.inference_mode()
def measure_context(pair, cfg: DictConfig, setting: dict, ids: list[int], methods: list[str], number: int,
                    bar) -> dict[str, dict]:
    """Draw the setting's draft sets at one context, apply every method to them, analyse each."""
    from transformers import DynamicCache

    from spectr_repro.engine.cache import repeat_rows
    from spectr_repro.engine.drafting import draft_block
    from spectr_repro.engine.forward import forward_chunked
    from spectr_repro.engine.rows import DynamicRows
    from spectr_repro.sampling import probs_from_logits

    K, L, S, B = setting["K"], setting["L"], setting["samples"], setting["batch"]
    temperature, draft_temperature = setting["temperature"], setting["draft_temperature"]
    V, chunk = pair.vocab_size, cfg.hardware.get("prefill_chunk")
    context = torch.tensor([ids], device=pair.device)
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    p0 = probs_from_logits(forward_chunked(pair.target, context, target_cache, V, 1, chunk)[0, -1], temperature)
    q0 = probs_from_logits(forward_chunked(pair.draft, context, draft_cache, V, 1, chunk)[0, -1], draft_temperature)
    seed = setting["seed"] * 1_000_003 + number
    draw_generator = torch.Generator(device=pair.device).manual_seed(seed)
    caps = {m: min(S, int((cfg.bias.get("sample_cap") or {}).get(m, S))) for m in methods}
    verifiers = {m: get_verifier(m, check_inputs=False) for m in methods if m in VERIFIERS}
    parts: dict[str, list] = {m: [] for m in methods}
    seconds = dict.fromkeys(["models", *methods], 0.0)  # indicative: where the time goes (host clock)
    done = 0
    while done < S:
        n = min(B, S - done)
        started = time.perf_counter()
        rows = DynamicRows(pair.draft, V, chunk)
        rows.cache = copy.deepcopy(draft_cache)
        draft_tokens, draft_probs = draft_block(rows, q0, n * K, L, draft_temperature, draw_generator)
        cache = copy.deepcopy(target_cache)
        repeat_rows(cache, n * K)
        logits = forward_chunked(pair.target, draft_tokens, cache, V, L, None)  # [nK, L, V]: rows 1..L
        target_probs = torch.cat([p0.expand(n * K, 1, V), probs_from_logits(logits, temperature)], dim=1)
        draft_tokens = draft_tokens.view(n, K, L)
        draft_probs = draft_probs.view(n, K, L, V)
        target_probs = target_probs.view(n, K, L + 1, V)
        seconds["models"] += time.perf_counter() - started
        for method in methods:
            take = min(n, caps[method] - done)
            if take <= 0:
                continue
            started = time.perf_counter()
            width = 1 if method in estimators.CONTROLS else K  # the controls verify draft 0 of each set
            draws = estimators.rule_draws(method, draft_tokens[:take, :width], draft_probs[:take, :width],
                                          target_probs[:take, :width], setting["rule_calls"], draw_generator,
                                          verifier=verifiers.get(method))
            parts[method].append(draws)
            seconds[method] += time.perf_counter() - started
        done += n
        bar.update(n)
        del cache, logits, target_probs, draft_probs
    generator = torch.Generator().manual_seed(seed)
    records = {}
    for method in methods:
        draws = estimators.concat_draws(parts[method])
        records[method] = _record(method, draws, p0, q0, setting, generator)
        records[method]["seconds"] = {"draft_and_target_forwards": seconds["models"], "rule": seconds[method]}
    return records


def _record(method: str, draws, p0, q0, setting: dict, generator) -> dict:
    result = estimators.analyse(draws, p0, generator)
    exact_tv = math.nan
    if method in estimators.CONTROLS:
        exact_tv = float(estimators.total_variation(estimators.control_exact_law(method, p0, q0), p0))
    elif method in VERIFIERS and VERIFIERS[method].lossless:
        exact_tv = 0.0  # proven lossless (exact tests on toys): the target's law, exactly
    p64 = p0.double().cpu()
    top = torch.topk(torch.maximum(p64, result.law), min(TOP_TOKENS, p64.numel())).indices
    acceptance = float(torch.minimum(p0, q0).double().sum())  # SD's acceptance at the context: 1 - TV(p, q)
    return {
        "method": method, "K": setting["K"], "L": setting["L"], "temperature": setting["temperature"],
        "draft_temperature": setting["draft_temperature"], "model_pair": setting["model_pair"],
        "dataset": setting["dataset"], "samples": result.samples, "tv_estimate": result.tv_estimate,
        "interval": list(result.interval), "p_value": result.p_value, "detectable_tv": result.detectable_tv,
        "estimator": estimators.estimator_name(method, setting["rule_calls"]), "acceptance": acceptance,
        "exact_tv": exact_tv, "power_model": result.power_model.as_dict(), "test": result.test,
        "bins": result.bins, "target_bins": p64[result.bins].tolist(),
        "binned_laws": [[round(v, 8) for v in row] for row in result.binned.tolist()],  # the test's data, kept
        "top_tokens": top.tolist(), "top_target": p64[top].tolist(), "top_rule": result.law[top].tolist(),
    }


# --------------------------------------------------------------------------------------------------
# The table


def read_records(folder: Path) -> list[dict]:
    records = []
    for path in sorted(Path(folder).glob("contexts/*/*/*.json")):
        records.append(json.loads(path.read_text()))
    return records


def bias_table(folder: Path) -> pd.DataFrame:
    """One row per (setting, method, context) and a pooled row per (setting, method) (Fisher over contexts)."""
    records = read_records(folder)
    rows = []
    keys = ("model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature")
    by_cell: dict[tuple, list[dict]] = {}
    for record in records:
        by_cell.setdefault(tuple(record[k] for k in keys), []).append(record)
        rows.append(_row(record, record["context"], record["p_value"], record["detectable_tv"],
                         record["tv_estimate"], record["interval"], record["samples"]))
    for group in by_cell.values():
        p_value, detectable = estimators.pooled([r["p_value"] for r in group], [r["power_model"] for r in group])
        estimate = sum(r["tv_estimate"] for r in group) / len(group)
        low = sum(r["interval"][0] for r in group) / len(group)
        high = sum(r["interval"][1] for r in group) / len(group)
        rows.append(_row(group[0], f"pooled ({len(group)} contexts)", p_value, detectable, estimate, [low, high],
                         sum(r["samples"] for r in group), exact=_mean([r["exact_tv"] for r in group]),
                         acceptance=_mean([r["acceptance"] for r in group])))
    frame = pd.DataFrame(rows, columns=CSV_COLUMNS)
    return frame


def _mean(values) -> float:
    return sum(values) / len(values) if values else math.nan


def _row(record: dict, context: str, p_value: float, detectable: float, estimate: float, interval, samples: int,
         exact: float | None = None, acceptance: float | None = None) -> dict:
    return {
        **{k: record[k] for k in ("model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature")},
        "context": context, "samples": samples, "tv_estimate": round(estimate, 5),
        "interval": f"[{interval[0]:.4f}, {interval[1]:.4f}]", "p_value": p_value,
        "detectable_tv": detectable, "verdict": estimators.verdict(p_value, detectable),
        "estimator": record["estimator"], "acceptance": round(record["acceptance"] if acceptance is None
                                                               else acceptance, 4),
        "exact_tv": record["exact_tv"] if exact is None else exact,
    }


def write_csv(folder: Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bias.csv"
    temporary = path.with_suffix(".tmp")
    bias_table(folder).to_csv(temporary, index=False)
    os.replace(temporary, path)
    return path


__all__ = ["CSV_COLUMNS", "bias_folder", "bias_table", "check_bias_config", "contexts_of", "group_settings",
           "main", "measure_context", "read_records", "run_setting", "setting_id", "setting_of", "write_csv"]
