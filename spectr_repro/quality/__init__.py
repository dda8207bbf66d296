"""Quality parity on real text: does each method's output score like plain autoregressive (AR) decoding?

A lossless rule samples exactly the target's distribution, so its task accuracy must agree with AR's
within sampling error; a lossy rule (the released SpecTr-GBV) may drift. Read from the runner's records
(``<results>/**/cells/<cell>/records.jsonl`` + ``summary.json``):

- HumanEval pass@1: the completion is appended to the problem's prompt and run against the dataset's
  tests. **THIS EXECUTES MODEL-WRITTEN CODE**, in the sandbox of ``spectr_repro.quality.sandbox``: bubblewrap
  where it works (new namespaces, no network, read-only root, private /tmp), else ``unshare`` (the same
  namespaces, every mount read-only), always with its own process group killed at exit or timeout,
  limits on processes, file size, open files, memory, CPU and output bytes, in a temporary folder, as
  ``nobody`` when the harness is root. Where neither tool works it refuses to run unless asked to with
  ``--sandbox none`` (limits only, no isolation). The mode used is recorded in QUALITY.md.
- GSM8K and MGSM exact match: ``get_dataset(name).extract_answer(completion)`` against the record's
  reference answer (numbers normalised, ``spectr_repro.data.answers.answers_match``).

Each method's accuracy is reported with a Wilson 95 % interval, next to AR's on the same dataset, pair and
temperature, with a Newcombe (hybrid Wilson) 95 % interval for the difference method − AR. The difference
interval treats the two cells as independent samples; outputs on the same prompts are positively correlated
through prompt difficulty, which makes that interval conservative (wider than a paired one).

    python -m spectr_repro.quality results/cpu_quick      # writes QUALITY.md, quality.csv, quality_prompts.csv
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectr_repro.data import DATASETS, QUALITY_DATASETS
from spectr_repro.quality.sandbox import (
    MODE_DESCRIPTIONS,
    OUTPUT_LIMIT_BYTES,
    SANDBOX_MODES,
    Sandbox,
    SandboxUnavailable,
    find_sandbox,
    run_python,
)


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (scipy); NaN bounds when n = 0. Quality owns it (its accuracy
    intervals are part of quality.csv); the analysis re-uses it for the report's paired tables."""
    from scipy.stats import binomtest

    if n == 0:
        return (math.nan, math.nan)
    interval = binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return (float(interval.low), float(interval.high))


# Per-prompt outcomes (analysis.report pairs each method with AR on the same prompts: McNemar).
PROMPTS_FILE = "quality_prompts.csv"
PROMPT_SETTING = ("experiment", "model_pair", "dataset", "temperature", "method", "K", "L", "seed", "max_new_tokens")
PROMPT_COLUMNS = [*PROMPT_SETTING, "prompt_id", "correct"]
DEFAULT_TIMEOUT_S = 10.0

@dataclass(frozen=True)
class ExecutionResult:
    passed: bool
    status: str  # "passed" | "failed" | "timeout"
    detail: str  # the last lines of the program's output (stdout and stderr), or why it was stopped


def humaneval_program(problem: Mapping, completion: str) -> str:
    """The program that decides pass@1: prompt + completion, then the tests, then check(entry_point)."""
    return (
        problem["prompt"]
        + completion
        + "\n\n"
        + problem["test"]
        + "\n\n"
        + f"check({problem['entry_point']})\n"
    )


def run_program(
    source: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    sandbox: str | Sandbox = "auto",
) -> ExecutionResult:
    """Run ``source`` (model-written code!) in the sandbox; passed iff it exits with status 0 in time.

    ``sandbox``: a mode of ``spectr_repro.quality.sandbox`` (``auto`` refuses with SandboxUnavailable where no
    isolation tool works; ``none`` opts in to running without one) or a ready ``Sandbox``."""
    box = sandbox if isinstance(sandbox, Sandbox) else find_sandbox(sandbox)
    run = run_python(source, timeout, box)
    tail = "\n".join(run.output.decode("utf-8", "replace").strip().splitlines()[-3:])
    if run.timed_out:
        return ExecutionResult(False, "timeout", f"no exit within {timeout:g} s")
    if run.output_limited:
        return ExecutionResult(False, "failed", f"killed: wrote more than {OUTPUT_LIMIT_BYTES} bytes of output")
    return ExecutionResult(run.returncode == 0, "passed" if run.returncode == 0 else "failed", tail)


