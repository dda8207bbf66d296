"""Shared-block replay results: tokens per target call of every (method, K, L), intervals clustered by prompt.

Reads the replay's files only (``<experiment>/replay/<group>/prompts/<index>/blocks.jsonl``, written by
``python -m spectr_repro replay``). Blocks of one prompt are not independent (they share its text), so
every interval resamples prompts, never blocks: a method's value in a dataset is Σ_blocks value / blocks
(a ratio of per-prompt sums, :func:`spectr_repro.analysis.stats.mean_of_ratios`), the average over datasets
weighs each dataset alike (prompts resampled within each), and a difference between two methods is paired
on the same blocks (:func:`spectr_repro.analysis.stats.paired_comparison`).

Comparators: the release (spectr_gbv) at the same (K, L); SD at K = 1 and the same L (SD drafts one row).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from spectr_repro.analysis.format import AVERAGE, COMPARATORS, interval_text
from spectr_repro.analysis.stats import RESAMPLES, mean_of_ratios, paired_comparison
from spectr_repro.analysis.versions import (
    MANIFEST_FILE,
    VERSION_COLUMN,
    current_versions,
    keep_current,
    prompt_versions,
)
from spectr_repro.records import read_record_text, record_file_exists
from spectr_repro.units import unit_state
from spectr_repro.verify import VERIFIERS, method_labels

log = logging.getLogger(__name__)

GROUP_KEYS = ["model_pair", "temperature"]
CELL_KEYS = ["method", "K", "L"]
SUMMARY_FILE = "replay_summary.csv"
DIFFERENCES_FILE = "replay_differences.csv"
LABEL = "tokens per target call on shared blocks"


def load_blocks(root: str | Path) -> pd.DataFrame:
    """Long table, one row per (block, method, K, L), of every finished prompt under ``root`` that can be read
    (what could not is logged, each naming its file and line: :func:`read_blocks` returns it)."""
    frame, left_out = read_blocks(root)
    for problem in left_out:
        log.warning(problem)
    return frame


def read_blocks(root: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """(:func:`load_blocks`'s table, what was left out of it): a prompt whose blocks.jsonl is not the file its
    done.json vouches for (sha256, line count), or that cannot be parsed, is left out whole and named with the file
    and line; a group whose replay.json cannot be read is left out and named; prompts finished before done.json
    recorded the sha256 are read unverified (said once per group). Each rule's rows come from one version of it
    (``analysis.versions``): prompts judged by another are left out and named."""
    rows, left_out, manifests, finished = [], [], [], []
    for meta_path in sorted(Path(root).glob("*/replay.json")):
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            left_out.append(f"left out {meta_path.parent}: {meta_path} cannot be read ({error})")
            continue
        manifest = _json_or_none(meta_path.parent / MANIFEST_FILE)
        manifest = manifest if isinstance(manifest, dict) else None
        manifests += [manifest] if manifest else []
        unverified = 0
        for done_path in sorted(meta_path.parent.glob("prompts/*/done.json")):
            blocks_path = done_path.parent / "blocks.jsonl"
            if not record_file_exists(blocks_path):
                continue
            state = unit_state(done_path.parent, legacy=(blocks_path.name,))  # the one check of a done file
            prompt_rows, problem = ([], state.problem) if not state.finished else _prompt_rows(
                meta, state.done, blocks_path, manifest, finished)
            if problem is not None:
                left_out.append(f"left out prompt {done_path.parent.name} of {meta_path.parent.name}: {problem}")
                continue
            unverified += state.status == "unverified"
            rows += prompt_rows
        if unverified:
            left_out.append(f"note: {unverified} prompt(s) of {meta_path.parent} were written before done.json "
                            f"recorded their blocks' sha256: read unverified")
    columns = ["model_pair", "dataset", "temperature", "prompt_id", "iteration", "reference_tokens", *CELL_KEYS,
               "tokens", "estimator", "draws", "output_position", "prompt_tokens", VERSION_COLUMN]
    frame, other_versions = keep_current(pd.DataFrame(rows, columns=columns), current_versions(manifests, finished))
    return frame, left_out + other_versions


def _prompt_rows(meta: dict, prompt: dict, blocks_path: Path, manifest: dict | None = None,
                 finished: list | None = None) -> tuple[list[tuple], str | None]:
    """(rows, None) of one finished prompt (``prompt``: its done.json), or ([], the problem naming file and line);
    appends the prompt's (finished_at, rule versions) to ``finished``."""
    try:
        text = read_record_text(blocks_path)
    except (OSError, UnicodeDecodeError) as error:
        return [], f"cannot read {blocks_path} ({error})"
    versions = prompt_versions(prompt, manifest, blocks_path.parent.name) if isinstance(prompt, dict) else {}
    if finished is not None:
        finished.append((str(prompt.get("finished_at", "")), versions))
    rows = []
    emitted = 0  # records before 2026-12-03 have no output_position: the earlier blocks' reference tokens give it
    prompt_tokens = prompt.get("prompt_tokens") if isinstance(prompt, dict) else None
    for number, line in enumerate(text.splitlines(), 1):
        try:
            block = json.loads(line)
            position = int(block.get("output_position", emitted))
            emitted = position + int(block["reference_tokens"])
            for method, K, L, tokens, estimator, draws in block["values"]:
                rows.append((meta["model_pair"], meta["dataset"], float(meta["temperature"]), prompt["prompt_id"],
                             block["iteration"], block["reference_tokens"], method, int(K), int(L), float(tokens),
                             estimator, int(draws), position, prompt_tokens, versions.get(method, "")))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            return [], f"{blocks_path}:{number}: cannot be read ({type(error).__name__}: {error})"
    return rows, None


def _per_prompt(frame: pd.DataFrame) -> pd.DataFrame:
    """Σ tokens and blocks per (group, dataset, cell, prompt)."""
    keys = [*GROUP_KEYS, "dataset", *CELL_KEYS, "prompt_id"]
    return frame.groupby(keys, sort=False).agg(tokens=("tokens", "sum"), blocks=("tokens", "size")).reset_index()


def summary(frame: pd.DataFrame, resamples: int = RESAMPLES) -> pd.DataFrame:
    """Per group, dataset (and the average over datasets) and cell: value with its prompt-clustered interval."""
    if frame.empty:
        return pd.DataFrame(columns=[*GROUP_KEYS, "dataset", *CELL_KEYS, "blocks", "prompts", "tokens_per_call",
                                     "ci_low", "ci_high", "estimator", "first_iteration"])
    per_prompt = _per_prompt(frame)
    estimators = frame.groupby(CELL_KEYS)["estimator"].agg(lambda s: "+".join(sorted(set(s)))).to_dict()
    datasets = _datasets_of_groups(per_prompt)
    rows = []
    for keys, cell in per_prompt.groupby([*GROUP_KEYS, *CELL_KEYS], sort=False):
        group, (method, K, L) = dict(zip(GROUP_KEYS, keys[:2])), keys[2:]
        strata = {dataset: part for dataset, part in cell.groupby("dataset", sort=False)}
        entries = [(dataset, [part]) for dataset, part in strata.items()]
        if len(strata) > 1 and set(strata) == datasets[keys[:2]]:
            entries.append((AVERAGE, list(strata.values())))
        for dataset, parts in entries:
            interval = mean_of_ratios([(p["tokens"], p["blocks"]) for p in parts], resamples=resamples)
            rows.append({**group, "dataset": dataset, "method": method, "K": K, "L": L,
                         "blocks": int(sum(p["blocks"].sum() for p in parts)),
                         "prompts": int(sum(len(p) for p in parts)), "tokens_per_call": interval.estimate,
                         "ci_low": interval.low, "ci_high": interval.high,
                         "estimator": estimators[(method, K, L)],
                         "first_iteration": VERIFIERS[method].carries_state})
    return pd.DataFrame(rows)


def _datasets_of_groups(per_prompt: pd.DataFrame) -> dict[tuple, set[str]]:
    """Every dataset of each group (pair, temperature). A cell's average over datasets is given only where it
    covers all of them: a rule registered after a grid began (hsd) lacks the datasets replayed before it, and an
    average over fewer datasets would set it beside the others' averages as if it were the same mean."""
    return {keys: set(part["dataset"]) for keys, part in per_prompt.groupby(GROUP_KEYS, sort=False)}


def _comparator_cell(comparator: str, K: int, L: int) -> tuple[str, int, int]:
    return (comparator, 1 if VERIFIERS[comparator].single_draft else K, L)


def _comparator_cells(per_prompt: pd.DataFrame, comparators, method: str, K: int, L: int):
    """(comparator, its cell) pairs for one cell: the same (K, L) (a single-draft comparator at K=1); a
    single-draft method is also set against a multi-draft comparator at every K it was replayed at (SD at
    K=1 against the release at K=3 is the paper's comparison)."""
    present = per_prompt.groupby("method")["K"].unique().to_dict()
    for comparator in comparators:
        if comparator not in present:
            continue
        if VERIFIERS[method].single_draft and not VERIFIERS[comparator].single_draft:
            for other_K in sorted(int(k) for k in present[comparator]):
                yield comparator, (comparator, other_K, L)
        else:
            yield comparator, _comparator_cell(comparator, K, L)


def differences(frame: pd.DataFrame, comparators=COMPARATORS, resamples: int = RESAMPLES,
                methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Every method (or only ``methods``) against each comparator, paired on the same blocks: per dataset and on
    the average."""
    columns = [*GROUP_KEYS, "dataset", *CELL_KEYS, "comparator", "comparator_K", "difference", "ci_low",
               "ci_high", "prompts", "verdict"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    per_prompt = _per_prompt(frame)
    datasets = _datasets_of_groups(per_prompt)
    # (group, cell, dataset) -> {prompt: (tokens, blocks)}: the comparator's side of each pairing, looked up by prompt
    by_prompt = {keys: dict(zip(part["prompt_id"], zip(part["tokens"], part["blocks"])))
                 for keys, part in per_prompt.groupby([*GROUP_KEYS, *CELL_KEYS, "dataset"], sort=False)}
    rows = []
    for keys, cell in per_prompt.groupby([*GROUP_KEYS, *CELL_KEYS], sort=False):
        group, (method, K, L) = keys[:2], keys[2:]
        if methods is not None and method not in methods:
            continue
        for comparator, other in _comparator_cells(per_prompt, comparators, method, K, L):
            if other == (method, K, L):
                continue
            strata = {}
            for dataset, part in cell.groupby("dataset", sort=False):
                theirs = by_prompt.get((*group, *other, dataset), {})
                found = [theirs.get(prompt) for prompt in part["prompt_id"]]
                keep = np.array([pair is not None for pair in found])
                if keep.any():
                    mine = part[["tokens", "blocks"]].to_numpy(dtype=float)[keep]
                    other_side = np.array([pair for pair in found if pair is not None], dtype=float)
                    strata[dataset] = (mine[:, 0], mine[:, 1], other_side[:, 0], other_side[:, 1])
            entries = [(d, [s]) for d, s in strata.items()] + ([(AVERAGE, list(strata.values()))]
                                                                if len(strata) > 1 and set(strata) == datasets[group]
                                                                else [])
            for dataset, parts in entries:
                interval = paired_comparison(parts, "difference", resamples=resamples)
                rows.append({**dict(zip(GROUP_KEYS, group)), "dataset": dataset, "method": method, "K": K, "L": L,
                             "comparator": comparator, "comparator_K": other[1], "difference": interval.estimate,
                             "ci_low": interval.low, "ci_high": interval.high, "prompts": interval.n,
                             "verdict": _verdict(interval)})
    return pd.DataFrame(rows, columns=columns)


def _verdict(interval) -> str:
    if not interval.has_interval:
        return "undecided (< 2 prompts)"
    if interval.low > 0:
        return "higher"
    if interval.high < 0:
        return "lower"
    return "undecided"


def write_summaries(root: str | Path, resamples: int = RESAMPLES, out: str | Path | None = None) -> str:
    """Write replay_summary.csv and replay_differences.csv under ``out`` (default ``root``) from every prompt under
    ``root`` that can be read; return a markdown digest, followed by one line per prompt or group left out (naming
    its file and line)."""
    root = Path(root)
    out = root if out is None else Path(out)
    frame, left_out = read_blocks(root)
    table, diffs = summary(frame, resamples), differences(frame, resamples=resamples)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / SUMMARY_FILE, index=False)
    diffs.to_csv(out / DIFFERENCES_FILE, index=False)
    digest = summary_markdown(table)
    return digest + "".join(f"\n{problem}" for problem in left_out)


def reference_setting(roots: list[str | Path] | str | Path) -> tuple[int, int] | None:
    """The (K, L) the reference trajectories ran at (``replay.json``), when every group under ``roots`` agrees:
    the setting the experiment was built around (cpu_quick: sbv K=3 L=6 beside its L = 4, 6, 8 grid)."""
    roots = [roots] if isinstance(roots, (str, Path)) else roots
    metas = [_json_or_none(path) for root in roots for path in sorted(Path(root).glob("*/replay.json"))]
    settings = {(meta.get("reference_K"), meta.get("reference_L")) for meta in metas if isinstance(meta, dict)}
    if len(settings) != 1 or None in next(iter(settings)):
        return None
    K, L = settings.pop()
    return int(K), int(L)


def _json_or_none(path: Path):
    """A JSON file's value, None when it cannot be read (read_blocks names such a file)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def read_summaries(root: str | Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(summary, differences) written by :func:`write_summaries`, or None when there is no replay."""
    root = Path(root)
    if not (root / SUMMARY_FILE).exists():
        return None
    table = pd.read_csv(root / SUMMARY_FILE)
    path = root / DIFFERENCES_FILE
    diffs = pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()
    return table, diffs


def summary_markdown(table: pd.DataFrame, dataset: str | None = None) -> str:
    """Methods as rows, (K, L) as columns, at one dataset (default: the average, else the only one)."""
    if table.empty:
        return "(no finished replay prompts)"
    datasets = list(dict.fromkeys(table["dataset"]))
    dataset = dataset or (AVERAGE if AVERAGE in datasets else datasets[0])
    part = table[table["dataset"] == dataset].copy()
    labels = method_labels()
    part["cell"] = [interval_text(v, lo, hi)
                    for v, lo, hi in zip(part["tokens_per_call"], part["ci_low"], part["ci_high"])]
    part["method"] = [labels.get(m, m) + (" (1st iter.)" if flag else "") for m, flag in
                      zip(part["method"], part["first_iteration"])]
    part["setting"] = [f"K={K} L={L}" for K, L in zip(part["K"], part["L"])]
    blocks = {} if part.empty else part.groupby(GROUP_KEYS)[["blocks", "prompts"]].max().iloc[0].to_dict()
    wide = part.pivot_table(index="method", columns="setting", values="cell", aggfunc="first", sort=False)
    wide = wide[sorted(wide.columns, key=lambda c: tuple(int(x.split("=")[1]) for x in c.split()))]
    title = (f"{LABEL} ({dataset}; at most {blocks.get('prompts', 0)} prompts, {blocks.get('blocks', 0)} blocks "
             f"per cell; 95 % intervals over prompts)")
    return title + "\n\n" + wide.fillna("-").to_markdown()


__all__ = ["AVERAGE", "LABEL", "differences", "load_blocks", "read_blocks", "read_summaries", "reference_setting",
           "summary", "summary_markdown", "write_summaries"]
