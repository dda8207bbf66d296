"""Where a replay's rule time goes: each registered rule timed alone over a replay grid on real drafted blocks, and
its values kept so that a faster rule can be checked bitwise against the slower one.

    python scripts/rule_seconds.py --save blocks.pt                 # draft the blocks (loads the pair), time them
    python scripts/rule_seconds.py --load blocks.pt --values v.json # time again (no model), keep every value
    python scripts/rule_seconds.py --load blocks.pt --check-values v.json   # after a change: identical values?

Blocks: for each dataset and temperature, the first ``--blocks`` blocks of one prompt's trajectory, drafted at
K_max x L_max (the grid's largest K and L) by the engine, the trajectory continued by the grid's reference rule (sbv
at K=3, L=6), as ``replay`` drafts them; each kept on its support (``replay.support.compact_block``, the replay's
``support_mass``): at T = 0.7 on the Qwen pair that is every token. Defaults: the grid of
``experiment=replay_qwen_grid`` (K 1,3,5,7 x L 6,12,16,20,24, 16 draws, the release sampled).

Timing: every rule alone through ``replay.core.block_estimates`` (so with its shared work and its K = 1 reduction,
as the replay runs it) on ``--device`` (CUDA: synchronised before and after each rule), one torch thread, seconds a
block, one table row per block and the mean per temperature. A rule timed alone can cost a little more than inside
the replay (sbvf shares sbv's sampler there). The numbers are a measurement only on a quiet machine; beside other
work only the proportions mean anything.

``--values`` writes every (rule, K, L) value of every block as float hex; ``--check-values`` compares them with a
file written earlier and exits 1 naming the first differences (bitwise: a refactor meant to keep the values must
keep every bit, or the committed grid's spot check would flag it). Exit 2 with one message for bad arguments,
before any model loads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from spectr_repro.replay.core import block_estimates, check_grid
from spectr_repro.replay.support import SUPPORT_TAIL_MASS, compact_block
from spectr_repro.verify import VERIFIERS, get_verifier

REFERENCE, REFERENCE_K, REFERENCE_L = "sbv", 3, 6


def _integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-pair", default="qwen25coder_1.5b_0.5b")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu", help="where the models and the rules run (cpu, cuda, cuda:1)")
    parser.add_argument("--datasets", default="humaneval,lm1b")
    parser.add_argument("--temperatures", type=_floats, default=[0.1, 0.4, 0.7])
    parser.add_argument("--blocks", type=int, default=2, help="blocks a (dataset, temperature)")
    parser.add_argument("--K", type=_integers, default=[1, 3, 5, 7])
    parser.add_argument("--L", type=_integers, default=[6, 12, 16, 20, 24])
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--sampled", default="spectr_gbv", help="rules taken by their draws ('' for none)")
    parser.add_argument("--rules", default=",".join(VERIFIERS), help="the rules to time (default: every one)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--save", type=Path, help="draft the blocks and save them here")
    source.add_argument("--load", type=Path, help="blocks saved earlier (no model is loaded)")
    parser.add_argument("--values", type=Path, help="write every value (float hex) here")
    parser.add_argument("--check-values", type=Path, help="compare every value with this file; exit 1 if any differs")
    args = parser.parse_args(argv)
    args.sampled = [m for m in args.sampled.split(",") if m]
    args.rules = [m for m in args.rules.split(",") if m]
    try:
        check_grid(args.rules, args.K, args.L, args.draws)
        unknown = [m for m in args.sampled if m not in VERIFIERS]
        if unknown:
            raise ValueError(f"unknown sampled rule(s) {', '.join(unknown)}")
        if args.blocks < 1 or not all(t > 0 for t in args.temperatures):
            raise ValueError("--blocks must be >= 1 and temperatures > 0")
        if args.load is not None and not args.load.is_file():
            raise ValueError(f"--load {args.load}: no such file")
        if args.check_values is not None and not args.check_values.is_file():
            raise ValueError(f"--check-values {args.check_values}: no such file")
    except ValueError as error:
        parser.error(str(error))
    return args


def draft_blocks(args: argparse.Namespace) -> list[dict]:
    """The blocks of each (dataset, temperature): one prompt's first ``args.blocks`` blocks, on their support."""
    from spectr_repro.data import encode_prompt, load_examples
    from spectr_repro.engine import drafted_blocks
    from spectr_repro.models import load_pair

    pair = load_pair(args.model_pair, device=args.device, dtype=args.dtype)
    reference = get_verifier(REFERENCE, check_inputs=False)
    blocks = []
    for dataset in args.datasets.split(","):
        [example] = load_examples(dataset, 1, seed=0, tokenizer=pair.tokenizer)
        prompt = encode_prompt(pair.tokenizer, example)[0].tolist()
        for temperature in args.temperatures:
            decoding = drafted_blocks(pair.target, pair.draft, [prompt], K=max(args.K), L=max(args.L),
                                      temperature=temperature, max_new_tokens=max(args.L) * (args.blocks + 1),
                                      seeds=[0], eos_token_ids=(), vocab_size=pair.vocab_size)
            for step in decoding:
                [block] = step.blocks
                tokens, draft, target, support = compact_block(block.draft_tokens, block.draft_probs,
                                                               block.target_probs, SUPPORT_TAIL_MASS)
                blocks.append({"dataset": dataset, "temperature": temperature, "support": support.kept,
                               "tokens": tokens, "draft": draft, "target": target})
                K, L = REFERENCE_K, REFERENCE_L
                step.results[0] = reference(block.draft_tokens[:K, :L], block.draft_probs[:K, :L],
                                            block.target_probs[:K, :L + 1], generator=block.generator,
                                            state=block.state)
                if sum(b["dataset"] == dataset and b["temperature"] == temperature for b in blocks) == args.blocks:
                    break
    return blocks


