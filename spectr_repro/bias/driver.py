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
under ``bias/contexts/``, written as each context finishes, then the context's ``done.json`` with each file's
sha256 and line count: a rerun skips finished contexts, so an interrupted run resumes; a damaged or partial
context is named, its files set aside under ``bias/set_aside/`` (never deleted) and measured again; a file the
table cannot read is named and left out). Bad input: one message, exit 2, before any model loads, nothing
written (:func:`spectr_repro.runner.config.check_before_loading`, the checks every command shares). SIGTERM and
SIGINT say what is kept and how to resume.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm
from transformers import DynamicCache

from spectr_repro import tracking
from spectr_repro.bias import estimators
from spectr_repro.bias.settings import BiasSetting, bias_folder, bias_setting_groups, bias_settings
from spectr_repro.data import encode_prompt
from spectr_repro.engine.cache import repeat_rows
from spectr_repro.engine.drafting import draft_block
from spectr_repro.engine.forward import forward_chunked
from spectr_repro.engine.loop import generate
from spectr_repro.engine.rows import DynamicRows
from spectr_repro.errors import ResourceError, exit_at_the_door
from spectr_repro.files import atomic_write_text
from spectr_repro.runner.config import (
    Composer,
    UsageError,
    check_before_loading,
    check_writable,
    expand,
    needs_single_draft,
    parse_arguments,
    print_help_if_asked,
    single_draft_message,
)
from spectr_repro.runner.pairs import PairCache
from spectr_repro.runner.signals import Budget, RunProgress, Terminated, stop_on_signals, stop_status
from spectr_repro.sampling import probs_from_logits
from spectr_repro.settings import RunConfig, run_config
from spectr_repro.units import DONE_FILE, SET_ASIDE, set_aside, unit_state, write_unit
from spectr_repro.verify import VERIFIERS, get_verifier

CSV_COLUMNS = ["model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature", "context",
               "samples", "tv_estimate", "interval", "p_value", "p_value_holm", "detectable_tv", "verdict",
               "estimator", "acceptance", "exact_tv"]  # p_value_holm: per context, Holm-adjusted in its family
TOP_TOKENS = 12  # tokens kept per (method, context) for the report's figure
INTEGRITY = 1  # setting.json's ``records_integrity``: its contexts have a done.json (absent: written before 2026-12-03)
log = logging.getLogger(__name__)


def check_bias_config(run: RunConfig) -> None:
    """The bias-specific keys and the single-draft rule (UsageError, before any model loads)."""
    bias_settings(run)
    if run.temperature <= 0:
        raise UsageError("bias needs temperature > 0 (at 0 every rule emits the target's argmax)")
    if run.method == "ar":
        raise UsageError("method ar has no verification rule to measure; name rules (method=spectr_gbv,sbv,...)")
    if needs_single_draft(run):
        raise UsageError(single_draft_message(run))


