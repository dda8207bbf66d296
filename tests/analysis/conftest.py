"""A small synthetic results folder, generated from code (never committed data).

Shapes follow the runner's record schema and the cpu_quick grid: a main table (every method, two
datasets) plus K, L and T ablations on HumanEval for the Qwen pair, and a main table only for the
DeepSeek 33B pair (so paper numbers line up). Values are chosen so that expected table entries are
computable independently: per-prompt target_calls = 10 and new_tokens = 10·BE ± d with the ±d summing
to zero, so Σ new_tokens / Σ target_calls = BE exactly; AR wall time / method wall time likewise. Each
method takes the ±d in its own rotation, so two methods' per-prompt differences vary (paired intervals
have width) while every cell total stays exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

QWEN = "qwen25coder_1.5b_0.5b"
DEEPSEEK = "deepseek_33b_1.3b"
MULTI = ["spectr", "spectr_gbv", "rbv", "sbv"]
SINGLE = ["sd", "bv", "gbv"]
DATASETS = ["humaneval", "gsm8k"]
MAIN = {"K": 3, "L": 6, "temperature": 0.4}
PROMPT_OFFSETS = [-2, 0, 2]  # new_tokens deviations per prompt; they sum to zero
BASE_BE = {"sd": 3.0, "bv": 3.1, "gbv": 3.2, "spectr": 3.5, "rbv": 3.6, "sbv": 3.7, "spectr_gbv": 3.8}


def expected_block_efficiency(method: str, dataset: str, K: int, L: int, temperature: float) -> float:
    if method == "ar":
        return 1.0
    value = BASE_BE[method] + 0.2 * (K - 1) + 0.1 * (L - 6) - 1.0 * (temperature - 0.4)
    value += 0.5 if dataset == "humaneval" else 0.0
    return round(value * 10) / 10  # new_tokens = 10·BE must be an integer


def expected_speedup(method: str, dataset: str, K: int, L: int, temperature: float) -> float:
    if method == "ar":
        return 1.0
    return expected_block_efficiency(method, dataset, K, L, temperature) / (1.0 + 0.25 * K + 0.05 * L)


def _cells():
    """(model_pair, method, dataset, K, L, T) for every cell, AR included once per (pair, dataset, T)."""
    cells = set()
    for dataset in DATASETS:
        for method in MULTI:
            cells.add((QWEN, method, dataset, 3, 6, 0.4))
        for method in SINGLE:
            cells.add((QWEN, method, dataset, 1, 6, 0.4))
    for K in (1, 5):
        for method in ("spectr", "spectr_gbv"):
            cells.add((QWEN, method, "humaneval", K, 6, 0.4))
    for L in (4, 8):
        cells.add((QWEN, "spectr_gbv", "humaneval", 3, L, 0.4))
        cells.add((QWEN, "bv", "humaneval", 1, L, 0.4))
    for temperature in (0.1, 0.7):
        cells.add((QWEN, "spectr_gbv", "humaneval", 3, 6, temperature))
    for dataset in DATASETS:
        for method in ("sd", "gbv"):
            cells.add((DEEPSEEK, method, dataset, 1, 12, 0.4))
        for method in ("spectr", "spectr_gbv"):
            cells.add((DEEPSEEK, method, dataset, 3, 12, 0.4))
    for pair, _, dataset, _, _, temperature in list(cells):
        cells.add((pair, "ar", dataset, 1, 1, temperature))
    return sorted(cells)


def write_synthetic_results(root: Path, experiment: str = "synthetic") -> Path:
    """Write the folder ``root/experiment`` and return it."""
    out = root / experiment
    environment = {
        "device": "cpu",
        "device_name": "synthetic CPU",
        "torch": "2.13.0+cpu",
        "transformers": "5.24.0",
        "python": "3.11.7",
        "git_commit": "abc1234",
        "num_threads": 2,
    }
    for pair, method, dataset, K, L, temperature in _cells():
        be = expected_block_efficiency(method, dataset, K, L, temperature)
        speedup = expected_speedup(method, dataset, K, L, temperature)
        cell_id = f"{pair}__{dataset}__{method}__K{K}_L{L}_T{temperature}"
        cell_dir = out / "cells" / cell_id
        cell_dir.mkdir(parents=True)
        records = []
        shift = list(BASE_BE).index(method) % len(PROMPT_OFFSETS) if method in BASE_BE else 0
        offsets = PROMPT_OFFSETS[shift:] + PROMPT_OFFSETS[:shift]
        for index, offset in enumerate(offsets):
            new_tokens = round(10 * be) + (offset if method != "ar" else 0)
            ar_wall = 2.0 + 0.5 * index
            records.append(
                {
                    "prompt_id": f"{dataset}/{index}",
                    "method": method,
                    "K": K,
                    "L": L,
                    "temperature": temperature,
                    "seed": 0,
                    "prompt_tokens": 20 + index,
                    "new_tokens": new_tokens,
                    "target_calls": 10,
                    "block_efficiency": new_tokens / 10,
                    "wall_time_s": ar_wall / speedup,
                    "ar_wall_time_s": ar_wall,
                    "completion": f"completion {index}",
                    "reference": None,
                    "accepted_lengths": [max(round(be) - 1, 0)] * 10,
                }
            )
        with open(cell_dir / "records.jsonl", "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
        tokens = sum(r["new_tokens"] for r in records)
        wall = sum(r["wall_time_s"] for r in records)
        ar_wall = sum(r["ar_wall_time_s"] for r in records)
        acceptance = [] if method == "ar" else [round(0.95 - 0.02 * i - 0.01 * K, 4) for i in range(L)]
        summary = {
            "experiment": experiment,
            "cell_id": cell_id,
            "method": method,
            "dataset": dataset,
            "model_pair": pair,
            "K": K,
            "L": L,
            "temperature": temperature,
            "seed": 0,
            "num_prompts": len(records),
            "max_new_tokens": 64,
            "tokens": tokens,
            "target_calls": 30,
            "block_efficiency": tokens / 30,
            "block_efficiency_std": 0.1,
            "wall_time_s": wall,
            "ar_wall_time_s": ar_wall,
            "speedup": ar_wall / wall,
            "tokens_per_s": tokens / wall,
            "acceptance_by_position": acceptance,
            "time_split": {
                "prefill": 0.1,
                "draft": 0.3 * wall,
                "target": 0.5 * wall,
                "verify": 0.1 * wall,
                "total": wall,
            },
            "environment": environment,
            "created_at": "2026-01-01T00:00:00",
        }
        (cell_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return out


@dataclass
class Synthetic:
    root: Path
    main: dict

    expected_block_efficiency = staticmethod(expected_block_efficiency)
    expected_speedup = staticmethod(expected_speedup)


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> Synthetic:
    root = write_synthetic_results(tmp_path_factory.mktemp("results"))
    return Synthetic(root=root, main=dict(MAIN))
