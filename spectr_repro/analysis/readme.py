"""README.md's results table, from a replay's summary: ``python -m spectr_repro.analysis.readme REPLAY_DIR``.

    python -m spectr_repro.analysis.readme results/cpu_quick/replay            # rewrite README.md's block
    python -m spectr_repro.analysis.readme results/cpu_quick/replay --check    # exit 1 if README.md differs

REPLAY_DIR is the ``replay/`` folder ``python -m spectr_repro replay`` writes (``replay_summary.csv``, and a
``replay.json`` per group with the settings). The table is REPORT.md's replayed Table 1 (tokens per target call
of every rule on the same draft blocks, 95 % intervals over prompts, ``replay_report.table1_markdown``) at the
replay's main K and L; beside it: the file it came from, the file's date and this command. Only the text
between ``<!-- results-table:begin -->`` and ``<!-- results-table:end -->`` is rewritten.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import pandas as pd

from spectr_repro.analysis.replay import SUMMARY_FILE, read_blocks, read_summaries, reference_setting, summary
from spectr_repro.analysis.replay_report import main_cells, table1_markdown
from spectr_repro.analysis.versions import MANIFEST_FILE
from spectr_repro.docblocks import BlockError, read_block, write_block
from spectr_repro.verify import VERIFIERS, method_labels

BLOCK = "results-table"
COMMAND = "python -m spectr_repro.analysis.readme"


class TableError(ValueError):
    """The replay folder cannot give the table (missing, empty or malformed summary, several groups)."""


def _shown(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` when it lies under it (so the README names a path a user can type)."""
    path, start = path.resolve(), start.resolve()
    return path.relative_to(start).as_posix() if path.is_relative_to(start) else str(path)


def _settings(replay_dir: Path) -> str:
    """New tokens, seed and reference trajectory of the replay's groups, when they agree (``replay.json``)."""
    metas = [json.loads(p.read_text()) for p in sorted(replay_dir.glob("*/replay.json"))]
    parts = []
    for key, text in (("max_new_tokens", "{} new tokens"), ("seed", "seed {}")):
        values = {meta.get(key) for meta in metas}
        if len(values) == 1 and None not in values:
            parts.append(text.format(values.pop()))
    reference = {(m.get("reference"), m.get("reference_K"), m.get("reference_L")) for m in metas}
    if len(reference) == 1 and None not in next(iter(reference)):
        method, K, L = reference.pop()
        parts.append(f"blocks of a lossless {method} K={K} L={L} trajectory")
    return ", ".join(parts)


def render(replay_dir: str | Path, root: str | Path = ".", model_pair: str | None = None,
           temperature: float | None = None) -> str:
    """The block's Markdown: one sentence of settings, the table, and its source, date and command."""
    replay_dir = Path(replay_dir)
    committed = _committed_summary(replay_dir)
    summary_path = replay_dir / SUMMARY_FILE
    try:
        tables = (committed[0], None) if committed else read_summaries(replay_dir)
    except (OSError, ValueError) as error:
        raise TableError(f"{summary_path}: {error}") from None
    if tables is None:
        raise TableError(f"{summary_path} does not exist: run `python -m spectr_repro replay ...` first")
    table = tables[0]
    needed = {"model_pair", "temperature", "dataset", "method", "K", "L", "prompts", "tokens_per_call", "ci_low",
              "ci_high"}
    if missing := sorted(needed - set(table.columns)):
        raise TableError(f"{summary_path} is not a replay summary (no column {', '.join(missing)})")
    if table.empty:
        raise TableError(f"{summary_path} has no rows (no finished replay prompt)")
    if model_pair is not None:
        table = table[table["model_pair"] == model_pair]
    if temperature is not None:
        table = table[table["temperature"] == temperature]
    groups = sorted({(str(p), float(t)) for p, t in zip(table["model_pair"], table["temperature"])})
    if len(groups) != 1:
        raise TableError(f"{summary_path}: {len(groups)} (model pair, temperature) groups "
                         f"{groups or ''}; choose one with --model-pair and --temperature")
    (pair, T), = groups
    K, L = main_cells(table, reference_setting(replay_dir))
    prompts = table.loc[table["dataset"] != "average", "prompts"]
    count = (f"{int(prompts.min())}" if prompts.min() == prompts.max()
             else f"{int(prompts.min())}–{int(prompts.max())}") if len(prompts) else "?"
    settings = _settings(replay_dir)
    labels = method_labels()
    lossy = [labels[m] for m in VERIFIERS if m in set(table["method"]) and not VERIFIERS[m].lossless]
    command = f"{COMMAND} {_shown(replay_dir, Path(root))}"
    command += f" --temperature {T:g}" if temperature is not None else ""
    if committed:  # the committed records themselves (results/README.md): the newest seal dates them
        origin = f"From the committed records in `{_shown(replay_dir, Path(root))}` (sealed {committed[1]})"
    else:
        date = dt.datetime.fromtimestamp(summary_path.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%d")
        origin = f"From `{_shown(summary_path, Path(root))}` (written {date})"
    return "\n".join([
        f"Tokens per target call of every rule on the same draft blocks (K={K}, L={L}; single-draft rules K=1), "
        f"{pair}, T={T:g}, {count} prompts per dataset{', ' + settings if settings else ''}; 95 % intervals "
        "resample prompts:",
        "",
        table1_markdown(table, K, L),
        "",
        *([f"Not lossless (its output does not have the target's law): {', '.join(lossy)}.", ""] if lossy else []),
        f"{origin}; regenerated by `{command}`.",
    ])


def _committed_summary(replay_dir: Path) -> tuple[pd.DataFrame, str] | None:
    """(the summary computed from the records, the newest seal's date) for committed results (groups with a
    manifest.json: their summary files are not in git, so the table comes from the blocks a clone holds); None for
    a scratch replay folder, whose summary file is read as written."""
    manifests = sorted(replay_dir.glob(f"*/{MANIFEST_FILE}"))
    if not manifests:
        return None
    sealed = max(str(json.loads(path.read_text(encoding="utf-8")).get("sealed_at", "")) for path in manifests)
    frame, _ = read_blocks(replay_dir)
    return summary(frame), sealed[:10]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replay_dir", help="a replay folder (results/<experiment>/replay)")
    parser.add_argument("--readme", default="README.md", help="the document whose block is rewritten")
    parser.add_argument("--model-pair", default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the block differs")
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    try:
        body = render(args.replay_dir, readme.parent, args.model_pair, args.temperature)
        if args.check:
            if read_block(readme.read_text(), BLOCK, str(readme)) != body:
                print(f"{readme}: the results table differs from `{COMMAND} {args.replay_dir}`", file=sys.stderr)
                return 1
            print(f"{readme}: the results table is up to date")
            return 0
        changed = write_block(readme, BLOCK, body)
    except (TableError, BlockError, OSError, pd.errors.ParserError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{'rewrote' if changed else 'unchanged:'} the results table in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
