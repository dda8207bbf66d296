"""``python -m spectr_repro replay``: every rule, K and L judged on the blocks of one lossless trajectory.

    python -m spectr_repro replay K=1,3,5,7 L=6,12 dataset=humaneval,gsm8k num_prompts=16
    python -m spectr_repro replay experiment=cpu_quick          # the experiment's replay: block

Per prompt, the reference rule (``replay.reference``, lossless, at ``replay.reference_K`` x
``replay.reference_L``) advances one trajectory with the engine; every iteration drafts K_max x L_max
(the largest K and L asked, and the reference's) and scores them with one target call, and
:func:`spectr_repro.replay.block_estimates` asks every (method, K, L) what it would emit on that block.
The reference's text has the target's law (it is lossless), so the blocks are the contexts a lossless
decoder meets. Blocks are always drafted whole (L_max): a replay value is never truncated; the end of
the trajectory (max_new_tokens, EOS, a stop string) only decides how many blocks a prompt contributes.

Records: ``<output_dir>/<experiment>/replay/<group>/prompts/<index>/blocks.jsonl`` (one line per block, with its
``output_position``: the tokens generated before it; records written before 2026-12-03 lack it and the analysis sums
the earlier blocks' ``reference_tokens`` instead) and ``done.json`` (with the prompt's ``prompt_tokens``; written
last, with the sha256 and line count of blocks.jsonl); ``replay.json`` holds the group's settings. A prompt is a
unit of :mod:`spectr_repro.units` (state, claim, set aside under ``<group>/set_aside/``, never deleted): an
interrupted replay resumes with the prompts it had not finished, several runners over one folder replay each prompt
once, a damaged or partial prompt is named and replayed again. SIGTERM and SIGINT say what is kept and how to
resume; ``replay.budget_minutes`` stops the run at a batch boundary (exit 0, with the command that continues it): a
group's batch is priced by the plan (``replay.plan.batch_prices``) until this run has timed one. The summary
(``replay_summary.csv``, ``replay_differences.csv``) is rebuilt at the end from every finished prompt of the folders
(a larger num_prompts extends a replay in its folder: the seeded prompt selection keeps its first prompts).
Bad input: one message, exit 2, before any model loads (the checks of every command that loads models:
:func:`spectr_repro.launch.config.check_before_loading`, with the replay's num_prompts and L_max).

The replay of a batch of prompts (draft a block, evaluate every rule on it, let the reference continue, record it)
is :func:`spectr_repro.replay.trajectories.replay_prompts`; this module is the command around it: claims, batches,
the budget, the summaries (its arguments and the files each prompt leaves are :mod:`spectr_repro.replay.folders`).
Batched prompts (``replay.batch_prompts: B``, default 1): B > 1 replays up to B unfinished prompts of a group
together, each with exactly the seeds of the one-prompt path, so each prompt's blocks do not depend on its batch
mates; each prompt's files are written as at B = 1 (its ``done.json`` adds ``batch_prompts`` and ``batch_seconds``;
its ``seconds`` is the batch's share).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from spectr_repro import tracking
from spectr_repro.analysis.replay import write_summaries
from spectr_repro.data import encode_prompt
from spectr_repro.errors import ResourceError, exit_at_the_door
from spectr_repro.files import atomic_write_text
from spectr_repro.launch.claims import Runner
from spectr_repro.launch.config import UsageError, print_help_if_asked
from spectr_repro.launch.pairs import PairCache
from spectr_repro.launch.signals import Budget, Terminated, stop_name, stop_on_signals, stop_status
from spectr_repro.launch.stops import stop_checker
from spectr_repro.replay.core import recursion_room
from spectr_repro.replay.fingerprint import provenance
from spectr_repro.replay.folders import (
    BLOCKS_FILE,
    changed_settings,
    check_groups,
    parse,
    prompt_directory,
    prompt_finished,
    prompt_state,
    write_prompt,
)
from spectr_repro.replay.plan import batch_prices
from spectr_repro.replay.settings import GroupSettings
from spectr_repro.replay.trajectories import replay_prompts
from spectr_repro.units import SET_ASIDE, claim_unit

# --------------------------------------------------------------------------------------------------
# The command


@dataclass
class Progress:
    """What this run has done so far: what a stop by signal, or by the budget, reports."""

    planned: int = 0  # prompts of the command, every group
    computed: int = 0  # replayed and written by this run
    earlier: int = 0  # finished before this run (or by another runner)
    current: list[Path] = field(default_factory=list)  # the prompts being replayed (one batch)
    warned_unverified: set[Path] = field(default_factory=set)  # groups told once about their unverified prompts
    budget: Budget = field(default_factory=Budget)  # replay.budget_minutes

    def stopped_message(self, stop: BaseException, roots: Sequence[Path]) -> str:
        if len(self.current) > 1:
            dropped = (f"the {len(self.current)} prompts being replayed together ({', '.join(map(str, self.current))})"
                       f" were dropped and start over")
        elif self.current:
            dropped = f"the prompt being replayed ({self.current[0]}) was dropped and starts over"
        else:
            dropped = "no prompt was being replayed"
        left = max(self.planned - self.computed - self.earlier, 0)
        return (f"stopped by {stop_name(stop)}: kept {self.computed} prompt(s) replayed in this run and "
                f"{self.earlier} finished before, in {', '.join(map(str, roots))}; {dropped}; rerun the same "
                f"command to replay the {left} prompt(s) left.")

    def budget_message(self, groups: Sequence[GroupSettings], argv: Sequence[str]) -> str:
        """What a run stopped by its budget kept, counted on disk (groups it did not reach included)."""
        finished = sum(prompt_finished(prompt_directory(group.folder, index))
                       for group in groups for index in range(group.settings.num_prompts))
        return self.budget.message(self.computed, max(finished - self.computed, 0), max(self.planned - finished, 0),
                                   "prompt", "replay", argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        groups = parse(argv)
        check_groups(groups)
    except (UsageError, ResourceError) as error:  # bad input, or a dataset that cannot be read: before any model loads
        return exit_at_the_door(error)

    roots = list(dict.fromkeys(group.root for group in groups))
    progress = Progress(planned=sum(group.settings.num_prompts for group in groups),
                        budget=Budget(groups[0].settings.budget_minutes))
    if progress.budget.minutes is not None:  # a group's batches, priced before this run has timed one
        for folder, seconds in batch_prices(groups).items():
            progress.budget.expect(seconds, kind=folder)
    try:
        with stop_on_signals(), Runner() as runner, recursion_room(max(g.settings.L_max for g in groups)):
            pairs = PairCache(on_load=lambda name: runner.set_state("loading", name))
            for group in groups:
                _run_group(pairs, runner, group, progress)
                if progress.budget.stopped:
                    break
            pairs.release()
    except ResourceError as error:
        print(f"error: {error}\n(finished prompts are kept; fix the above and rerun the same command)",
              file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        print("\n" + progress.stopped_message(stop, roots), file=sys.stderr)
        return stop_status(stop)

    for root in roots:
        try:
            table = write_summaries(root)
        except OSError as error:
            print(f"error: cannot write the summary into {root}: {error}\n(finished prompts are kept; fix the "
                  f"above and rerun the same command)", file=sys.stderr)
            return 1
        print(table)
        tracking.log_command("replay", groups[0].logger, root.parent, tables={
            "summary": root / "replay_summary.csv", "differences": root / "replay_differences.csv"},
            config=tracking.top_level_config(group.meta() for group in groups if group.root == root))
    if progress.budget.stopped:
        print(progress.budget_message(groups, argv))
        return 0
    print(f"{progress.computed} prompt(s) replayed, {progress.earlier} finished earlier or elsewhere; "
          f"results in {', '.join(map(str, roots))}")
    return 0


def _run_group(pairs, runner, group: GroupSettings, progress: Progress) -> None:
    """Replay every prompt of one group not finished yet (counted in ``progress``), up to
    ``settings.batch_prompts`` claimed prompts at a time; before claiming a batch, stop if the budget is spent."""
    folder, settings = group.folder, group.settings
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "replay.json", json.dumps(group.meta(), indent=2) + "\n")
    except OSError as error:
        raise ResourceError(f"cannot write into {folder}: {error}") from error
    pair = pairs.pair(group.run)
    examples = pairs.examples(group.run, pair.tokenizer, settings.num_prompts)
    label = f"replay {group.dataset} T={group.temperature:g}"
    claimed: list[tuple[int, Any, Path]] = []  # (index, example, folder) claimed and not replayed yet
    with tqdm(total=len(examples), desc=label, unit="prompt", file=sys.stderr, dynamic_ncols=True) as bar:
        try:
            for index, example in enumerate(examples):
                directory = prompt_directory(folder, index)
                if not group.force and _finished(directory, folder, progress):
                    progress.earlier += 1
                    bar.update()
                    continue
                if not claimed and progress.budget.spent(kind=folder):
                    return  # before claiming the next batch: it would not fit
                if not _claim(runner, directory, folder, index, group.force, progress):
                    bar.update()
                    continue  # another live runner replays it, or has just finished it
                claimed.append((index, example, directory))
                if len(claimed) == settings.batch_prompts:
                    batch, claimed = claimed, []  # _replay_claimed releases the batch's claims
                    _replay_batch(pair, runner, group, batch, progress, bar)
            if claimed:  # the prompts left over: a last, shorter batch
                batch, claimed = claimed, []
                _replay_batch(pair, runner, group, batch, progress, bar)
        finally:
            _release(runner, claimed)  # claimed but not replayed (a stop, an error): free for the next run


def _claim(runner, directory: Path, folder: Path, index: int, force: bool, progress: Progress) -> bool:
    """Claim one prompt (:func:`spectr_repro.units.claim_unit`): True when this run replays it; a prompt another
    runner finished meanwhile counts as earlier; a damaged or partial one is named and its files set aside."""
    try:
        claimed = claim_unit(runner, directory, folder / SET_ASIDE, force=force, legacy=(BLOCKS_FILE,))
    except OSError as error:
        raise ResourceError(f"cannot write into {directory}: {error}") from error
    if claimed.status == "finished":
        progress.earlier += 1
    if claimed.moved is not None:
        tqdm.write(f"warning: {claimed.state.problem}; its files are set aside in {claimed.moved} and prompt {index} "
                   f"is replayed again", file=sys.stderr)
    return claimed.status == "claimed"


def _replay_batch(pair, runner, group: GroupSettings, batch: Sequence[tuple[int, Any, Path]], progress: Progress,
                  bar) -> None:
    """One batch of claimed prompts, timed for the budget."""
    with progress.budget.unit(kind=group.folder):  # a folder's batches cost alike (one dataset, one T)
        bar.set_postfix(blocks=_replay_claimed(pair, runner, group, batch, progress))
    bar.update(len(batch))


def _release(runner, claimed: Sequence[tuple[int, Any, Path]]) -> None:
    for _, _, directory in claimed:
        runner.release(directory)


def _replay_claimed(pair, runner, group: GroupSettings, claimed: Sequence[tuple[int, Any, Path]],
                    progress: Progress) -> int:
    """Replay and write the claimed prompts (one batch; a batch of one takes the one-prompt path) and release their
    claims, whatever happens. A prompt's files are written only once the whole batch is replayed: a stop before
    leaves none of its prompts written. Returns the blocks written."""
    written = 0
    try:
        progress.current = [directory for _, _, directory in claimed]
        inputs = [encode_prompt(pair.tokenizer, example)[0].tolist() for _, example, _ in claimed]
        stops = [stop_checker(pair.tokenizer, tuple(getattr(example, "stop_strings", ()) or ()))
                 for _, example, _ in claimed]
        seeds = [group.prompt_seed(index) for index, _, _ in claimed]
        results = replay_prompts(pair, inputs, group, seeds, stops)
        settings = group.settings
        recorded = {**provenance(settings.methods, settings.sampled, str(pair.device),
                                 str(pair.dtype).removeprefix("torch.")),
                    "batch": [index for index, _, _ in claimed],
                    "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        for (index, example, directory), input_ids, (blocks, summary) in zip(claimed, inputs, results):
            try:
                write_prompt(directory, blocks, {"prompt_id": str(example.id), "index": index,
                                                 "prompt_tokens": len(input_ids), **summary,
                                                 "support_mass": settings.support_mass, **recorded})
            except OSError as error:
                raise ResourceError(f"cannot write prompt {index} into {directory}: {error}") from error
            progress.computed += 1
            progress.current.remove(directory)
            written += summary["blocks"]
    finally:
        _release(runner, claimed)
    return written


def _finished(directory: Path, folder: Path, progress: Progress) -> bool:
    """Finished (verified or from before done.json vouched for its blocks: the latter said once per group)."""
    state = prompt_state(directory)
    if state.status == "unverified" and folder not in progress.warned_unverified:
        progress.warned_unverified.add(folder)
        tqdm.write(f"note: {folder} holds prompts replayed before done.json recorded their blocks' sha256: they "
                   f"are kept as finished, unverified", file=sys.stderr)
    return state.finished


__all__ = ["BLOCKS_FILE", "Progress", "changed_settings", "check_groups", "main", "parse", "prompt_directory",
           "prompt_finished", "prompt_state", "write_prompt"]
