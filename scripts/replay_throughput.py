"""Replay throughput of two commits, or of batch sizes at one commit, measured in alternation (issue 35): prompts
per hour, before and after.

    python scripts/replay_throughput.py BEFORE AFTER [--rounds 2] [--prompts 4] [--dataset humaneval]
        [--model-pair qwen25coder_1.5b_0.5b] [--max-new-tokens 48] [--keep DIR] [-- extra replay arguments]
    python scripts/replay_throughput.py COMMIT --batch-prompts 1,4 [same options]
    python scripts/replay_throughput.py BEFORE AFTER --batch-prompts 1,4 [same options]

With ``--batch-prompts B1,B2,...`` one commit is measured at each ``replay.batch_prompts`` value in turn (B1, B2,
B1, B2, ...: the same alternation), each run labelled ``B=<value>``, and the ratios are against B1. A batched
prompt's ``seconds`` is its share of its batch's wall time (docs/replay.md), so the prompts' seconds still add up
to the time the replay spent on them. With two commits, ``--batch-prompts B1,B2`` gives each its own batch size (the
replay before and after a whole piece of work that includes batching; B = 1 passes no argument, so a commit from
before ``replay.batch_prompts`` existed runs too).

Each commit is checked out in its own ``git worktree`` (detached, under a temporary folder, removed at the end).
This one driver process then runs, ``--rounds`` times in alternation (before, after, before, after: ABAB, so a
drift of the machine's speed falls on both; with ``--batch-prompts`` each batch size in turn), ``python -m
spectr_repro replay K=1,3,5,7 L=6,12 dataset=D num_prompts=N model_pair=P max_new_tokens=M`` (plus
``replay.batch_prompts=B``) in that worktree (its own code: cwd and PYTHONPATH), each run into a fresh output
folder (nothing resumed). Every run replays the same prompts with the same seed.

Per run it reads the records the replay writes: each prompt's ``seconds`` (its trajectory: model forwards and
the rules; done.json) and each block's ``rule_seconds`` (the rules' evaluation on it; blocks.jsonl). It prints
prompts per hour = 3600 x prompts / their seconds (model loading and the summary excluded: the run's whole wall
time is printed beside it), the rules' share of the prompts' seconds, and, over the rounds, each commit's
median and the ratio after / before of the medians. A number is only a measurement on a quiet machine (nothing
else running): on a loaded one only the proportions mean anything.

Exit status 2 with one message for bad arguments (an unknown commit, rounds < 1, batch sizes not integers >= 1,
fewer than two, or not two with two commits), before anything runs.
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
    parser.add_argument("before", help="the commit measured first in each round (e.g. main); with --batch-prompts "
                        "the one commit measured")
    parser.add_argument("after", nargs="?", default=None, help="the commit compared with it (e.g. s3-fast); none with "
                        "--batch-prompts")
    parser.add_argument("--batch-prompts", default=None, help="compare these replay.batch_prompts values at one "
                        "commit (comma list, e.g. 1,4; the first is the baseline), or with two commits each "
                        "commit's own (B_before,B_after)")
    parser.add_argument("--rounds", type=int, default=2, help="ABAB rounds (default 2)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per run (default 4)")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--model-pair", default="qwen25coder_1.5b_0.5b")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the replays")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' records under this folder")
    parser.add_argument("extra", nargs="*", help="more replay arguments (after --), the same for both commits")
    return parser.parse_intermixed_args(argv)  # positionals after the options too (`COMMIT --rounds 2 -- key=value`)


@dataclass(frozen=True)
class Variant:
    """One thing measured in each round: a commit and the replay arguments that set it apart."""

    label: str
    name: str  # the commit as given (e.g. main)
    commit: str  # its full hash
    arguments: tuple[str, ...] = ()

    def __str__(self) -> str:
        return " ".join([f"{self.label} = {self.name} ({self.commit[:10]})", *self.arguments])


def batch_sizes(text: str, distinct: bool = True) -> list[int]:
    """``--batch-prompts``'s values; SystemExit(2) with one message unless two or more (``distinct``) integers >= 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if len(values) < 2 or (distinct and len(set(values)) != len(values)) or min(values) < 1:
        print(f"error: --batch-prompts must be two or more distinct integers >= 1 (e.g. 1,4), got {text!r}",
              file=sys.stderr)
        raise SystemExit(2)
    return values


