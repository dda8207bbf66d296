"""docs/speed.md's tables, from the files the bench writes: ``python -m spectr_repro.bench.docs [FILE ...]``.

    python -m spectr_repro.bench.docs                        # every results/bench/*.json
    python -m spectr_repro.bench.docs results/bench/bench_qwen.json --check   # exit 1 if docs/speed.md differs
    python -m spectr_repro.bench.docs --block batch-tables results/speedup_batch/bench_batch.json   # the batch bench

One section per file (one measurement: one `python -m spectr_repro bench` run), headed by its date, its
machine and the command that wrote it, all read from the file; the tables are the bench's own Markdown
(``bench.tables.markdown``). Only the text between ``<!-- bench-tables:begin -->`` and ``<!-- bench-tables:end -->``
of docs/speed.md is rewritten (``--block batch-tables``: the batch bench's own block, from the committed file). A
file that is not a bench result stops the command with one message naming it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from spectr_repro.bench.tables import markdown
from spectr_repro.docblocks import BlockError, read_block, write_block

BLOCK = "bench-tables"
BLOCKS = (BLOCK, "batch-tables")  # the batch bench's block: results/speedup_batch/bench_batch.json (committed)
COMMAND = "python -m spectr_repro.bench.docs"
DEFAULT_GLOB = "results/bench/*.json"
BATCH_FILE = "results/speedup_batch/bench_batch.json"  # committed (results/README.md)
DOCS = "docs/speed.md"


class BenchFileError(ValueError):
    """A file that is not a result of ``python -m spectr_repro bench``."""


def load(path: str | Path) -> tuple[dict, str]:
    """(results, their tables) of one bench file; BenchFileError naming the file when it is not one."""
    path = Path(path)
    what = f"{path} is not a result of `python -m spectr_repro bench`"
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise BenchFileError(f"{what}: not JSON ({error})") from None
    if not isinstance(results, dict):
        raise BenchFileError(f"{what}: a JSON {type(results).__name__}, not an object")
    for key in ("settings", "environment"):
        if not isinstance(results.get(key), dict):
            raise BenchFileError(f"{what}: no {key!r} object")
    try:
        tables = markdown(results)
    except KeyError as error:
        raise BenchFileError(f"{what}: no key {error}") from None
    except (TypeError, ValueError, IndexError, AttributeError) as error:
        raise BenchFileError(f"{what}: {type(error).__name__}: {error}") from None
    return results, tables


def section(path: str | Path, results: dict, tables: str) -> str:
    """One file's heading, provenance line and tables."""
    path = Path(path)
    settings, env = results["settings"], results["environment"]
    if results.get("date"):
        date = str(results["date"])
    else:
        mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%d")
        date = f"not recorded (file time {mtime})"
    preset = settings.get("preset", "?")
    command = (f"`{results['command']}`" if results.get("command")
               else f"not recorded (preset {preset})")
    machine = (f"{env.get('device_name', '?')} ({env.get('device', '?')}; {env.get('num_threads', '?')} threads of "
               f"{env.get('cpu_count', '?')} CPUs; host {env.get('hostname', '?')}), torch {env.get('torch', '?')}, "
               f"transformers {env.get('transformers', '?')}, commit {env.get('git_commit', '?')}")
    batches = (results.get("batches") or {}).get("settings")
    if batches:  # the batch bench: a pool of prompts cut into groups, not the preset's rounds
        run = (f"{batches.get('prompts', '?')} prompts of {', '.join(batches.get('datasets') or ['?'])} in groups of "
               f"B = {', '.join(map(str, batches.get('batches') or ['?']))} × {batches.get('max_new_tokens', '?')} "
               f"new tokens, T={batches.get('temperature', '?')}")
    else:
        run = (f"{settings.get('num_prompts', '?')} {settings.get('dataset', '?')} prompts × "
               f"{settings.get('max_new_tokens', '?')} new tokens, T={settings.get('temperature', '?')}, "
               f"{settings.get('repeats', '?')} rounds")
    wall = results.get("wall_time_s")
    if isinstance(wall, (int, float)):
        run += f", {wall / 60:.1f} min"
    return "\n".join([f"### `{path.as_posix()}`: preset {preset}, {date[:10]}", "",
                      f"Date: {date}. Machine: {machine}. Run: {run}. Command: {command}.", "", tables])


def batch_files(root: str | Path = ".") -> list[Path]:
    """The committed batch benches under ``root`` (``bench_batch.json``, the one the report reads, first; then
    earlier presets kept beside it, e.g. ``bench_batch_short.json``); never a run's checkpoint or a set-aside file."""
    folder = Path(root) / Path(BATCH_FILE).parent
    found = [p for p in folder.glob("bench_batch*.json") if ".partial" not in p.name and ".set-aside" not in p.name]
    return sorted(found, key=lambda p: (p.name != Path(BATCH_FILE).name, p.name))


def render(paths: list[str | Path], block: str = BLOCK) -> str:
    """The block: every file's section, or how to produce one when there is none."""
    if not paths and block != BLOCK:
        return (f"No batch bench result ({BATCH_FILE}) when this section was generated. Measure on a quiet machine "
                f"with `python -m spectr_repro bench --preset batch_qwen --out {BATCH_FILE}`, then regenerate this "
                f"section with `{COMMAND} --block {block}`.")
    if not paths:
        return "\n".join([
            f"No bench result was found (`{DEFAULT_GLOB}`) when this section was generated. Measure on a quiet "
            "machine with `make bench` (or `python -m spectr_repro bench --preset qwen`, `--quick`), then "
            f"regenerate this section with `{COMMAND}`."])
    sections = [section(path, *load(path)) for path in paths]
    shown = " ".join(Path(p).as_posix() for p in paths)
    command = COMMAND if block == BLOCK else f"{COMMAND} --block {block}"
    return "\n\n".join([f"Generated by `{command} {shown}` from the files the bench wrote; do not edit by hand.",
                        *sections])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help=f"bench result files (default: {DEFAULT_GLOB})")
    parser.add_argument("--docs", default=DOCS, help="the document whose block is rewritten")
    parser.add_argument("--block", default=BLOCK, choices=BLOCKS, help=f"the block rewritten (default {BLOCK})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the block differs")
    args = parser.parse_args(argv)
    defaults = sorted(Path().glob(DEFAULT_GLOB)) if args.block == BLOCK else batch_files()
    paths = args.files or defaults
    docs = Path(args.docs)
    try:
        body = render(paths, args.block)
        if args.check:
            if read_block(docs.read_text(), args.block, str(docs)) != body:
                print(f"{docs}: the bench tables differ from `{COMMAND}`'s", file=sys.stderr)
                return 1
            print(f"{docs}: the bench tables are up to date")
            return 0
        changed = write_block(docs, args.block, body)
    except (BenchFileError, BlockError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{'rewrote' if changed else 'unchanged:'} the bench tables in {docs} ({len(paths)} file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