@dataclass
class Progress(RunProgress):
    """What this run has done so far (contexts): what a stop by signal reports."""

    current: str | None = None  # the context being measured
    budget: Budget = field(default_factory=Budget)  # bias.budget_minutes
    planned: dict[str, int] = field(default_factory=dict)  # setting id -> its contexts (settings reached)

    def stopped_message(self, stop: BaseException, folder: Path) -> str:
        return self.stop_report(stop, [folder], "context", "measured", "rerun the same command to resume.")

    def budget_message(self, settings: Sequence[BiasSetting], argv: Sequence[str]) -> str:
        """What a run stopped by its budget kept, counted on disk; a setting not reached yet counts its
        num_prompts x contexts_per_prompt contexts (at most that many)."""
        finished = left = 0
        for setting in settings:
            folder = setting.contexts_folder
            done = sum(context_problem(d) is None for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else 0
            planned = self.planned.get(setting.id, setting.num_prompts * setting.bias.contexts_per_prompt)
            finished, left = finished + done, left + max(planned - done, 0)
        return self.budget.message(self.computed, max(finished - self.computed, 0), left, "context", "bias", argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        settings = parse(argv)
    except (UsageError, ResourceError) as error:  # bad input, or a dataset that cannot be read: before any model loads
        return exit_at_the_door(error)
    started = time.perf_counter()
    pairs = PairCache()  # settings of one pair share it: loaded once
    folder = settings[0].folder
    progress = Progress(budget=Budget(settings[0].bias.budget_minutes))
    try:
        with stop_on_signals():
            for setting in settings:
                run_setting(setting, pairs, progress)
                if progress.budget.stopped:
                    break
            try:
                path = write_csv(folder)
            except OSError as error:
                raise ResourceError(f"cannot write {folder / 'bias.csv'}: {error}") from error
    except ResourceError as error:
        print(f"error: {error}\n(finished contexts are kept; fix the above and rerun the same command)",
              file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        print("\n" + progress.stopped_message(stop, folder), file=sys.stderr)
        return stop_status(stop)
    print(f"bias: {path} (wall time {time.perf_counter() - started:.0f} s)")
    tracking.log_command("bias", settings[0].logger, path.parent.parent, tables={"rows": path},
                         config=tracking.top_level_config(setting.values() for setting in settings))
    if progress.budget.stopped:
        print(progress.budget_message(settings, argv))
    return 0


def parse(argv: Sequence[str]) -> list[BiasSetting]:
    """The command's settings (cells sharing all but the rule), checked like every command that loads models
    (UsageError, nothing loaded)."""
    args = parse_arguments(argv)
    if args.launcher_overrides:
        raise UsageError("bias runs in one process (hydra/launcher overrides apply to `sweep` only)")
    with Composer() as composer:
        runs = [run_config(cfg) for cfg in expand(composer, args, use_grid=True)]
    for run in runs:
        check_bias_config(run)
    # every draft set is a whole block of L tokens (never cut by max_new_tokens)
    check_before_loading(runs, block_L=[run.L for run in runs])
    for run in runs:
        check_writable(run.output_dir, [bias_folder(run)])
    return bias_setting_groups(runs)


# --------------------------------------------------------------------------------------------------
# One setting


def contexts_of(pair, setting: BiasSetting, examples) -> list[tuple[str, list[int]]]:
    """(name, token ids): per prompt, the ``bias.contexts_per_prompt`` cuts of an AR continuation from p
    (``bias.continuation_tokens`` long; cut 0 is the prompt itself) where the target's most likely next token
    has probability nearest 1/2. Why: where p is (nearly) a point mass every rule emits that token and no bias
    can show (code at T=0.4 is like that at most positions); where p is flat the stated alternatives (mass
    moved off the top token, at most p_top) cannot reach a detectable TV."""
    temperature, chunk, bias = setting.temperature, setting.prefill_chunk, setting.bias
    contexts = []
    for index, example in enumerate(examples):
        prompt = encode_prompt(pair.tokenizer, example)[0].tolist()
        continuation: list[int] = []
        if bias.continuation_tokens > 0:
            continuation = generate(pair.target, None, prompt, method="ar", temperature=temperature,
                                    max_new_tokens=bias.continuation_tokens, seed=setting.seed * 100_003 + index,
                                    eos_token_ids=pair.eos_token_ids, vocab_size=pair.vocab_size,
                                    prefill_chunk=chunk).new_tokens
        eos = set(pair.eos_token_ids)
        usable = next((i for i, token in enumerate(continuation) if token in eos), len(continuation))
        ids = torch.tensor([prompt + continuation[:usable]], device=pair.device)
        with torch.inference_mode():  # p at every cut 0..usable: one target forward
            logits = forward_chunked(pair.target, ids, DynamicCache(), pair.vocab_size, usable + 1, chunk)[0]
            top = probs_from_logits(logits, temperature).amax(-1).float().cpu()
        cuts = sorted(torch.argsort((top - 0.5).abs(), stable=True)[: bias.contexts_per_prompt].tolist())
        for cut in cuts:
            contexts.append((f"{example.id}+{cut}", prompt + continuation[:cut]))
    return contexts


_CONTEXTS: dict[tuple, list[tuple[str, list[int]]]] = {}  # this process's contexts, by what fixes them


def run_setting(setting: BiasSetting, pairs: PairCache, progress: Progress | None = None) -> None:
    progress = progress or Progress()
    folder = setting.contexts_folder
    pair = pairs.pair(setting.run)
    examples = pairs.examples(setting.run, pair.tokenizer)
    if setting.contexts_key not in _CONTEXTS:  # settings that differ only by method, K or L share their contexts
        _CONTEXTS[setting.contexts_key] = contexts_of(pair, setting, examples)
    contexts = _CONTEXTS[setting.contexts_key]
    progress.planned[setting.id] = len(contexts)
    all_methods = [*setting.methods, *estimators.CONTROLS]
    verified = _start_setting(folder, setting.values())
    samples = setting.bias.samples
    with tqdm(total=len(contexts) * samples, desc=f"bias K={setting.K} T={setting.temperature:g}",
              unit="draft set", file=sys.stderr) as bar:
        for number, (name, ids) in enumerate(contexts):
            directory = folder / _safe(name)
            missing = _missing_methods(directory, all_methods, verified)
            if not missing:
                progress.earlier += 1
                bar.update(samples)
                continue
            if progress.budget.spent():
                return  # the next context would not fit in bias.budget_minutes
            progress.current = f"{setting.id}/{name}"
            with progress.budget.unit():
                results = measure_context(pair, setting, ids, missing, number, bar)
                try:
                    write_context(directory, {method: {**record, "context": name, "context_tokens": len(ids),
                                                       "top_strings": [pair.tokenizer.decode([token])
                                                                       for token in record["top_tokens"]]}
                                              for method, record in results.items()})
                except OSError as error:
                    raise ResourceError(f"cannot write context {name} into {directory}: {error}") from error
            progress.computed += 1  # kept from here on: a stop while the table is rebuilt below loses nothing
            progress.current = None
            try:
                write_csv(setting.folder)
            except OSError as error:
                raise ResourceError(f"cannot write {setting.folder / 'bias.csv'}: {error}") from error


def _start_setting(folder: Path, setting: dict) -> bool:
    """Write setting.json (marking that its contexts get a done.json) unless the folder holds contexts written before
    that; True when the setting's contexts are verified by their done.json."""
    path = folder / "setting.json"
    old = _json_or_none(path) if path.exists() else None
    legacy = path.exists() and not (isinstance(old, dict) and old.get("records_integrity") == INTEGRITY)
    if legacy and any(folder.glob("*/*.json")):
        log.warning(f"{folder} holds contexts measured before done.json recorded their sha256: kept as finished, "
                    f"unverified")
        return False
    try:
        atomic_write_text(path, json.dumps({**setting, "records_integrity": INTEGRITY}))
    except OSError as error:
        raise ResourceError(f"cannot write into {folder}: {error}") from error
    return True


def _missing_methods(directory: Path, methods: list[str], verified: bool) -> list[str]:
    """The methods still to measure at a context. Verified settings: all of them unless its done.json vouches for
    its files; a damaged or partial context is named and its files set aside first (never deleted)."""
    if not verified:  # written before done.json: what is there counts
        return [m for m in methods if not (directory / f"{m}.json").exists()]
    state = unit_state(directory)
    if state.status == "finished":
        return [m for m in methods if not (directory / f"{m}.json").exists()]
    if state.status != "absent":
        moved = set_aside(directory, directory.parents[2] / SET_ASIDE / directory.parent.name)
        tqdm.write(f"warning: {state.problem}; its files are set aside in {moved} and the context is measured again",
                   file=sys.stderr)
    return list(methods)


def context_problem(directory: Path) -> str | None:
    """None when the context's done.json vouches for its files, else what is wrong (naming the file)."""
    state = unit_state(directory)
    if state.status == "finished":
        return None
    return state.problem or f"{directory}: no {DONE_FILE} (nothing written yet)"


def write_context(directory: Path, records: dict[str, dict]) -> None:
    """One JSON per method, then done.json with each file's sha256 and line count (last: the context is finished);
    methods added to a finished context join the files its done.json lists."""
    write_unit(directory, {f"{method}.json": json.dumps(record) for method, record in records.items()}, extend=True)


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "+-_." else "_" for c in name)


@torch.inference_mode()
def measure_context(pair, setting: BiasSetting, ids: list[int], methods: list[str], number: int,
                    bar) -> dict[str, dict]:
    """Draw the setting's draft sets at one context, apply every method to them, analyse each."""
    K, L, S, B = setting.K, setting.L, setting.bias.samples, setting.bias.batch
    temperature, draft_temperature = setting.temperature, setting.draft_temperature
    V, chunk = pair.vocab_size, setting.prefill_chunk
    context = torch.tensor([ids], device=pair.device)
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    p0 = probs_from_logits(forward_chunked(pair.target, context, target_cache, V, 1, chunk)[0, -1], temperature)
    q0 = probs_from_logits(forward_chunked(pair.draft, context, draft_cache, V, 1, chunk)[0, -1], draft_temperature)
    seed = setting.seed * 1_000_003 + number
    draw_generator = torch.Generator(device=pair.device).manual_seed(seed)
    caps = {m: min(S, setting.bias.sample_cap.get(m, S)) for m in methods}
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
                                          target_probs[:take, :width], setting.bias.rule_calls, draw_generator,
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


def _record(method: str, draws, p0, q0, setting: BiasSetting, generator) -> dict:
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
        "method": method, "K": setting.K, "L": setting.L, "temperature": setting.temperature,
        "draft_temperature": setting.draft_temperature, "model_pair": setting.model_pair,
        "dataset": setting.dataset, "samples": result.samples, "tv_estimate": result.tv_estimate,
        "interval": list(result.interval), "p_value": result.p_value, "detectable_tv": result.detectable_tv,
        "estimator": estimators.estimator_name(method, setting.bias.rule_calls), "acceptance": acceptance,
        "exact_tv": exact_tv, "power_model": result.power_model.as_dict(), "test": result.test,
        "bins": result.bins, "target_bins": p64[result.bins].tolist(),
        "binned_laws": [[round(v, 8) for v in row] for row in result.binned.tolist()],  # the test's data, kept
        "top_tokens": top.tolist(), "top_target": p64[top].tolist(), "top_rule": result.law[top].tolist(),
    }


# --------------------------------------------------------------------------------------------------
# The table


def read_records(folder: Path) -> list[dict]:
    """Every readable (setting, context, method) record under ``folder``; what cannot be read is logged, naming
    the file (:func:`read_records_checked`)."""
    records, left_out = read_records_checked(folder)
    for problem in left_out:
        log.warning(problem)
    return records


def read_records_checked(folder: Path) -> tuple[list[dict], list[str]]:
    """(records, what was left out): a context whose done.json does not vouch for its files (damaged, or stopped
    before it finished) is left out whole; in settings written before done.json, each unreadable file."""
    records, left_out = [], []
    for setting_folder in sorted(p for p in Path(folder).glob("contexts/*") if p.is_dir()):
        setting = _json_or_none(setting_folder / "setting.json")  # absent or without the marker: written before
        verified = isinstance(setting, dict) and setting.get("records_integrity") == INTEGRITY
        for directory in sorted(p for p in setting_folder.iterdir() if p.is_dir()):
            problem = context_problem(directory) if verified else None
            if problem is not None:
                left_out.append(f"left out context {directory.name}: {problem}")
                continue
            for path in sorted(directory.glob("*.json")):
                if path.name == DONE_FILE:
                    continue
                record = _json_or_none(path)
                if isinstance(record, dict):
                    records.append(record)
                else:
                    left_out.append(f"left out {path}: not valid JSON")
    return records, left_out


def bias_table(folder: Path) -> pd.DataFrame:
    """One row per (setting, method, context) and a pooled row per (setting, method) (Fisher over contexts)."""
    records = read_records(folder)
    rows = []
    keys = ("model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature")
    by_cell: dict[tuple, list[dict]] = {}
    for record in records:
        by_cell.setdefault(tuple(record[k] for k in keys), []).append(record)
    for group in by_cell.values():
        # Per-context verdicts of one family with Holm's correction (16 contexts at a nominal 5 % each would read
        # "bias detected" somewhere for a lossless rule about half the time); the pooled row is the rule's verdict.
        verdicts = estimators.context_verdicts([r["p_value"] for r in group], [r["power_model"] for r in group])
        for record, (holm_p, detectable, text) in zip(group, verdicts, strict=True):
            row = _row(record, record["context"], record["p_value"], detectable, record["tv_estimate"],
                       record["interval"], record["samples"])
            rows.append({**row, "verdict": text, "p_value_holm": holm_p})
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


__all__ = ["CSV_COLUMNS", "Progress", "bias_table", "check_bias_config", "context_problem", "contexts_of", "main",
           "measure_context", "parse", "read_records", "read_records_checked", "run_setting", "write_context",
           "write_csv"]
