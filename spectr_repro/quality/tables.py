"""quality.csv (one row per scored cell, beside AR) and quality_prompts.csv (one row per scored prompt).

The analysis reads both files (its report renders them); their columns are a contract with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from spectr_repro.data import QUALITY_DATASETS
from spectr_repro.quality.intervals import difference_interval, wilson_interval
from spectr_repro.quality.sandbox import MODE_DESCRIPTIONS, Sandbox, find_sandbox
from spectr_repro.quality.score import (
    DEFAULT_TIMEOUT_S,
    executes_code,
    humaneval_problems,
    quality_metric,
    score_records,
)
from spectr_repro.records import read_cells

QUALITY_FILE = "quality.csv"
# Per-prompt outcomes (the analysis pairs each method with AR on the same prompts: McNemar).
PROMPTS_FILE = "quality_prompts.csv"
PROMPT_SETTING = ("experiment", "model_pair", "dataset", "temperature", "method", "K", "L", "seed", "max_new_tokens")
PROMPT_COLUMNS = [*PROMPT_SETTING, "prompt_id", "correct"]


def _is_lossless(method: str) -> bool | None:
    from spectr_repro.verify import VERIFIERS  # verify pulls torch (~2 s): quality starts without

    return True if method == "ar" else (VERIFIERS[method].lossless if method in VERIFIERS else None)


def cell_row(summary: Mapping, correct: Sequence[bool], sandbox_mode: str | None) -> dict:
    """One quality.csv row (before AR's columns are added): the cell's setting, its accuracy and Wilson interval."""
    k, n = sum(correct), len(correct)
    low, high = wilson_interval(k, n)
    return {
        "experiment": summary.get("experiment"),
        "dataset": summary["dataset"],
        "model_pair": summary.get("model_pair"),
        "temperature": summary.get("temperature"),
        "max_new_tokens": summary.get("max_new_tokens"),
        "method": summary["method"],
        "K": summary.get("K"),
        "L": summary.get("L"),
        "lossless": _is_lossless(summary["method"]),
        "metric": quality_metric(summary["dataset"]),
        "n": n,
        "correct": k,
        "accuracy": k / n if n else math.nan,
        "ci_low": low,
        "ci_high": high,
        "sandbox": sandbox_mode if executes_code(summary["dataset"]) else None,
        # the report says what the mode isolates, in the quality command's words (the analysis imports no quality)
        "sandbox_description": MODE_DESCRIPTIONS.get(sandbox_mode) if executes_code(summary["dataset"]) else None,
    }


def prompt_rows(summary: Mapping, records: Sequence[Mapping], correct: Sequence[bool]) -> list[dict]:
    """quality_prompts.csv rows of one cell: its setting, each prompt's id and outcome."""
    setting = {key: summary.get(key) for key in PROMPT_SETTING}
    return [{**setting, "prompt_id": str(record["prompt_id"]), "correct": bool(ok)}
            for record, ok in zip(records, correct)]


def quality_tables(
    results_dir: str | Path,
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = 2,
    data_dir: str | Path | None = None,
    sandbox: str | Sandbox = "auto",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per quality cell: accuracy with its interval, AR's on the same setting, the difference --
    HumanEval rows record the sandbox mode their programs ran in, column ``sandbox``; one row per scored
    prompt, columns ``PROMPT_COLUMNS``: what the report pairs with AR, the same prompt under each method)."""
    cells = [(cell.summary, cell.records) for cell in read_cells(results_dir)
             if cell.summary.get("dataset") in QUALITY_DATASETS and cell.records]
    executes = any(executes_code(summary["dataset"]) for summary, _ in cells)
    problems = humaneval_problems(data_dir) if executes else None
    box = (sandbox if isinstance(sandbox, Sandbox) else find_sandbox(sandbox)) if executes else None
    rows, outcomes = [], []
    for summary, records in cells:
        correct = score_records(summary["dataset"], records, problems, timeout, workers, box)
        outcomes += prompt_rows(summary, records, correct)
        rows.append(cell_row(summary, correct, box.mode if box is not None else None))
    return _beside_ar(pd.DataFrame(rows)), pd.DataFrame(outcomes, columns=PROMPT_COLUMNS)


def _beside_ar(df: pd.DataFrame) -> pd.DataFrame:
    """Each method's row with AR's accuracy on the same setting and the difference's interval (in place)."""
    if df.empty:
        return df
    setting = ["experiment", "dataset", "model_pair", "temperature", "max_new_tokens", "n"]  # n: same prompts
    ar = df[df.method == "ar"].drop_duplicates(setting).set_index(setting, drop=False)
    for column in ("ar_accuracy", "diff_low", "diff_high"):
        df[column] = math.nan
    df["agrees_with_ar"] = None
    for index, row in df.iterrows():
        key = tuple(row[c] for c in setting)
        if row.method == "ar" or key not in ar.index:
            continue
        base = ar.loc[key]
        low, high = difference_interval(int(row.correct), int(row.n), int(base.correct), int(base.n))
        df.loc[index, ["ar_accuracy", "diff_low", "diff_high"]] = [base.accuracy, low, high]
        df.loc[index, "agrees_with_ar"] = bool(low <= 0 <= high)
    return df


def write_quality(
    results_dir: str | Path,
    out: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = 2,
    sandbox: str | Sandbox = "auto",
) -> pd.DataFrame:
    """Score ``results_dir``'s quality cells and write quality.csv and quality_prompts.csv into ``out`` (default:
    ``results_dir``); returns quality.csv's table."""
    df, prompts = quality_tables(results_dir, timeout, workers, sandbox=sandbox)
    out = Path(out or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / QUALITY_FILE, index=False)
    prompts.to_csv(out / PROMPTS_FILE, index=False)  # the report's paired test against AR reads this
    return df
