"""The engine's peak memory on a long cached context against the KV caches of K and K + 1 rows: what
``launch.fit`` counts when it refuses a long-input bucket (docs/context.md).

    python scripts/kv_peak_memory.py --K 7 --positions 8000            # the one-prompt engine
    python scripts/kv_peak_memory.py --K 7 --positions 4000 --prompts 2   # the batched engine

A random Qwen2 pair (8 layers, 8 KV heads of 32 dims: about 16 kB of KV a position and row for both models, so the
caches dwarf the weights) drafts its first block of L = 6 after prompts of ``--positions`` tokens (prefill chunks of
256, as on the CPU). The peak is the bench's (``bench.measure.PeakMemory``: the resident high-water mark on Linux)
less the resident memory once the models are built; it is printed beside the caches of K rows, of K + 1 rows, and of
K rows plus one layer of one model on those rows. One thread; nothing is written.
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from spectr_repro.bench.measure import PeakMemory, resident_bytes
from spectr_repro.engine import drafted_blocks

LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 8, 8, 32, 512


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--K", type=int, default=7)
    parser.add_argument("--positions", type=int, default=8000)
    parser.add_argument("--prompts", type=int, default=1)
    args = parser.parse_args(argv)
    if args.K < 1 or args.positions < 8 or args.prompts < 1:
        parser.error("--K and --prompts must be >= 1, --positions >= 8")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS, num_attention_heads=8,
                         num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB,
                         max_position_embeddings=args.positions + 64)
    target, draft = Qwen2ForCausalLM(config).eval(), Qwen2ForCausalLM(config).eval()
    prompts = [torch.randint(0, VOCAB, (args.positions,)).tolist() for _ in range(args.prompts)]
    loaded = resident_bytes()
    with PeakMemory(torch.device("cpu")) as memory:
        decoding = drafted_blocks(target, draft, prompts, K=args.K, L=6, temperature=0.7, max_new_tokens=8,
                                  seeds=list(range(args.prompts)), vocab_size=VOCAB, prefill_chunk=256)
        next(iter(decoding))
    peak = memory.peak - loaded
    per_row = args.prompts * args.positions * 2 * LAYERS * 2 * KV_HEADS * HEAD_DIM * 4  # both models, K and V
    mib = 2**20
    print(f"B={args.prompts} K={args.K} positions={args.positions}: peak {peak / mib:.0f} MiB above the built models; "
          f"KV caches of K rows {args.K * per_row / mib:.0f} MiB, of K + 1 rows {(args.K + 1) * per_row / mib:.0f} "
          f"MiB, of K rows plus one layer of one model {args.K * per_row * (1 + 1 / (2 * LAYERS)) / mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
