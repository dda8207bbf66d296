"""Replay throughput of two commits, measured in alternation (issue 35): prompts per hour, before and after.

    python scripts/replay_throughput.py BEFORE AFTER [--rounds 2] [--prompts 4] [--dataset humaneval]
        [--model-pair qwen25coder_1.5b_0.5b] [--max-new-tokens 48] [--keep DIR] [-- extra replay arguments]

Each commit is checked out in its own ``git worktree`` (detached, under a temporary folder, removed at the end).
This one driver process then runs, ``--rounds`` times in alternation (before, after, before, after: ABAB, so a
drift of the machine's speed falls on both), ``python -m spectr_repro replay K=1,3,5,7 L=6,12 dataset=D
num_prompts=N model_pair=P max_new_tokens=M`` in that worktree (its own code: cwd and PYTHONPATH), each run into
a fresh output folder (nothing resumed). Every run replays the same prompts with the same seed.

Per run it reads the records the replay writes: each prompt's ``seconds`` (its trajectory: model forwards and
the rules; done.json) and each block's ``rule_seconds`` (the rules' evaluation on it; blocks.jsonl). It prints
prompts per hour = 3600 x prompts / their seconds (model loading and the summary excluded: the run's whole wall
time is printed beside it), the rules' share of the prompts' seconds, and, over the rounds, each commit's
median and the ratio after / before of the medians. A number is only a measurement on a quiet machine (nothing
else running): on a loaded one only the proportions mean anything.

Exit status 2 with one message for bad arguments (an unknown commit, rounds < 1), before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
GRID = ("K=1,3,5,7", "L=6,12")


@dataclass(frozen=True)
class RunResult:
    label: str
    prompts: int
    prompt_seconds: float  # sum of the prompts' trajectory seconds (forwards + rules)
    rule_seconds: float  # sum of the blocks' rule seconds
    blocks: int
    wall_seconds: float  # the whole command (model loading and the summary included)

    @property
    def prompts_per_hour(self) -> float:
        return 3600.0 * self.prompts / self.prompt_seconds if self.prompt_seconds > 0 else float("nan")

    @property
    def rule_share(self) -> float:
        return self.rule_seconds / self.prompt_seconds if self.prompt_seconds > 0 else float("nan")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="the commit measured first in each round (e.g. main)")
    parser.add_argument("after", help="the commit compared with it (e.g. s3-fast)")
    parser.add_argument("--rounds", type=int, default=2, help="ABAB rounds (default 2)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per run (default 4)")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--model-pair", default="qwen25coder_1.5b_0.5b")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the replays")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' records under this folder")
    parser.add_argument("extra", nargs="*", help="more replay arguments (after --), the same for both commits")
    return parser.parse_args(argv)


def resolve_commit(name: str) -> str:
    """The full hash of ``name``; SystemExit(2) with one message when git does not know it."""
    done = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"error: {name!r} is not a commit of {REPOSITORY}", file=sys.stderr)
        raise SystemExit(2)
    return done.stdout.strip()


def replay_command(args: argparse.Namespace, output_dir: Path) -> list[str]:
    return [args.python, "-m", "spectr_repro", "replay", *GRID, f"dataset={args.dataset}",
            f"num_prompts={args.prompts}", f"model_pair={args.model_pair}", f"max_new_tokens={args.max_new_tokens}",
            f"output_dir={output_dir}", *args.extra]


def read_run(label: str, output_dir: Path, wall_seconds: float) -> RunResult:
    """The prompts' and blocks' seconds of one run's records (every finished prompt under ``output_dir``)."""
    prompts, prompt_seconds, rule_seconds, blocks = 0, 0.0, 0.0, 0
    for done in sorted(output_dir.glob("**/prompts/*/done.json")):
        prompts += 1
        prompt_seconds += float(json.loads(done.read_text())["seconds"])
        for line in (done.parent / "blocks.jsonl").read_text().splitlines():
            if line.strip():
                blocks += 1
                rule_seconds += float(json.loads(line).get("rule_seconds", 0.0))
    return RunResult(label, prompts, prompt_seconds, rule_seconds, blocks, wall_seconds)


def run_once(args: argparse.Namespace, label: str, worktree: Path, output_dir: Path) -> RunResult:
    environment = {**os.environ, "PYTHONPATH": str(worktree)}
    start = time.perf_counter()
    done = subprocess.run(replay_command(args, output_dir), cwd=worktree, env=environment, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise RuntimeError(f"the {label} replay failed (exit {done.returncode}):\n{tail}")
    return read_run(label, output_dir, wall)


def format_run(result: RunResult) -> str:
    return (f"{result.label:>6}: {result.prompts} prompts, {result.blocks} blocks, {result.prompt_seconds:8.1f} s of "
            f"prompts -> {result.prompts_per_hour:8.1f} prompts/h; rules {100 * result.rule_share:5.1f} % of it; "
            f"wall {result.wall_seconds:.1f} s (model loading included)")


def summarise(results: list[RunResult]) -> list[str]:
    """Each commit's median prompts per hour and rules' share over the rounds, and after / before."""
    lines, medians = [], {}
    for label in ("before", "after"):
        runs = [r for r in results if r.label == label]
        medians[label] = statistics.median(r.prompts_per_hour for r in runs)
        share = statistics.median(r.rule_share for r in runs)
        lines.append(f"{label:>6}: median {medians[label]:.1f} prompts/h over {len(runs)} run(s); rules "
                     f"{100 * share:.1f} % of the prompts' time")
    lines.append(f"ratio after / before: {medians['after'] / medians['before']:.2f}x prompts per hour")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    if args.rounds < 1 or args.prompts < 1:
        print("error: --rounds and --prompts must be >= 1", file=sys.stderr)
        return 2
    commits = {"before": resolve_commit(args.before), "after": resolve_commit(args.after)}
    with tempfile.TemporaryDirectory(prefix="replay_throughput_") as scratch:
        root = Path(scratch)
        worktrees = {}
        try:
            for label, commit in commits.items():
                worktrees[label] = root / label
                subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(worktrees[label]),
                                commit], check=True, capture_output=True)
            print(f"before = {args.before} ({commits['before'][:10]}), after = {args.after} "
                  f"({commits['after'][:10]}); {args.rounds} ABAB round(s) of: "
                  f"{' '.join(replay_command(args, Path('<fresh>'))[1:])}", flush=True)
            results = []
            for round_index in range(args.rounds):
                for label in ("before", "after"):
                    output_dir = (args.keep or root / "runs") / f"{round_index}_{label}"
                    results.append(run_once(args, label, worktrees[label], output_dir))
                    print(f"round {round_index + 1} {format_run(results[-1])}", flush=True)
            print("\n".join(summarise(results)))
        finally:
            for path in worktrees.values():
                subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(path)],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
