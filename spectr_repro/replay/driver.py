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
``output_position``: the tokens generated before it; records written before 2026-12-03 lack it and the analysis
sums the earlier blocks' ``reference_tokens`` instead) and ``done.json`` (with the prompt's ``prompt_tokens``;
written last, with the sha256 and line count of blocks.jsonl); ``replay.json`` holds the group's settings. A prompt
is a unit of :mod:`spectr_repro.units` (state, claim, set aside under ``<group>/set_aside/``, never deleted): an
interrupted replay resumes with the prompts it had not finished, several runners over one folder replay each prompt
once, a damaged or partial prompt is named and replayed again. SIGTERM and SIGINT say what is kept and how to
resume; ``replay.budget_minutes`` stops the run at a batch boundary (exit 0, with the command that continues it).
The summary (``replay_summary.csv``, ``replay_differences.csv``) is rebuilt at the end from every finished prompt
of the folders (a larger num_prompts extends a replay in its folder: the seeded prompt selection keeps its first
prompts).
Bad input: one message, exit 2, before any model loads (the checks of every command that loads models:
:func:`spectr_repro.launch.config.check_before_loading`, with the replay's num_prompts and L_max).

The replay of a batch of prompts (draft a block, evaluate every rule on it, let the reference continue, record it)
is :func:`spectr_repro.replay.trajectories.replay_prompts`; this module is the command around it: arguments,
folders, claims, the files each prompt leaves. Batched prompts (``replay.batch_prompts: B``, default 1): B > 1
replays up to B unfinished prompts of a group together, each with exactly the seeds of the one-prompt path, so each
prompt's blocks do not depend on its batch mates; each prompt's files are written as at B = 1 (its ``done.json``
adds ``batch_prompts`` and ``batch_seconds``; its ``seconds`` is the batch's share).
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from spectr_repro import tracking
from spectr_repro.analysis.replay import write_summaries
from spectr_repro.data import encode_prompt
from spectr_repro.environment import device_name
from spectr_repro.errors import ResourceError, exit_at_the_door
from spectr_repro.files import atomic_write_text
from spectr_repro.launch.claims import Runner
from spectr_repro.launch.config import (
    Composer,
    UsageError,
    check_before_loading,
    check_writable,
    expand,
    parse_arguments,
    print_help_if_asked,
)
from spectr_repro.launch.pairs import PairCache
from spectr_repro.launch.signals import Budget, Terminated, stop_name, stop_on_signals, stop_status
from spectr_repro.launch.stops import stop_checker
from spectr_repro.replay.core import recursion_room
from spectr_repro.replay.fingerprint import provenance
from spectr_repro.replay.settings import GroupSettings, settings_of
from spectr_repro.replay.trajectories import replay_prompts
from spectr_repro.settings import run_config
from spectr_repro.units import SET_ASIDE, UnitState, claim_unit, unit_state, write_unit

GRID_KEYS = ("method", "K", "L")  # command-line keys that set the replay's grid, not one cell's value


# --------------------------------------------------------------------------------------------------
# Arguments


def _split_grid_arguments(argv: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    grid, rest = {}, []
    for argument in argv:
        key, equals, value = argument.lstrip("+").partition("=")
        if equals and key in GRID_KEYS:
            values = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
            if not values:
                raise UsageError(f"{key}= needs at least one value")
            grid[key] = values
        else:
            rest.append(argument)
    return grid, rest


def parse(argv: Sequence[str]) -> list[GroupSettings]:
    """The command's groups, typed: one per dataset x temperature x ... of the command."""
    grid, rest = _split_grid_arguments(argv)
    args = parse_arguments(rest)
    with Composer() as composer:
        cfgs = expand(composer, args, use_grid=False)
        replay = cfgs[0].get("replay") or {}
        extra = [f"{key}={','.join(str(v) for v in replay.get(listed))}"
                 for key, listed in (("dataset", "datasets"), ("temperature", "temperatures"))
                 if replay.get(listed) and key not in args.user_keys]  # the experiment's lists
        if extra:
            args = parse_arguments([*rest, *extra])
            cfgs = expand(composer, args, use_grid=False)
    groups = []
    for cfg in cfgs:
        run = run_config(cfg)
        groups.append(GroupSettings.of(run, settings_of(run, grid)))
    return groups


def check_groups(groups: Sequence[GroupSettings]) -> None:
    """Everything the replay can be refused for, before any model loads: the checks every command shares (dataset
    size at replay.num_prompts, hardware, the block L_max every prompt drafts), writable folders, and a group
    folder holding other settings."""
    settings = [group.settings for group in groups]
    lengths = [s.L_max for s in settings]
    longest = settings[max(range(len(groups)), key=lambda i: lengths[i])]
    key = "L" if max(longest.L_values) >= longest.reference_L else "replay.reference_L"
    check_before_loading([group.run for group in groups], num_prompts=[s.num_prompts for s in settings],
                         block_L=lengths, L_key=key, rows=[s.K_max for s in settings],
                         batches=[(s.batch_prompts, "replay.batch_prompts") for s in settings])
    for group in groups:
        check_writable(group.output_dir, [group.root, group.folder])
        _check_group_folder(group.folder, group.meta(), group.force)


# --------------------------------------------------------------------------------------------------
# Folders


def changed_settings(folder: Path, meta: dict[str, Any]) -> list[str]:
    """The settings (keys of ``GroupSettings.meta``) in which the replay held in ``folder`` differs from ``meta``,
    num_prompts aside (a larger one extends it); [] for a folder without a replay yet. UsageError naming the
    file when replay.json cannot be read."""
    path = folder / "replay.json"
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path} cannot be read ({type(error).__name__}: {error}): move it aside to start this "
                         f"replay over, or use another experiment=") from None
    if not isinstance(old, dict):
        raise UsageError(f"{path} is not a replay's settings (a JSON object): move it aside, or use another "
                         f"experiment=")
    return [key for key in meta if key != "num_prompts" and old.get(key) != meta[key]
            # rules added (registered after the replay began) join it on the prompts replayed from now on
            and not (key == "methods" and isinstance(old.get(key), list) and set(old[key]) <= set(meta[key]))]


def _check_group_folder(folder: Path, meta: dict[str, Any], force: bool) -> None:
    """A folder holds one grid: a rerun with another grid is refused unless force=true (which restarts it)."""
    if not force:
        changed = changed_settings(folder, meta)
        if changed:
            raise UsageError(f"{folder} holds a replay with other settings ({', '.join(changed)}): rerun with "
                             f"the same ones to resume, force=true to start it over, or another experiment=")


def prompt_directory(folder: Path, index: int) -> Path:
    """The records of prompt ``index`` (its place in the seeded selection) of the group in ``folder``."""
    return folder / "prompts" / f"{index:04d}"


BLOCKS_FILE = "blocks.jsonl"


def prompt_state(directory: Path) -> UnitState:
    """Read and check one prompt folder (:func:`spectr_repro.units.unit_state`, never raising for bad content): a
    done.json written before 2026-12-03, without the blocks' sha256, beside its blocks.jsonl is ``unverified``
    (counted as finished)."""
    return unit_state(directory, legacy=(BLOCKS_FILE,))


def prompt_finished(directory: Path) -> bool:
    return prompt_state(directory).finished


def write_prompt(directory: Path, blocks: Sequence[dict[str, Any]], done: dict[str, Any]) -> None:
    """A prompt's block lines, then ``done.json`` (last: the prompt is finished once it exists), which records
    the blocks' sha256 and line count (:func:`spectr_repro.units.write_unit`)."""
    write_unit(directory, {BLOCKS_FILE: "".join(json.dumps(b) + "\n" for b in blocks)}, done)


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
    progress.budget.expect(recorded_batch_seconds(folder, settings.num_prompts, settings.batch_prompts, group.device,
                                                  group.run.hardware.dtype), kind=folder)
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


def recorded_batch_seconds(folder: Path, prompts: int, batch_prompts: int, device: str, dtype: str) -> float | None:
    """The median wall time of the folder's finished batches of ``batch_prompts`` prompts replayed on this device's
    model in ``dtype``: what the budget expects a batch of this folder to take before this run has timed one
    (a T = 0.7 batch takes several times a T = 0.1 one). None when there is none."""
    here, batches = device_name(device), {}
    for index in range(prompts):
        done = prompt_state(prompt_directory(folder, index)).done or {}
        recorded = done.get("environment") or {}
        seconds = done.get("batch_seconds" if batch_prompts > 1 else "seconds")
        if (int(done.get("batch_prompts", 1)) == batch_prompts and seconds is not None
                and recorded.get("device_name") == here and recorded.get("dtype") == dtype):
            batches[tuple(done.get("batch", [index]))] = float(seconds)
    return statistics.median(batches.values()) if batches else None


def _finished(directory: Path, folder: Path, progress: Progress) -> bool:
    """Finished (verified or from before done.json vouched for its blocks: the latter said once per group)."""
    state = prompt_state(directory)
    if state.status == "unverified" and folder not in progress.warned_unverified:
        progress.warned_unverified.add(folder)
        tqdm.write(f"note: {folder} holds prompts replayed before done.json recorded their blocks' sha256: they "
                   f"are kept as finished, unverified", file=sys.stderr)
    return state.finished


__all__ = ["BLOCKS_FILE", "Progress", "changed_settings", "check_groups", "main", "parse", "prompt_directory",
           "prompt_finished", "prompt_state", "recorded_batch_seconds", "write_prompt"]