def humaneval_problems(data_dir: str | Path | None = None) -> dict[str, dict]:
    """task_id -> record (prompt, test, entry_point, canonical_solution) from the dataset spec's source."""
    from spectr_repro.data import get_dataset

    return {record["task_id"]: record for record in get_dataset("humaneval").load_records(data_dir)}


def humaneval_pass(
    records: Sequence[Mapping],
    problems: Mapping[str, Mapping],
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = 2,
    sandbox: str | Sandbox = "auto",
) -> list[ExecutionResult]:
    """pass@1 outcome of each record (``prompt_id`` = task id, ``completion`` = the generated body)."""
    missing = [r["prompt_id"] for r in records if r["prompt_id"] not in problems]
    if missing:
        raise ValueError(f"HumanEval records with unknown task ids: {missing[:5]}")
    box = sandbox if isinstance(sandbox, Sandbox) else find_sandbox(sandbox)  # refuses before running any
    programs = [humaneval_program(problems[r["prompt_id"]], r.get("completion") or "") for r in records]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda source: run_program(source, timeout, box), programs))


def math_correct(dataset: str, records: Sequence[Mapping]) -> list[bool]:
    """Exact match of the extracted final answer with the record's reference (GSM8K, MGSM)."""
    from spectr_repro.data import get_dataset
    from spectr_repro.data.answers import answers_match

    spec = get_dataset(dataset)
    return [
        answers_match(spec.extract_answer(r.get("completion") or ""), r.get("reference")) for r in records
    ]


def score_records(
    dataset: str,
    records: Sequence[Mapping],
    problems: Mapping | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = 2,
    sandbox: str | Sandbox = "auto",
) -> list[bool]:
    """Per-record correctness for a quality dataset (ValueError for datasets without a metric)."""
    if dataset == "humaneval":
        problems = problems if problems is not None else humaneval_problems()
        return [result.passed for result in humaneval_pass(records, problems, timeout, workers, sandbox)]
    if dataset in ("gsm8k", "mgsm"):
        return math_correct(dataset, records)
    raise ValueError(f"no quality metric for dataset {dataset!r} (have: {', '.join(QUALITY_DATASETS)})")


