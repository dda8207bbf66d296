"""Write the predicted speed-up over AR at batch B on every accelerator of cost/accelerators.yaml: A MODEL.

    python scripts/gpu_speedups.py --out results/gpu_speedups_model.csv
    python scripts/gpu_speedups.py --replay-summary results/replay_qwen/replay/replay_summary.csv --temperature 0.4
    python scripts/gpu_speedups.py --batch-bench results/speedup_batch/bench_batch.json   # the timed cells' rules

One row per (accelerator, pair, method, K, L, B) from ``spectr_repro.cost.batch_speedup`` (the roofline at the
spec-sheet peaks, no overhead, no rule time), with the Qwen pair's shapes and the paper's pairs'. Tokens per call:
a replay summary's when given (its (method, K, L) rows; mean over datasets), or a batch bench's (the rules it timed,
their tokens per call over all its groups: the same draws the measured speed-ups came from), else the stated i.i.d.
assumption (``assumed_tokens_per_call``). Every row's ``model`` column says it is a model, not a measurement.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import pandas as pd

from spectr_repro.cost.batch_speedup import assumed_tokens_per_call, batch_speedups
from spectr_repro.cost.roofline import PAPER_CONTEXT, load_accelerators
from spectr_repro.cost.shapes import pair_shapes

PAIRS = ("qwen25coder_1.5b_0.5b", "deepseek_6.7b_1.3b", "deepseek_33b_1.3b")


def replay_tokens(path: Path, temperature: float | None) -> dict[tuple[str, int, int], float]:
    """(method, K, L) -> tokens per call of a replay summary (mean over its datasets); AR = 1."""
    table = pd.read_csv(path)
    if temperature is not None and "temperature" in table.columns:
        table = table[table["temperature"] == temperature]
    means = table.groupby(["method", "K", "L"])["tokens_per_call"].mean()
    return {("ar", 1, 1): 1.0, **{(str(m), int(k), int(l_)): float(v) for (m, k, l_), v in means.items()}}


def bench_tokens(path: Path) -> dict[tuple[str, int, int], float]:
    """(method, K, L) -> tokens per call of a batch bench's timed groups (tokens over target calls, every B); AR = 1."""
    import json

    groups = json.loads(path.read_text())["batches"]["groups"]
    totals: dict[tuple[str, int, int], list[float]] = {}
    for row in groups:
        if row["method"] != "ar":
            total = totals.setdefault((row["method"], int(row["K"]), int(row["L"])), [0.0, 0.0])
            total[0] += row["tokens"]
            total[1] += sum(row["calls"])
    return {("ar", 1, 1): 1.0, **{key: tokens / calls for key, (tokens, calls) in totals.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_speedups_model.csv"))
    parser.add_argument("--replay-summary", type=Path, default=None)
    parser.add_argument("--batch-bench", type=Path, default=None, help="a bench_batch.json: its rules' tokens per call")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--acceptance", type=float, default=0.8, help="per-position acceptance of the assumption")
    args = parser.parse_args(argv)
    grid = None
    if args.replay_summary is not None and args.batch_bench is not None:
        print("error: give --replay-summary or --batch-bench, not both", file=sys.stderr)
        return 2
    if args.replay_summary is not None:
        table = replay_tokens(args.replay_summary, args.temperature)
        tokens, source = (lambda m, k, l_: table[(m, k, l_)]), f"replay {args.replay_summary}"
    elif args.batch_bench is not None:
        try:
            table = bench_tokens(args.batch_bench)
        except (OSError, ValueError, KeyError) as error:
            print(f"error: {args.batch_bench} is not a batch bench's result ({error})", file=sys.stderr)
            return 2
        tokens, source, grid = (lambda m, k, l_: table[(m, k, l_)]), f"batch bench {args.batch_bench}", sorted(table)
    else:
        tokens, source = functools.partial(assumed_tokens_per_call, acceptance=args.acceptance), ""
        source = f"assumed i.i.d. acceptance {args.acceptance}"
    frames = []
    for key, device in load_accelerators().items():
        for pair in PAIRS:
            target, draft = pair_shapes(pair)
            try:
                frame = batch_speedups(target, draft, device.rates(), tokens, PAPER_CONTEXT, grid=grid)
            except KeyError as missing:
                print(f"error: the replay summary has no tokens per call for {missing}", file=sys.stderr)
                return 2
            frames.append(frame.assign(accelerator=key, pair=pair, tokens_source=source))
    pd.concat(frames, ignore_index=True).to_csv(args.out, index=False)
    print(f"wrote {args.out} (a model, not a measurement)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
