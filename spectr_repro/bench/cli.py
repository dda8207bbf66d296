"""``python -m spectr_repro bench [--quick]``: speed benchmarks, our loops against transformers'.

    python -m spectr_repro bench             # preset conf/bench/full.yaml (needs `make models`)
    python -m spectr_repro bench --quick     # preset conf/bench/quick.yaml: SmolLM2 only, a few minutes

Presets are configs (``spectr_repro/conf/bench/<name>.yaml``, composed with the hardware config the runner
uses, so the engine runs as in a sweep). Results: a Markdown report on stdout and ``results/bench/bench.json``
(with the date and the command), from which ``python -m spectr_repro.bench.docs`` regenerates docs/speed.md.
Every ratio is measured side by side in one process, on the same prompts, after a warm-up, over several
rounds in rotating order, and reported as the median (see ``bench.measure`` and ``bench.suites``).
Timings need a quiet machine: nothing else should run beside a benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from spectr_repro.bench.tables import markdown
from spectr_repro.errors import UsageError
from spectr_repro.files import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectr_repro bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="preset 'quick': SmolLM2 only, a few minutes")
    parser.add_argument("--preset", default=None, help="a preset of conf/bench/ (default: full)")
    parser.add_argument("--out", default="results/bench/bench.json",
                        help="the results' JSON; a batch preset keeps its progress beside it (<name>.partial.json) "
                             "and the same command resumes from it")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--replay-summary", default=None,
                        help="a replay's replay_summary.csv: ours_best is the fastest lossless configuration "
                             "predicted from it and this machine's calibration (`check`), not the one-run sweep")
    parser.add_argument("--dtype", default=None,
                        help="model dtype for every contender (default: the pair's own; bfloat16 for the Qwen pair)")
    from spectr_repro import tracking  # torch, models, transformers: bench.cli starts in ~0.09 s

    tracking.add_logger_option(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    from spectr_repro.bench import preset as bench_preset  # torch, models, hydra (~3 s): --help stays at ~0.1 s

    name = args.preset or ("quick" if args.quick else "full")
    try:
        device = bench_preset.default_device(args.device)
        preset, hardware = bench_preset.compose_preset(name, device.split(":")[0])
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        results = bench_preset.run(preset, hardware, device, args.dtype, args.replay_summary,
                                   bench_preset.checkpoint_path(Path(args.out)))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results["settings"]["preset"] = name
    # Where the figures came from, for the tables docs/speed.md is generated from (`python -m spectr_repro.bench.docs`).
    results["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results["command"] = shlex.join(["python", "-m", "spectr_repro", "bench", *argv])
    out = Path(args.out)
    atomic_write_text(out, json.dumps(results, indent=2))
    bench_preset.checkpoint_path(out).unlink(missing_ok=True)  # everything it kept is in ``out`` now
    print(markdown(results))
    print(f"\nwrote {out} ({results['wall_time_s']:.0f} s)")
    tracking.log_command("bench", tracking.logger_config(args.logger), out.parent, results=results,
                         config={**results["settings"], "environment": results.get("environment")})
    return 0


__all__ = ["main"]