def difference_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 - p2 (independent samples), from the two 95 % Wilson intervals."""
    if n1 == 0 or n2 == 0:
        return (math.nan, math.nan)
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1)
    l2, u2 = wilson_interval(k2, n2)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def read_cells(results_dir: str | Path) -> list[tuple[dict, list[dict]]]:
    """(summary, records) of every finished cell under ``results_dir`` (any depth)."""
    out = []
    for summary_path in sorted(Path(results_dir).glob("**/cells/*/summary.json")):
        records_path = summary_path.with_name("records.jsonl")
        records = (
            [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
            if records_path.is_file()
            else []
        )
        out.append((json.loads(summary_path.read_text()), records))
    return out


def quality_table(results_dir: str | Path, *args, **kwargs) -> pd.DataFrame:
    """The first table of ``quality_tables`` (same arguments): one row per quality cell."""
    return quality_tables(results_dir, *args, **kwargs)[0]


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
    from spectr_repro.verify import VERIFIERS

    cells = [(s, r) for s, r in read_cells(results_dir) if s.get("dataset") in QUALITY_DATASETS and r]
    executes = any(s["dataset"] == "humaneval" for s, _ in cells)
    problems = humaneval_problems(data_dir) if executes else None
    box = (sandbox if isinstance(sandbox, Sandbox) else find_sandbox(sandbox)) if executes else None
    rows, outcomes = [], []
    for summary, records in cells:
        correct = score_records(summary["dataset"], records, problems, timeout, workers, box)
        outcomes += [{**{key: summary.get(key) for key in PROMPT_SETTING}, "prompt_id": str(record["prompt_id"]),
                      "correct": bool(ok)} for record, ok in zip(records, correct)]
        k, n = sum(correct), len(correct)
        method = summary["method"]
        rows.append(
            {
                "experiment": summary.get("experiment"),
                "dataset": summary["dataset"],
                "model_pair": summary.get("model_pair"),
                "temperature": summary.get("temperature"),
                "max_new_tokens": summary.get("max_new_tokens"),
                "method": method,
                "K": summary.get("K"),
                "L": summary.get("L"),
                "lossless": True
                if method == "ar"
                else (VERIFIERS[method].lossless if method in VERIFIERS else None),
                "metric": DATASETS[summary["dataset"]].quality_metric,
                "n": n,
                "correct": k,
                "accuracy": k / n if n else math.nan,
                "ci_low": wilson_interval(k, n)[0],
                "ci_high": wilson_interval(k, n)[1],
                "sandbox": box.mode if summary["dataset"] == "humaneval" else None,
            }
        )
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


def sandbox_sentence(df: pd.DataFrame) -> str:
    """Which sandbox the HumanEval programs of ``df`` ran in (from its ``sandbox`` column)."""
    if df.empty or "humaneval" not in set(df.get("dataset", ())):
        return "No HumanEval programs were run."
    modes = sorted({str(m) for m in df.loc[df.dataset == "humaneval"].get("sandbox", pd.Series(dtype=object))
                    if isinstance(m, str)})
    if not modes:
        return "HumanEval programs ran in a sandbox this file does not record (scored by an older harness)."
    return "HumanEval programs ran in the sandbox " + "; ".join(
        f"**{m}** ({MODE_DESCRIPTIONS.get(m, 'unknown mode')})" for m in modes
    ) + "."


def quality_markdown(df: pd.DataFrame) -> str:
    lines = [
        "# Quality parity with autoregressive decoding",
        "",
        "HumanEval pass@1 **executes model-written code** (`spectr_repro.quality.sandbox`). "
        + sandbox_sentence(df) + " "
        "GSM8K/MGSM: exact match of the extracted final answer. Intervals: Wilson 95 % for accuracy, "
        "Newcombe 95 % for the difference with AR (independent-sample, conservative). A lossless rule "
        "should agree with AR (0 inside the difference interval) in about 95 % of settings.",
        "",
    ]
    if df.empty:
        return "\n".join(lines + ["No HumanEval, GSM8K or MGSM cells with records found.", ""])
    shown = df.assign(
        accuracy=[f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip(df.accuracy, df.ci_low, df.ci_high)],
        vs_ar=[
            "" if math.isnan(d) else f"{d0:+.3f} [{d:+.3f}, {u:+.3f}]"
            for d0, d, u in zip(df.accuracy - df.ar_accuracy, df.diff_low, df.diff_high)
        ],
    )[
        [
            "dataset",
            "model_pair",
            "temperature",
            "method",
            "K",
            "L",
            "lossless",
            "metric",
            "n",
            "accuracy",
            "vs_ar",
            "agrees_with_ar",
        ]
    ]
    lines += [shown.to_markdown(index=False), ""]
    return "\n".join(lines)


def write_quality(
    results_dir: str | Path,
    out: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = 2,
    sandbox: str | Sandbox = "auto",
) -> pd.DataFrame:
    df, prompts = quality_tables(results_dir, timeout, workers, sandbox=sandbox)
    out = Path(out or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "quality.csv", index=False)
    prompts.to_csv(out / PROMPTS_FILE, index=False)  # the report's paired test against AR reads this
    (out / "QUALITY.md").write_text(quality_markdown(df))
    return df


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro.quality",
        description="quality parity with AR (EXECUTES model-written HumanEval code)",
    )
    parser.add_argument("results", help="a results folder (searched for cells/*/records.jsonl)")
    parser.add_argument("--out", default=None, help="where QUALITY.md and quality.csv go (default: results)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per HumanEval program"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default="auto",
        help="how HumanEval programs are isolated: auto (bwrap, else unshare; refuses when neither works), "
        "bwrap, unshare, or none (NO isolation: an explicit opt-in, for disposable machines only)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not Path(args.results).is_dir():
        print(f"error: no results folder {args.results}", file=sys.stderr)
        return 2
    try:
        df = write_quality(args.results, args.out, args.timeout, args.workers, args.sandbox)
    except (SandboxUnavailable, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"quality: {len(df)} cells scored -> {Path(args.out or args.results) / 'QUALITY.md'}")
    return 0

