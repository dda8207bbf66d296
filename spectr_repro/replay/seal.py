"""`python -m spectr_repro seal FOLDER...`: seal a replay's finished prompts for git, or check sealed ones.

Sealing writes each finished prompt's gzip'd blocks and each group's manifest.json (the environment and rules'
fingerprint of every prompt: ``spectr_repro.committed``); ``--check`` reads files only (no model, no torch work) and
exits 1 naming every prompt that is not the file its manifest records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spectr_repro.committed import SETTINGS_FILE, SealReport, backfill_of, check_group, groups_under, seal_group
from spectr_repro.environment import environment
from spectr_repro.replay.fingerprint import rules_fingerprint


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spectr_repro seal", description=(__doc__ or '').splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="results folders (or replay groups) to seal or check")
    parser.add_argument("--check", action="store_true", help="check the sealed folders; write nothing")
    parser.add_argument("--backfill-commit", metavar="COMMIT",
                        help="prompts whose done.json names no environment were replayed on this machine at COMMIT "
                             "(recorded as backfilled)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    missing = [f for f in args.folders if not groups_under(Path(f))]
    if missing:
        print(f"seal: error: no replay group (a folder with {SETTINGS_FILE} and prompts/) under "
              f"{', '.join(missing)}", file=sys.stderr)
        return 2
    groups = [g for f in args.folders for g in groups_under(Path(f))]
    if args.check:
        return _check(groups)
    report = SealReport()
    for folder in groups:
        sampled = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8")).get("sampled", [])
        current = rules_fingerprint(sampled=sampled)
        backfill = backfill_of(args.backfill_commit, environment, current) if args.backfill_commit else None
        seal_group(folder, current, backfill, report)
    for problem in report.skipped:
        print(f"skipped: {problem}", file=sys.stderr)
    print(f"sealed {report.prompts} prompt(s) in {report.groups} group(s): {report.packed} gzip copies written, "
          f"{report.backfilled} backfilled, {len(report.skipped)} skipped")
    return 0


def _check(groups: list[Path]) -> int:
    total, problems = 0, []
    for folder in groups:
        checked, found = check_group(folder)
        total += checked
        problems += found
        print(f"{folder}: {checked} prompt(s), {'OK' if not found else f'{len(found)} problem(s)'}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"checked {total} prompt(s) in {len(groups)} group(s): {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
