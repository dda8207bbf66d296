"""``python -m spectr_repro quality RESULTS``: score the folder's quality cells, write the CSVs, print what it wrote.

The report (``python -m spectr_repro report``) renders the CSVs; this command prints them as a plain table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from spectr_repro import tracking
from spectr_repro.data import QUALITY_DATASETS
from spectr_repro.quality.sandbox import SANDBOX_MODES, SandboxUnavailable
from spectr_repro.quality.score import DEFAULT_TIMEOUT_S
from spectr_repro.quality.tables import PROMPTS_FILE, QUALITY_FILE, write_quality

# quality.csv's columns shown on the terminal (the file holds them all)
SHOWN_COLUMNS = ["dataset", "model_pair", "temperature", "method", "K", "L", "n", "accuracy", "ci_low", "ci_high",
                 "ar_accuracy", "diff_low", "diff_high", "agrees_with_ar", "sandbox"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro.quality",
        description="quality parity with AR (EXECUTES model-written HumanEval code)",
    )
    parser.add_argument("results", help="a results folder (searched for cells/*/records.jsonl)")
    parser.add_argument("--out", default=None, help=f"where {QUALITY_FILE} and {PROMPTS_FILE} go (default: results)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per HumanEval program"
    )
    parser.add_argument("--workers", type=int, default=2)
    tracking.add_logger_option(parser)
    parser.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default="auto",
        help="how HumanEval programs are isolated: auto (bwrap, else unshare; refuses when neither works), "
        "bwrap, unshare, or none (NO isolation: an explicit opt-in, for disposable machines only)",
    )
    return parser


def summary_text(df: pd.DataFrame, out: Path) -> str:
    """What the command wrote: quality.csv as a plain table (or why it is empty), then the two files' paths."""
    if df.empty:
        table = f"no cells of {', '.join(QUALITY_DATASETS)} with records found"
    else:
        table = df[SHOWN_COLUMNS].to_markdown(index=False, floatfmt=".3f")
    return "\n".join([f"quality: {len(df)} cells scored", table, f"wrote {out / QUALITY_FILE}",
                      f"wrote {out / PROMPTS_FILE}"])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if not Path(args.results).is_dir():
        print(f"error: no results folder {args.results}", file=sys.stderr)
        return 2
    try:
        df = write_quality(args.results, args.out, args.timeout, args.workers, args.sandbox)
    except (SandboxUnavailable, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out or args.results)
    print(summary_text(df, out))
    tracking.log_command("quality", tracking.logger_config(args.logger), out,
                         tables={"quality": out / QUALITY_FILE}, config=vars(args))
    return 0
