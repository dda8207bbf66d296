"""Scoring one cell's records: HumanEval pass@1 (runs model-written code in the sandbox), GSM8K/MGSM exact match.

Which scorer a dataset gets comes from its spec's ``quality_metric`` (the data registry, ``spectr_repro.data``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spectr_repro.data import DATASETS, QUALITY_DATASETS, get_dataset
from spectr_repro.data.answers import answers_match
from spectr_repro.quality.sandbox import OUTPUT_LIMIT_BYTES, Sandbox, find_sandbox, run_python

DEFAULT_TIMEOUT_S = 10.0
# The metrics of the data registry's specs (DatasetSpec.quality_metric) that this module knows how to score.
EXECUTED_METRIC = "pass@1"  # the completion runs against the dataset's tests (HumanEval)
EXACT_MATCH_METRIC = "exact match"  # the extracted final answer against the reference (GSM8K, MGSM)


@dataclass(frozen=True)
class ExecutionResult:
    passed: bool
    status: str  # "passed" | "failed" | "timeout"
    detail: str  # the last lines of the program's output (stdout and stderr), or why it was stopped


def quality_metric(dataset: str) -> str | None:
    """The dataset's quality metric from the data registry (None: not scored, or not a known dataset)."""
    spec = DATASETS.get(dataset)
    return spec.quality_metric if spec is not None else None


def executes_code(dataset: str) -> bool:
    """Scoring ``dataset`` runs model-written programs (it needs a sandbox)."""
    return quality_metric(dataset) == EXECUTED_METRIC


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
    metric = quality_metric(dataset)
    if metric == EXECUTED_METRIC:
        problems = problems if problems is not None else humaneval_problems()
        return [result.passed for result in humaneval_pass(records, problems, timeout, workers, sandbox)]
    if metric == EXACT_MATCH_METRIC:
        return math_correct(dataset, records)
    raise ValueError(f"no quality metric for dataset {dataset!r} (have: {', '.join(QUALITY_DATASETS)})")
