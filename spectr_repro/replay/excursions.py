"""``python -m spectr_repro excursions``: how often the released SpecTr-GBV rule's h leaves [0, 1] on real blocks
(docs/theory.md, "Where h leaves [0, 1] on real blocks").

    python -m spectr_repro excursions model_pair=qwen25coder_1.5b_0.5b temperature=0.4,0.7 K=3,7 L=6,12 \
        num_prompts=2 max_new_tokens=48 [--arithmetic release_bf16] [--out FILE] [--seconds S]

(``python -m spectr_repro.replay.excursions ...`` is the same command.) The blocks are the replay's
(``replay.driver``): per prompt and temperature the lossless reference rule (``replay.reference``, default sbv at
reference_K x reference_L) advances one trajectory with the engine, and every iteration drafts K_max x L_max tokens
scored by one target call. On each block, every (K, L) of the grid takes the block's first K drafts and first L
positions and lists the slots where ``SpecTrGBV(arithmetic=...).h_excursions`` finds h outside [0, 1] (beyond 1e-9):
every prefix of every draft, whether the scan reaches it or not. Slots whose h is 0/0 in exact arithmetic (round-off
decides their value, and their test cannot change the outcome) are counted apart. Prints one line per (K, L, T),
writes them as CSV to --out (default: none; rewritten after every trajectory, so a cut-off keeps what was counted)
and logs them to W&B like every command (table ``excursions/counts``, the shares of slots and blocks outside
[0, 1] per (T, K, L); run folder ``<output_dir>/<experiment>/wandb/``; ``logger=disabled`` logs nothing). A count,
not a timing. Bad input: one message, exit 2, before any model loads, nothing written.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from spectr_repro import tracking
from spectr_repro.data import encode_prompt
from spectr_repro.engine.loop import generate
from spectr_repro.errors import ResourceError, exit_at_the_door
from spectr_repro.launch.config import (
    UsageError,
    check_before_loading,
    check_file_writable,
    check_writable,
    print_help_if_asked,
)
from spectr_repro.launch.pairs import PairCache
from spectr_repro.replay.folders import parse as replay_groups
from spectr_repro.replay.settings import GroupSettings
from spectr_repro.verify import Verifier, get_verifier
from spectr_repro.verify.spectr_gbv import ARITHMETICS, SpecTrGBV

__all__ = ["ExcursionCount", "ExcursionRecorder", "block_excursions", "count_rows", "count_trajectories", "main",
           "parse", "tracking_folder"]


@dataclass
class ExcursionCount:
    """Counts over the blocks of one (K, L, T)."""

    blocks: int = 0
    slots: int = 0  # K L test slots per block
    blocks_outside: int = 0  # blocks with a defined h outside [0, 1]
    slots_outside: int = 0
    slots_undefined: int = 0  # 0/0 slots whose rounded h falls outside [0, 1]
    h_min: float = 0.0  # over the defined excursions (0 and 1 when there are none)
    h_max: float = 1.0
    nan: int = 0  # defined slots whose h is NaN

    def add(self, K: int, L: int, defined: list[tuple[int, int, float]], every: list[tuple[int, int, float]]) -> None:
        self.blocks += 1
        self.slots += K * L
        self.blocks_outside += bool(defined)
        self.slots_outside += len(defined)
        self.slots_undefined += len(every) - len(defined)
        for _, _, h in defined:
            if math.isnan(h):
                self.nan += 1
            else:
                self.h_min, self.h_max = min(self.h_min, h), max(self.h_max, h)


def block_excursions(rule: SpecTrGBV, draft_tokens, draft_probs, target_probs, K: int, L: int
                     ) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]]]:
    """(defined excursions, every excursion 0/0 slots included) of the sub-block of the first K drafts and L
    positions (``SpecTrGBV.h_excursions``)."""
    args = (draft_tokens[:K, :L], draft_probs[:K, :L], target_probs[:K, :L + 1])
    return rule.h_excursions(*args), rule.h_excursions(*args, undefined=True)


class ExcursionRecorder(Verifier):
    """The replay's reference rule on the first reference_K x reference_L of each block, after counting the
    excursions of every (K, L) of the grid on the block. Not lossless for the engine, so that each block is drafted
    whole (K_max x L_max); the text it emits is the reference's (lossless)."""

    name = "h_excursions"
    lossless = False

    def __init__(self, K_values: Sequence[int], L_values: Sequence[int], reference: str = "sbv",
                 reference_K: int = 3, reference_L: int = 6, arithmetic: str = "release_bf16") -> None:
        super().__init__(check_inputs=False)
        self.K_values, self.L_values = tuple(K_values), tuple(L_values)
        self.reference_K, self.reference_L = reference_K, reference_L
        self.rule = SpecTrGBV(arithmetic=arithmetic, check_inputs=False)
        self.reference_rule = get_verifier(reference, check_inputs=False)
        self.counts: dict[tuple[int, int], ExcursionCount] = {}

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        for K in self.K_values:
            for L in self.L_values:
                defined, every = block_excursions(self.rule, draft_tokens, draft_probs, target_probs, K, L)
                self.counts.setdefault((K, L), ExcursionCount()).add(K, L, defined, every)
        K, L = self.reference_K, self.reference_L
        return self.reference_rule(draft_tokens[:K, :L], draft_probs[:K, :L], target_probs[:K, :L + 1],
                                   generator=generator, state=state)


