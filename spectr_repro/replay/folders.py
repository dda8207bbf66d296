"""A replay's arguments and folders: the groups a command line names (typed, checked before any model loads), and
the files each group and prompt leaves (``replay.json``; ``prompts/<index>/blocks.jsonl`` and ``done.json``, a unit
of :mod:`spectr_repro.units`). The replay command (``replay.driver``), its plan (``replay.plan``), the seal and the
spot check read them here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spectr_repro.launch.config import (
    Composer,
    UsageError,
    check_before_loading,
    check_writable,
    expand,
    parse_arguments,
)
from spectr_repro.replay.settings import GroupSettings, settings_of
from spectr_repro.settings import run_config
from spectr_repro.units import UnitState, unit_state, write_unit

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
