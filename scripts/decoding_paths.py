"""The engine's two decoding paths on one prompt, timed against each other (issue 51, "one decoding path"):
``engine.generate`` (the one-prompt loop) against ``engine.generate_batch`` given a batch of one.

    python scripts/decoding_paths.py [--model-pair qwen25coder_1.5b_0.5b] [--prompts 2] [--rounds 2]
        [--max-new-tokens 32] [--temperature 0.4] [--dtype bfloat16]

For every contender (AR, SD K=1 L=6, SpecTr K=3 L=6, SBV-F K=3 L=6) and prompt, both paths decode the same prompt
with the same seed, EOS off, in alternation (one, batch, batch, one, ...: ABBA over the rounds, so the machine's
drift falls on both), in this one process. It prints, per contender, the median seconds of each path, the ratio
batch / one of the medians, and whether the two paths emitted the same tokens (they must: one prompt is the same
computation). A number is only a measurement on a quiet machine (nothing else running).
"""

from __future__ import annotations

import argparse
import statistics
import sys

CONTENDERS = [("ar", 1, 1), ("sd", 1, 6), ("spectr", 3, 6), ("sbvf", 3, 6)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-pair", default="qwen25coder_1.5b_0.5b")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.4)
    parser.add_argument("--dtype", default=None, help="default: the pair's own (the Qwen pair: bfloat16)")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.rounds < 1 or args.max_new_tokens < 1:
        print("error: --prompts, --rounds and --max-new-tokens must be >= 1", file=sys.stderr)
        return 2

    from spectr_repro.bench.contenders import encode_prompts
    from spectr_repro.bench.measure import timed
    from spectr_repro.engine import generate, generate_batch
    from spectr_repro.models import load_pair

    pair = load_pair(args.model_pair, device="cpu", dtype=args.dtype)
    prompts = encode_prompts(pair, args.dataset, args.prompts)

    def decode(path: str, ids, method: str, K: int, L: int, seed: int) -> tuple[float, list[int]]:
        common = dict(method=method, K=K, L=L, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                      eos_token_ids=(), vocab_size=pair.vocab_size)
        draft = None if method == "ar" else pair.draft
        if path == "one":
            seconds, out = timed(pair.device, lambda: generate(pair.target, draft, ids, seed=seed, **common))
            return seconds, list(out.new_tokens)
        seconds, out = timed(pair.device, lambda: generate_batch(pair.target, draft, [ids], seeds=[seed], **common))
        return seconds, list(out.outputs[0].new_tokens)

    decode("one", prompts[0], "ar", 1, 1, 0)  # warm-up: threads, allocator, kernels
    decode("batch", prompts[0], "ar", 1, 1, 0)
    print(f"{args.model_pair}, {args.dataset}, {args.prompts} prompt(s) x {args.rounds} round(s), "
          f"{args.max_new_tokens} new tokens, T={args.temperature:g}, dtype {next(pair.target.parameters()).dtype}\n")
    print("| contender | one prompt (s, median) | batch of one (s, median) | batch / one | same tokens |")
    print("|---|---:|---:|---:|---|")
    for method, K, L in CONTENDERS:
        seconds = {"one": [], "batch": []}
        same = True
        for r in range(args.rounds):
            order = ("one", "batch") if r % 2 == 0 else ("batch", "one")
            for i, ids in enumerate(prompts):
                tokens = {}
                for path in order:
                    elapsed, tokens[path] = decode(path, ids, method, K, L, seed=i)
                    seconds[path].append(elapsed)
                same = same and tokens["one"] == tokens["batch"]
        one, batch = statistics.median(seconds["one"]), statistics.median(seconds["batch"])
        print(f"| {method} K={K} L={L} | {one:.2f} | {batch:.2f} | {batch / one:.3f} | {'yes' if same else 'NO'} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
