"""The paper's reported numbers (arXiv 2604.25925), kept as package data in ``spectr_repro/paper_numbers.csv``.

Only numbers the project's docs/methods.md gives are in the file; missing cells stay missing (NaN in
tables, blank in reports). Rows without a ``model_pair`` were seen without setting labels and are
never placed in a pair's table (see ``docs/paper_numbers.md``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PAPER_COLUMNS = ["model_pair", "dataset", "method", "metric", "value", "note"]
PAPER_SOURCE = 'arXiv 2604.25925 (SpecTr-GBV), as summarised in docs/methods.md, "The paper\'s numbers"'
# The optional ``source`` column: blank = the paper (PAPER_SOURCE); rows from the authors' code release say so.
DEFAULT_ROW_SOURCE = "arXiv 2604.25925"
RELEASE_SOURCE_PREFIX = "github junemily/SpecTr-GBV"
DEFAULT_PAPER_CSV = Path(__file__).resolve().parent / "paper_numbers.csv"  # package data


def load_paper_numbers(path: str | Path | None = None) -> pd.DataFrame:
    """The paper's numbers as a long DataFrame with columns ``PAPER_COLUMNS``.

    Text columns use "" for blank (unknown pair, not dataset-specific); ``value`` is float.
    """
    path = Path(path) if path is not None else DEFAULT_PAPER_CSV
    if not path.is_file():
        raise ValueError(f"paper numbers file {str(path)!r} not found")
    table = pd.read_csv(
        path, dtype={"model_pair": str, "dataset": str, "method": str, "metric": str, "note": str, "source": str}
    )
    missing = [c for c in PAPER_COLUMNS if c not in table]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    for column in ("model_pair", "dataset", "method", "metric", "note"):
        table[column] = table[column].fillna("")
    table["value"] = pd.to_numeric(table["value"], errors="raise").astype(float)
    source = table["source"].fillna("") if "source" in table else pd.Series("", index=table.index)
    table["source"] = source.astype(str).where(source != "", DEFAULT_ROW_SOURCE)
    return table[[*PAPER_COLUMNS, "source"]]


def release_numbers(paper: pd.DataFrame) -> pd.DataFrame:
    """Rows reported by the authors' code release (its README), not by the paper: a different setting."""
    return paper[paper["source"].str.startswith(RELEASE_SOURCE_PREFIX)].reset_index(drop=True)


def paper_table(paper: pd.DataFrame, model_pair: str, metric: str) -> pd.DataFrame:
    """Paper values for one pair and metric: rows methods, columns datasets (incl. ``average``).

    Empty DataFrame when the paper reports nothing for that pair. Unlabelled rows are excluded.
    """
    rows = paper[(paper["model_pair"] == model_pair) & (paper["metric"] == metric) & (paper["dataset"] != "")]
    if rows.empty:
        return pd.DataFrame()
    duplicated = rows.duplicated(["method", "dataset"], keep=False)
    if duplicated.any():
        raise ValueError(
            f"paper numbers hold duplicate cells for {model_pair}/{metric}: "
            f"{rows[duplicated][['method', 'dataset']].values.tolist()}"
        )
    return rows.pivot(index="method", columns="dataset", values="value")


def unlabelled_numbers(paper: pd.DataFrame) -> pd.DataFrame:
    """Rows whose model pair is unknown (seen without setting labels)."""
    return paper[paper["model_pair"] == ""].reset_index(drop=True)
