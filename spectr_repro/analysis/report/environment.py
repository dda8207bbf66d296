"""Where and how the cells were measured: the Environment, Results integrity and Settings sections."""

from __future__ import annotations

import sys

import pandas as pd

from spectr_repro.analysis.format import markdown, unique_text
from spectr_repro.analysis.load import DATASET_ORDER, integrity_markdown, order_methods, ordered
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.environment import git_commit

ENVIRONMENT_KEYS = ["device", "device_name", "torch", "transformers", "python", "git_commit", "num_threads"]


def _repository_commit() -> str | None:
    """The commit of the checkout this report is generated from (None outside a git checkout)."""
    commit = git_commit(short=True)
    return None if commit == "unknown" else commit


def environment_section(context: ReportContext) -> str | None:
    if context.results is None:
        return None
    rows = [{key: str((env if isinstance(env, dict) else {}).get(key, "")) for key in ENVIRONMENT_KEYS}
            for env in context.results.cells["environment"]]
    table = pd.DataFrame(rows, columns=ENVIRONMENT_KEYS)
    table = table.groupby(ENVIRONMENT_KEYS, dropna=False).size().rename("cells").reset_index()
    lines = ["## Environment", "", "Where the cells were measured (from each summary's `environment`):", "",
             markdown(table), ""]
    commit = _repository_commit()
    if commit:
        lines += [f"Report generated from commit `{commit}` with pandas {pd.__version__}, Python "
                  f"{sys.version.split()[0]}.", ""]
    return "\n".join(lines)


def integrity_section(context: ReportContext) -> str | None:
    """Cells left out and speed-ups not comparable (``load.integrity_markdown``); None when neither."""
    return None if context.results is None else integrity_markdown(context.folders, context.results.cells)


def settings_section(context: ReportContext) -> str | None:
    if context.results is None:
        return None
    cells, records = context.results.cells, context.results.records
    wall = pd.to_numeric(cells["wall_time_s"], errors="coerce").sum()
    lines = [
        "## Settings",
        "",
        f"- Experiments: {unique_text(cells['experiment'])}; model pairs: {unique_text(cells['model_pair'])}.",
        f"- Cells: {len(cells)} ({(cells['method'] != 'ar').sum()} speculative, "
        f"{(cells['method'] == 'ar').sum()} AR baselines); prompts recorded: {len(records)}.",
        f"- max_new_tokens: {unique_text(cells['max_new_tokens'])}; seeds: {unique_text(cells['seed'])}.",
        f"- Measured generation time summed over cells (speculative and AR cells, timed prompts only): "
        f"{wall / 60:.1f} min.",
        "- Block efficiency = tokens per target call, bonus token included (AR = 1.00). "
        "Speed-up = AR wall time / method wall time on the same prompts in the same process.",
        "",
    ]
    prompts = cells.groupby(["model_pair", "dataset"])["num_prompts"].agg(unique_text).unstack("dataset")
    prompts = prompts.reindex(columns=ordered(prompts.columns, DATASET_ORDER)).fillna("")
    lines += ["Prompts per cell (by model pair and dataset):", "", markdown(prompts, index=True), ""]
    grid = (
        cells.groupby(["model_pair", "method"])
        .agg(
            K=("K", unique_text),
            L=("L", unique_text),
            T=("temperature", unique_text),
            datasets=("dataset", lambda d: ", ".join(ordered(d, DATASET_ORDER))),
            cells=("cell_id", "size"),
        )
        .reset_index()
    )
    rank = {m: i for i, m in enumerate(order_methods(grid["method"]))}
    grid = grid.sort_values(["model_pair", "method"], key=lambda c: c.map(rank) if c.name == "method" else c)
    lines += ["Grid (values present in the results):", "", markdown(grid), ""]
    return "\n".join(lines)