def count_rows(recorders: Sequence[tuple[float, ExcursionRecorder]]) -> pd.DataFrame:
    """One row per (K, L, T): the counts of every recorder of temperature T, summed."""
    rows: dict[tuple, ExcursionCount] = {}
    for temperature, recorder in recorders:
        for (K, L), count in recorder.counts.items():
            total = rows.setdefault((K, L, temperature), ExcursionCount())
            total.blocks += count.blocks
            total.slots += count.slots
            total.blocks_outside += count.blocks_outside
            total.slots_outside += count.slots_outside
            total.slots_undefined += count.slots_undefined
            total.nan += count.nan
            total.h_min, total.h_max = min(total.h_min, count.h_min), max(total.h_max, count.h_max)
    return pd.DataFrame([{"K": K, "L": L, "T": T, **vars(count)} for (K, L, T), count in sorted(rows.items())])


class _Parser(argparse.ArgumentParser):
    """argparse whose refusals are a UsageError (one message, exit 2 from ``main``), not its usage text and exit."""

    def error(self, message: str):
        raise UsageError(message)


def _arguments(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(this command's options, the Hydra overrides left for ``replay.folders.parse``)."""
    parser = _Parser(prog="python -m spectr_repro excursions", add_help=False)
    parser.add_argument("--arithmetic", default="release_bf16", help="spectr_gbv's arithmetic (default release_bf16)")
    parser.add_argument("--out", default=None, help="CSV file for the counts (default: print only)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop starting new trajectories after this many seconds (counts so far are kept)")
    args, rest = parser.parse_known_args(list(argv))
    if args.arithmetic not in ARITHMETICS:
        raise UsageError(f"--arithmetic must be one of {', '.join(ARITHMETICS)}, got {args.arithmetic!r}")
    if args.seconds is not None and not args.seconds > 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    return args, rest


def tracking_folder(group: GroupSettings) -> Path:
    """Where the W&B run goes (under ``wandb/``): the experiment's results folder, as for replay and bias."""
    return group.output_dir.expanduser() / group.experiment


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[GroupSettings]]:
    """(options, one group per temperature x dataset), every check done before any model loads: UsageError with one
    message."""
    args, rest = _arguments(argv)
    groups = replay_groups([*rest, "method=spectr_gbv"])
    settings = [group.settings for group in groups]
    check_before_loading([group.run for group in groups], num_prompts=[s.num_prompts for s in settings],
                         block_L=[s.L_max for s in settings], rows=[s.K_max for s in settings])
    if args.out is not None:
        check_file_writable(args.out, "--out")
    for group in groups:
        if tracking.enabled(group.logger):
            check_writable(group.output_dir, [tracking_folder(group)])
    return args, groups


def count_trajectories(groups: Sequence[GroupSettings], arithmetic: str,
                       seconds: float | None = None, out: str | None = None) -> pd.DataFrame:
    """Drive every (prompt, temperature) trajectory and count its blocks' excursions (``count_rows``)."""
    start, recorders, pairs = time.perf_counter(), [], PairCache()
    planned = sum(group.settings.num_prompts for group in groups)
    with tqdm(total=planned, desc="excursions", unit="trajectory", file=sys.stderr, dynamic_ncols=True) as bar:
        # prompt by prompt, every temperature of a prompt before the next prompt: a cut-off (--seconds) keeps every T
        for index in range(max(group.settings.num_prompts for group in groups)):
            for group in groups:
                settings = group.settings
                if index >= settings.num_prompts:
                    continue
                if seconds is not None and time.perf_counter() - start > seconds:
                    bar.update()  # skipped: out of time
                    continue
                pair = pairs.pair(group.run)
                example = pairs.examples(group.run, pair.tokenizer)[index]
                recorder = ExcursionRecorder(settings.K_values, settings.L_values, settings.reference,
                                             settings.reference_K, settings.reference_L, arithmetic)
                generate(pair.target, pair.draft, encode_prompt(pair.tokenizer, example)[0].tolist(),
                         method=recorder, K=settings.K_max, L=settings.L_max, temperature=group.temperature,
                         max_new_tokens=group.max_new_tokens, seed=group.prompt_seed(index),
                         eos_token_ids=pair.eos_token_ids, vocab_size=pair.vocab_size)
                recorders.append((group.temperature, recorder))
                bar.set_postfix(prompt=index, T=f"{group.temperature:g}",
                                blocks=next(iter(recorder.counts.values())).blocks)
                bar.update()
                if out:  # after every trajectory: an interrupted run keeps what it counted
                    count_rows(recorders).to_csv(out, index=False)
    return count_rows(recorders)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        args, groups = parse(argv)
    except (UsageError, ResourceError) as error:  # bad input, or a dataset that cannot be read: before any model loads
        return exit_at_the_door(error)
    counts = count_trajectories(groups, args.arithmetic, args.seconds, args.out)
    print(counts.to_string(index=False))
    tracking.log_command("excursions", groups[0].logger, tracking_folder(groups[0]), tables={"counts": counts},
                         config={**tracking.top_level_config(group.meta() for group in groups),
                                 "arithmetic": args.arithmetic, "seconds": args.seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