def variants_of(args: argparse.Namespace) -> list[Variant]:
    """before and after (two commits), or one commit at each batch size; SystemExit(2) for bad arguments."""
    if args.batch_prompts is None:
        if args.after is None:
            print("error: give two commits (BEFORE AFTER), or one commit and --batch-prompts", file=sys.stderr)
            raise SystemExit(2)
        return [Variant("before", args.before, resolve_commit(args.before)),
                Variant("after", args.after, resolve_commit(args.after))]
    if args.after is not None and "=" in args.after:  # `COMMIT --batch-prompts 1,4 -- key=value`: a replay argument
        args.extra, args.after = [args.after, *args.extra], None
    if args.after is not None:  # each commit at its own batch size
        sizes = batch_sizes(args.batch_prompts, distinct=False)
        if len(sizes) != 2:
            print(f"error: with two commits --batch-prompts gives each its batch size (B_before,B_after), got "
                  f"{args.batch_prompts!r}", file=sys.stderr)
            raise SystemExit(2)
        return [Variant(f"{label} B={size}", name, resolve_commit(name),
                        (f"replay.batch_prompts={size}",) if size != 1 else ())
                for label, name, size in (("before", args.before, sizes[0]), ("after", args.after, sizes[1]))]
    sizes = batch_sizes(args.batch_prompts)
    commit = resolve_commit(args.before)
    return [Variant(f"B={size}", args.before, commit, (f"replay.batch_prompts={size}",)) for size in sizes]


def resolve_commit(name: str) -> str:
    """The full hash of ``name``; SystemExit(2) with one message when git does not know it."""
    done = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"error: {name!r} is not a commit of {REPOSITORY}", file=sys.stderr)
        raise SystemExit(2)
    return done.stdout.strip()


def replay_command(args: argparse.Namespace, output_dir: Path, variant: Variant | None = None) -> list[str]:
    return [args.python, "-m", "spectr_repro", "replay", *GRID, f"dataset={args.dataset}",
            f"num_prompts={args.prompts}", f"model_pair={args.model_pair}", f"max_new_tokens={args.max_new_tokens}",
            f"output_dir={output_dir}", *args.extra, *(variant.arguments if variant else ())]


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


def run_once(args: argparse.Namespace, variant: Variant, worktree: Path, output_dir: Path) -> RunResult:
    environment = {**os.environ, "PYTHONPATH": str(worktree)}
    start = time.perf_counter()
    done = subprocess.run(replay_command(args, output_dir, variant), cwd=worktree, env=environment,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise RuntimeError(f"the {variant.label} replay failed (exit {done.returncode}):\n{tail}")
    return read_run(variant.label, output_dir, wall)


def format_run(result: RunResult) -> str:
    return (f"{result.label:>6}: {result.prompts} prompts, {result.blocks} blocks, {result.prompt_seconds:8.1f} s of "
            f"prompts -> {result.prompts_per_hour:8.1f} prompts/h; rules {100 * result.rule_share:5.1f} % of it; "
            f"wall {result.wall_seconds:.1f} s (model loading included)")


def summarise(results: list[RunResult], labels: list[str] | None = None) -> list[str]:
    """Each variant's median prompts per hour and rules' share over the rounds, and each one's ratio to the first
    (``labels``, default before and after: after / before)."""
    labels = labels or ["before", "after"]
    lines, medians = [], {}
    for label in labels:
        runs = [r for r in results if r.label == label]
        medians[label] = statistics.median(r.prompts_per_hour for r in runs)
        share = statistics.median(r.rule_share for r in runs)
        lines.append(f"{label:>6}: median {medians[label]:.1f} prompts/h over {len(runs)} run(s); rules "
                     f"{100 * share:.1f} % of the prompts' time")
    for label in labels[1:]:
        lines.append(f"ratio {label} / {labels[0]}: {medians[label] / medians[labels[0]]:.2f}x prompts per hour")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    if args.rounds < 1 or args.prompts < 1:
        print("error: --rounds and --prompts must be >= 1", file=sys.stderr)
        return 2
    variants = variants_of(args)
    with tempfile.TemporaryDirectory(prefix="replay_throughput_") as scratch:
        root = Path(scratch)
        worktrees: dict[str, Path] = {}  # commit -> its worktree (one per commit, shared by its batch sizes)
        try:
            for variant in variants:
                if variant.commit not in worktrees:
                    worktrees[variant.commit] = root / f"worktree_{len(worktrees)}"
                    subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "add", "--detach",
                                    str(worktrees[variant.commit]), variant.commit], check=True, capture_output=True)
            print(f"{', '.join(map(str, variants))}; {args.rounds} alternating round(s) of: "
                  f"{' '.join(replay_command(args, Path('<fresh>'))[1:])}", flush=True)
            results = []
            for round_index in range(args.rounds):
                for variant in variants:
                    name = variant.label.replace("=", "").replace(" ", "_")
                    output_dir = (args.keep or root / "runs") / f"{round_index}_{name}"
                    results.append(run_once(args, variant, worktrees[variant.commit], output_dir))
                    print(f"round {round_index + 1} {format_run(results[-1])}", flush=True)
            print("\n".join(summarise(results, [v.label for v in variants])))
        finally:
            for path in worktrees.values():
                subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(path)],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