def time_rules(blocks: list[dict], args: argparse.Namespace) -> tuple[list[dict[str, float]], list[list]]:
    """(seconds of each rule on each block, every value as [block, rule, K, L, float hex, estimator])."""
    seconds, values = [], []
    device = torch.device(args.device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # time the work, not launches
    for index, block in enumerate(blocks):
        row = {}
        tokens, draft, target = (block[key].to(device) for key in ("tokens", "draft", "target"))
        for rule in args.rules:
            synchronize()
            started = time.perf_counter()
            estimates = block_estimates(tokens, draft, target, [rule], args.K, args.L, args.draws,
                                        torch.Generator(device).manual_seed(index),
                                        sampled=[m for m in args.sampled if m == rule])
            synchronize()
            row[rule] = time.perf_counter() - started
            values += [[index, e.method, e.K, e.L, float(e.tokens).hex(), e.estimator] for e in estimates]
        seconds.append(row)
    return seconds, values


def table(blocks: list[dict], seconds: list[dict[str, float]], rules: list[str]) -> str:
    """Markdown: seconds a block of each rule, one row per block, then the mean of each temperature."""
    lines = ["| dataset | T | support | " + " | ".join(rules) + " | all |",
             "|---|---|---|" + "---|" * (len(rules) + 1)]
    for block, row in zip(blocks, seconds):
        lines.append(f"| {block['dataset']} | {block['temperature']} | {block['support']:,} | "
                     + " | ".join(f"{row[r]:.2f}" for r in rules) + f" | {sum(row.values()):.1f} |")
    for temperature in sorted({b["temperature"] for b in blocks}):
        rows = [row for block, row in zip(blocks, seconds) if block["temperature"] == temperature]
        means = {r: statistics.mean(row[r] for row in rows) for r in rules}
        lines.append(f"| mean | {temperature} | | " + " | ".join(f"{means[r]:.2f}" for r in rules)
                     + f" | {sum(means.values()):.1f} |")
    return "\n".join(lines)


def differences(before: list[list], after: list[list]) -> list[str]:
    """The values that differ (bitwise), named; a different grid is one difference."""
    if [v[:4] for v in before] != [v[:4] for v in after]:
        return ["the two files hold different (block, rule, K, L) grids"]
    return [f"block {b[0]} {b[1]} K={b[2]} L={b[3]}: {float.fromhex(b[4])!r} then {float.fromhex(a[4])!r}"
            for b, a in zip(before, after) if b != a]


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    if args.load is not None:
        blocks = torch.load(args.load, map_location="cpu")  # saved from any device; time_rules moves them to --device
    else:
        blocks = draft_blocks(args)
        if args.save is not None:
            torch.save(blocks, args.save)
    with torch.inference_mode():
        seconds, values = time_rules(blocks, args)
    print(table(blocks, seconds, args.rules))
    if args.values is not None:
        args.values.write_text(json.dumps(values))
    if args.check_values is not None:
        differ = differences(json.loads(args.check_values.read_text()), values)
        print(f"{len(values)} values compared with {args.check_values}: {len(differ)} differ")
        for line in differ[:10]:
            print("  " + line)
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
