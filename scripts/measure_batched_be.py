"""Block-efficiency samples per hour, decoding prompts alone (batch 1) and in batches (engine.generate_batch).

    python scripts/measure_batched_be.py                       # Qwen2.5-Coder 1.5B/0.5B, CPU, cpu_quick's setting
    python scripts/measure_batched_be.py --batch 1 4 8 --prompts 16 --tokens 32 --method sbv --K 3 --L 6
    python scripts/measure_batched_be.py --pair tiny_random --prompts 4 --tokens 8   # a smoke check (seconds)

A block-efficiency sample is one prompt decoded to its end (the table's intervals resample prompts).
For every batch size B the same prompts are decoded with the same per-prompt seeds (the runner's:
seed * 100_003 + index), B at a time (B = 1: ``engine.generate``, one prompt at a time, as the
runner times prompts), after one warm-up decode per mode. Reported per B: wall and process CPU
seconds (all threads), prompts (BE samples), tokens and target calls per wall hour and per CPU hour,
the pooled BE, and how many prompts decoded to exactly the tokens of batch 1 (all of them in float32;
in bfloat16 batched shapes round differently, so a few may differ while following the same law).
Take the numbers on a quiet machine: other processes inflate both clocks. Writes a JSON file too.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from spectr_repro.data import encode_prompt, load_examples
from spectr_repro.engine import generate, generate_batch
from spectr_repro.models import load_pair
from spectr_repro.verify import VERIFIERS


def decode(pair, prompts, seeds, batch: int, args) -> tuple[list, float, float]:
    """(outputs, wall s, CPU s) of decoding ``prompts`` ``batch`` at a time."""
    common = dict(method=args.method, K=args.K, L=args.L, temperature=args.temperature, max_new_tokens=args.tokens,
                  eos_token_ids=pair.eos_token_ids, vocab_size=pair.vocab_size, prefill_chunk=args.prefill_chunk)
    outputs = []
    wall, cpu = time.perf_counter(), time.process_time()
    if batch == 1:
        for prompt, seed in zip(prompts, seeds):
            outputs.append(generate(pair.target, pair.draft, prompt, seed=seed, **common))
    else:
        for start in range(0, len(prompts), batch):
            out = generate_batch(pair.target, pair.draft, prompts[start:start + batch],
                                 seeds=seeds[start:start + batch], **common)
            outputs.extend(out.outputs)
    if pair.device.type == "cuda":
        torch.cuda.synchronize(pair.device)
    return outputs, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="qwen25coder_1.5b_0.5b")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--device", default=None, help="default: the pair's (cuda when available, else cpu)")
    parser.add_argument("--dtype", default=None, help="default: the pair's (bfloat16 for Qwen)")
    parser.add_argument("--method", default="sbv")
    parser.add_argument("--K", type=int, default=3)
    parser.add_argument("--L", type=int, default=6)
    parser.add_argument("--temperature", type=float, default=0.4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--out", default="results/bench/batched_be.json")
    args = parser.parse_args()
    if args.method == "ar" or VERIFIERS[args.method].single_draft:
        args.K = 1

    pair = load_pair(args.pair, device=args.device, dtype=args.dtype)
    examples = load_examples(args.dataset, args.prompts, seed=args.seed, tokenizer=pair.tokenizer)
    prompts = [encode_prompt(pair.tokenizer, example)[0] for example in examples]
    seeds = [args.seed * 100_003 + index for index in range(len(prompts))]
    print(f"{args.pair} on {pair.device} ({next(pair.target.parameters()).dtype}), {args.method} K={args.K} "
          f"L={args.L} T={args.temperature}, {len(prompts)} {args.dataset} prompts "
          f"({min(map(len, prompts))}-{max(map(len, prompts))} tokens), {args.tokens} new tokens, "
          f"{torch.get_num_threads()} threads")

    rows, reference = [], None
    for batch in args.batch:
        warm = prompts[:batch]  # warm-up: kernels and allocator at this mode's shapes, short prompts
        decode(pair, [p[-32:] for p in warm], seeds[:batch], batch, argparse.Namespace(**{**vars(args), "tokens": 4}))
        outputs, wall, cpu = decode(pair, prompts, seeds, batch, args)
        tokens = sum(len(out.new_tokens) for out in outputs)
        calls = sum(out.target_calls for out in outputs)
        if reference is None:
            reference = outputs
        same = sum(a.new_tokens == b.new_tokens for a, b in zip(reference, outputs))
        row = {
            "batch_prompts": batch, "wall_s": wall, "cpu_s": cpu, "prompts": len(outputs), "tokens": tokens,
            "target_calls": calls, "block_efficiency": tokens / calls if calls else 0.0,
            "prompts_per_wall_hour": 3600 * len(outputs) / wall, "prompts_per_cpu_hour": 3600 * len(outputs) / cpu,
            "tokens_per_wall_hour": 3600 * tokens / wall, "target_calls_per_wall_hour": 3600 * calls / wall,
            "same_tokens_as_first": same,
        }
        rows.append(row)
        print(f"B={batch:>2}: wall {wall:8.1f} s  CPU {cpu:8.1f} s  BE {row['block_efficiency']:.3f}  "
              f"BE samples/wall-h {row['prompts_per_wall_hour']:8.1f}  /CPU-h {row['prompts_per_cpu_hour']:8.1f}  "
              f"tokens/wall-h {row['tokens_per_wall_hour']:9.0f}  "
              f"same tokens as B={args.batch[0]}: {same}/{len(outputs)}",
              flush=True)
    base = rows[0]
    for row in rows[1:]:
        print(f"B={row['batch_prompts']} vs B={base['batch_prompts']}: "
              f"{row['prompts_per_wall_hour'] / base['prompts_per_wall_hour']:.2f}x BE samples per wall hour, "
              f"{row['prompts_per_cpu_hour'] / base['prompts_per_cpu_hour']:.2f}x per CPU hour")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "device": str(pair.device), "machine": platform.processor(),
                               "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows},
                              indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
