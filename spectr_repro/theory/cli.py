"""``python -m spectr_repro theory`` and ``python -m spectr_repro audit``.

theory: on a few seeded toy pairs, the exact E[tau] of every rule for K = 1..4, whether its per-iteration
law is valid as is, the LP limit of any valid rule, the paper's bound and GBV's value; GBV's whole-generation
tokens per call against BV's; and which of the paper's claimed properties hold. Writes THEORY.md,
theory.csv, generation.csv and theory.png under --out (default results/theory).

audit: the losslessness audit of every registered rule (spectr_repro.theory.audit), the release's arithmetic
of spectr_gbv, and the peers (transformers' assisted generation, spectr_repro.theory.peers). Writes AUDIT.md
and audit.json under --out (default results/audit).

The numbers and the claims come from spectr_repro.theory.claims, the markdown from theory.markdown, the
figure from theory.figure; this module parses arguments and writes the files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from spectr_repro import tracking
from spectr_repro.theory import audit as audit_mod
from spectr_repro.theory import decomposition, peers
from spectr_repro.theory.claims import (
    FULL_THEORY_TOYS,
    QUICK_THEORY_TOYS,
    generation_rows,
    property_checks,
    theory_rows,
)
from spectr_repro.theory.figure import write_figure
from spectr_repro.theory.gap import DEFAULT_MAX_TUPLES, gap_markdown, gap_rows, gap_toys
from spectr_repro.theory.markdown import audit_markdown, theory_markdown
from spectr_repro.verify import VERIFIERS


def main_theory(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro theory", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("--out", default="results/theory", help="output folder (default results/theory)")
    parser.add_argument("--quick", action="store_true", help="one small toy, K <= 3, N = 4 (for tests)")
    parser.add_argument("--max-k", type=int, default=None, help="largest K (default 4, quick 3)")
    parser.add_argument(
        "--generation-tokens",
        type=int,
        default=None,
        help="N for the whole-generation comparison (default 6, quick 4)",
    )
    parser.add_argument("--gap", action="store_true",
                        help="instead: the share of the SpecTr->LP gap of every lossless multi-draft rule on the "
                             "broad toy set (V 2-4, L 2-3, K 2-3, seeds 0-2), written to GAP.md and gap.csv")
    parser.add_argument("--decomposition", action="store_true",
                        help="instead: where the released SpecTr-GBV rule's bias comes from, one corrective step at a "
                             "time (exact TV and E[tau] on the audit's toys, K = 1..3), written to DECOMPOSITION.md "
                             "and decomposition.csv")
    parser.add_argument("--cache", default=None, help="--gap: JSON file caching exact values between runs")
    parser.add_argument("--max-tuples", type=int, default=DEFAULT_MAX_TUPLES,
                        help=f"--gap: skip toys with more draft tuples V^(K L) (default {DEFAULT_MAX_TUPLES})")
    tracking.add_logger_option(parser)
    args = parser.parse_args(list(argv or []))
    if args.gap:
        return _main_gap(args)
    if args.decomposition:
        return _main_decomposition(args)
    max_k = args.max_k if args.max_k is not None else (3 if args.quick else 4)
    N = args.generation_tokens if args.generation_tokens is not None else (4 if args.quick else 6)
    if not 1 <= max_k <= 6:
        print(f"error: --max-k must be in 1..6 (exact enumeration is V^(K L)), got {max_k}", file=sys.stderr)
        return 2
    if not 1 <= N <= 8:
        print(f"error: --generation-tokens must be in 1..8 (exact enumeration), got {N}", file=sys.stderr)
        return 2
    toys = QUICK_THEORY_TOYS if args.quick else FULL_THEORY_TOYS
    start = time.perf_counter()
    df = theory_rows(toys, list(range(1, max_k + 1)))
    gen = generation_rows(toys, N)
    checks = property_checks(df, gen)
    elapsed = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "theory.csv", index=False)
    gen.to_csv(out / "generation.csv", index=False)
    # The claims for REPORT.md's audit section (analysis reads files, never this package).
    pd.DataFrame(checks, columns=["claim", "verdict", "evidence"]).to_csv(out / "claims.csv", index=False)
    write_figure(df, out / "theory.png")
    (out / "THEORY.md").write_text(theory_markdown(df, gen, checks, elapsed, N))
    print(f"theory: wrote {out / 'THEORY.md'} ({elapsed:.0f} s)")
    tracking.log_command("theory", tracking.logger_config(args.logger), out, tables={
        "theory": df, "generation": gen, "claims": out / "claims.csv"}, images=[out / "theory.png"],
        config={"quick": args.quick, "max_K": max_k, "generation_tokens": N})
    return 0


def _main_gap(args) -> int:
    start = time.perf_counter()
    toys = gap_toys(seeds=(0,)) if args.quick else gap_toys()
    df = gap_rows(toys, cache=Path(args.cache) if args.cache else None, max_tuples=args.max_tuples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "gap.csv", index=False)
    (out / "GAP.md").write_text(gap_markdown(df) + f"\n{len(df)} toys listed in {time.perf_counter() - start:.0f} s.\n")
    print(f"theory: wrote {out / 'GAP.md'}")
    return 0


def _main_decomposition(args) -> int:
    start = time.perf_counter()
    toys = decomposition.QUICK_DECOMPOSITION_TOYS if args.quick else decomposition.DECOMPOSITION_TOYS
    max_k = args.max_k if args.max_k is not None else 3
    if not 1 <= max_k <= 3:
        print(f"error: --decomposition takes --max-k in 1..3 (exact enumeration), got {max_k}", file=sys.stderr)
        return 2
    n_tokens = 3
    df = decomposition.decomposition_rows(toys, list(range(1, max_k + 1)), n_tokens, progress=_decomposition_progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "decomposition.csv", index=False)
    (out / "DECOMPOSITION.md").write_text(
        "# Where the released SpecTr-GBV rule's bias comes from\n\n"
        + decomposition.decomposition_markdown(df, n_tokens)
        + f"\nGenerated by `python -m spectr_repro theory --decomposition` in {time.perf_counter() - start:.0f} s.\n")
    print(f"theory: wrote {out / 'DECOMPOSITION.md'}")
    return 0


def _decomposition_progress(row: dict) -> None:
    print(f"decomposition: {row['toy']} K={row['K']} {row['step']}: exact TV {row['exact_tv']:.2g}, "
          f"E[tau] {row['e_tau_first']:.4f} / {row['e_tau_second']:.4f}", flush=True)


def main_audit(argv: Sequence[str] | None = None) -> int:
    args = _audit_parser().parse_args(list(argv or []))
    rules = None if args.rules is None else [r.strip() for r in args.rules.split(",") if r.strip()]
    if rules is not None:
        unknown = [r for r in rules if r not in VERIFIERS]
        if unknown or not rules:
            print(f"error: unknown rules {unknown}; known: {', '.join(VERIFIERS)}", file=sys.stderr)
            return 2
    if not 1 <= args.tokens <= 5 or (args.samples is not None and args.samples < 0):
        print("error: --tokens must be in 1..5 and --samples >= 0", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows = audit_mod.run_audit(
        quick=args.quick,
        rules=rules,
        n_tokens=args.tokens,
        num_samples=args.samples,
        seed=args.seed,
        progress=_audit_progress,
    )
    peer_rows = [] if args.no_peers else _audit_peers(args.quick)
    elapsed = time.perf_counter() - start
    out = Path(args.out)
    _write_audit(out, rows, peer_rows, args.quick, elapsed)
    print(f"audit: wrote {out / 'AUDIT.md'} ({elapsed:.0f} s)")
    tracking.log_command("audit", tracking.logger_config(args.logger), out,
                         results=json.loads((out / "audit.json").read_text()), config=vars(args))
    return 0


def _audit_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro audit",
        description="losslessness audit of every registered verification rule",
    )
    parser.add_argument("--out", default="results/audit", help="output folder (default results/audit)")
    parser.add_argument("--quick", action="store_true", help="one small toy, 1,500 MC samples")
    parser.add_argument("--rules", default=None, help="comma list of rules (default: all registered)")
    parser.add_argument("--samples", type=int, default=None, help="MC samples (default 5,000; quick 1,500)")
    parser.add_argument("--tokens", type=int, default=3, help="decoded tokens in the joint law (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-peers", action="store_true",
                        help="skip the peer audit (transformers' assisted generation on a tiny Llama pair)")
    tracking.add_logger_option(parser)
    return parser


def _audit_progress(row) -> None:
    print(
        f"audit: {row.rule} K={row.K} {row.options or ''} exact TV {row.exact_tv:.1e} "
        f"p {row.p_value:.2g} -> {row.verdict} ({row.seconds:.1f} s)",
        flush=True,
    )


def _audit_peers(quick: bool) -> list:
    def peer_progress(row):
        print(f"audit: peer {row.setting}: MC p {row.p_value:.2g} -> {row.verdict} "
              f"{'; '.join(row.flags)} ({row.seconds:.1f} s)", flush=True)

    return peers.audit_peers(quick=quick, progress=peer_progress)


def _write_audit(out: Path, rows, peer_rows, quick: bool, elapsed: float) -> None:
    """audit.json and AUDIT.md under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "quick": quick,
        "seconds": elapsed,
        "exact_tv_threshold": audit_mod.EXACT_TV_THRESHOLD,
        "p_value_threshold": audit_mod.P_VALUE_THRESHOLD,
        "rows": [r.to_json() for r in rows],
        "peers": [r.to_json() for r in peer_rows],
    }
    (out / "audit.json").write_text(json.dumps(payload, indent=1, default=float))
    (out / "AUDIT.md").write_text(audit_markdown(rows, quick, elapsed, peer_rows))
