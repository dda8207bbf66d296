"""Paired comparison of two replays of the same blocks: replay.row_groups=first against disjoint.

    python -m spectr_repro replay experiment=replay_qwen replay.num_prompts=4 method=sd,bv,gbv,spectr_gbv,sbv,spectr \
        K=1,3,7 L=6 replay.row_groups=first output_dir=/tmp/rg_first
    (the same with replay.row_groups=disjoint output_dir=/tmp/rg_disjoint)
    python scripts/compare_row_groups.py /tmp/rg_first/replay_qwen/replay /tmp/rg_disjoint/replay_qwen/replay

Same seed, so the same trajectory and blocks (checked: the same block count and reference tokens). For each prompt,
the mean over its blocks of (rule at its K, L=6) - (the release at K=3, L=6); printed: the mean and standard
deviation of those per-prompt differences over prompts, per dataset and overall, for both replays, and the ratio of
their variances (the figures of docs/replay.md's "Row groups", 2026-12-02).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

RULES = (("sd", 1), ("bv", 1), ("gbv", 1), ("spectr", 3), ("sbv", 3))
RELEASE = ("spectr_gbv", 3, 6)


def per_prompt(root: Path) -> tuple[dict, int, int]:
    """{(dataset, prompt): {rule: mean difference}}, the number of blocks and the reference tokens."""
    out, blocks, reference = {}, 0, 0
    for path in sorted(root.glob("*/prompts/*/blocks.jsonl")):
        dataset = path.parts[-4].split("__")[1]
        differences: dict[str, list[float]] = {}
        for line in path.read_text().splitlines():
            block = json.loads(line)
            blocks, reference = blocks + 1, reference + block["reference_tokens"]
            values = {(m, K, L): tokens for m, K, L, tokens, *_ in block["values"]}
            for rule, K in RULES:
                differences.setdefault(rule, []).append(values[(rule, K, 6)] - values[RELEASE])
        out[(dataset, path.parts[-2])] = {rule: float(np.mean(d)) for rule, d in differences.items()}
    return out, blocks, reference


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python scripts/compare_row_groups.py FIRST_REPLAY_DIR DISJOINT_REPLAY_DIR", file=sys.stderr)
        return 2
    (first, n_first, ref_first), (disjoint, n_disjoint, ref_disjoint) = (per_prompt(Path(a)) for a in argv)
    if (n_first, ref_first) != (n_disjoint, ref_disjoint):
        print(f"not the same blocks: {n_first} vs {n_disjoint} blocks, {ref_first} vs {ref_disjoint} reference "
              "tokens (same seed and settings?)", file=sys.stderr)
        return 2
    keys = sorted(set(first) & set(disjoint))
    print(f"{len(keys)} prompts, {n_first} blocks in both")
    for rule, _ in RULES:
        for dataset in [*sorted({d for d, _ in keys}), "all"]:
            chosen = [k for k in keys if dataset in ("all", k[0])]
            a = np.array([first[k][rule] for k in chosen])
            b = np.array([disjoint[k][rule] for k in chosen])
            print(f"{rule:7s} {dataset:10s} n={len(chosen):2d} mean {a.mean():+.3f} / {b.mean():+.3f}  "
                  f"sd {a.std(ddof=1):.3f} / {b.std(ddof=1):.3f}  variance ratio {b.var(ddof=1) / a.var(ddof=1):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
