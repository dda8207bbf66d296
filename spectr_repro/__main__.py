"""``python -m spectr_repro <command> [args]`` (also the ``spectr-repro`` script), where <command> is one of
run, sweep, plan, replay, excursions, report, theory, audit, bias, quality, bench, check, seal, spotcheck,
dashboard (``COMMANDS`` below).

Each subcommand lives in its own module and takes the remaining argv; they are imported lazily so
that e.g. ``report`` works on a laptop without loading the runner.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence

from spectr_repro.commit import git_commit

# name -> (module, function, one-line description)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("spectr_repro.runner.cli", "main_run", "run one cell (method, K, L, T, dataset, model pair)"),
    "sweep": ("spectr_repro.runner.cli", "main_sweep",
              "run a grid: comma lists (K=1,3,5,7) and/or an experiment's grid (experiment=paper_main)"),
    "plan": ("spectr_repro.plan", "main",
             "what a sweep would cost (cells, tokens, downloads vs disk, time), loading nothing"),
    "replay": ("spectr_repro.replay.driver", "main",
               "every rule, K and L on the same draft blocks of a lossless trajectory (block efficiency)"),
    "excursions": ("spectr_repro.replay.excursions", "main",
                   "where the release's h leaves [0, 1] on the replay's real-model blocks (counts per K, L, T)"),
    "report": ("spectr_repro.analysis.report", "main", "tables, figures and REPORT.md from a results folder"),
    "theory": ("spectr_repro.theory.cli", "main_theory", "exact laws, LP limit, paper's bound (toys)"),
    "audit": ("spectr_repro.theory.cli", "main_audit", "validity audit of every verification rule"),
    "bias": ("spectr_repro.bias.driver", "main",
             "the law of each rule's first emitted token vs the target's, on real models (test with power)"),
    "quality": ("spectr_repro.quality", "main", "pass@1 / accuracy of each method next to AR (runs model code)"),
    "bench": ("spectr_repro.bench.cli", "main", "speed benchmarks: our loops vs transformers' (--quick: minutes)"),
    "check": ("spectr_repro.check.cli", "main", "does it work here, and what does a run cost: correctness, timing, "
              "calibration of `plan` (minutes)"),
    "seal": ("spectr_repro.replay.seal", "main",
             "seal a replay's finished prompts for git (gzip'd blocks, manifest), or --check sealed ones (no model)"),
    "spotcheck": ("spectr_repro.replay.spotcheck", "main",
                  "re-run k random committed prompts with their recorded settings and compare with the records"),
    "dashboard": ("spectr_repro.tracking.dashboard", "main",
                  "the W&B workspace of a results folder (offline: its definition and the commands to publish it)"),
}


def usage() -> str:
    lines = ["usage: python -m spectr_repro <command> [args]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}} {description}" for name, (_, _, description) in COMMANDS.items()]
    lines += ["", "Run `python -m spectr_repro <command> --help` for a command's options."]
    try:
        from spectr_repro.runner.cli import help_text  # the runner (torch): --help stays light

        lines += ["", "run/sweep:", help_text()]
    except Exception as error:  # the help must still print without the runner's dependencies
        lines += ["", f"(config groups unavailable: {error})"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "sweep" and "--plan" in rest:  # `sweep ... --plan` is `plan ...`
        command = "plan"
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        print(f"error: unknown command {command!r}.{hint} Commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[command]
    from spectr_repro.logs import setup_logging  # tqdm: --help stays at ~50 ms

    setup_logging()
    git_commit()  # read once, now: a checkout during a long run must not relabel the records it writes later
    function = getattr(importlib.import_module(module_name), function_name)
    result = function(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
