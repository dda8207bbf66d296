"""Hydra composition for the CLI: parse overrides, expand sweeps into cells, validate.

Every command that runs models composes ``conf/config.yaml`` here with Hydra's compose API (version_base 1.3), so
that ``run`` and ``sweep`` are ordinary commands that run every cell in ONE process (models loaded once). A sweep
is the cartesian product of

- the comma lists / ranges given on the command line (``K=1,3 method=sd,spectr``), and
- the selected experiment's ``grid`` for every axis the command line does not set (a mapping
  key -> list, or a list of such mappings whose cells are unioned).

Bad input raises :class:`UsageError` (one message; the CLI prints it and exits with status 2).
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from spectr_repro import conf as _conf
from spectr_repro.data import get_dataset
from spectr_repro.errors import ResourceError, UsageError
from spectr_repro.models.offline import models_dir
from spectr_repro.settings import RunConfig, run_config
from spectr_repro.verify import VERIFIERS, multi_draft_methods

# Groups that hold a choice; their options are the yaml files in conf/<group>/.
GROUPS = ("method", "model_pair", "dataset", "experiment", "hardware", "logger")



def conf_dir() -> Path:
    """The Hydra config folder (``spectr_repro.conf``; SPECTR_REPRO_CONF overrides), as a UsageError."""
    try:
        return _conf.conf_dir()
    except _conf.ConfigFolderError as error:
        raise UsageError(str(error)) from None


def group_options(group: str) -> list[str]:
    conf_dir()  # a missing config folder is a UsageError, not an empty list
    return _conf.group_options(group)


# --------------------------------------------------------------------------------------------------
# Overrides


@dataclass(frozen=True)
class ParsedArgs:
    fixed: tuple[str, ...]  # overrides with one value, as typed (normalised)
    sweeps: tuple[tuple[str, tuple[str, ...]], ...]  # (key as typed, value strings) per sweep override
    user_keys: frozenset[str]  # keys/groups set on the command line
    launcher_overrides: tuple[str, ...]  # hydra/launcher=..., hydra.launcher.* (SLURM path)


def _normalise(argument: str) -> str:
    # `make reproduce` and Hydra habits write +experiment=X; experiment is in the defaults list already.
    if argument.startswith("+experiment="):
        return argument[1:]
    if argument.startswith("--force"):
        return "force=true"
    return argument


# Nested keys that may be added with `+` (open mappings checked by the method / dataset themselves).
OPEN_MAPPINGS = ("method.options", "dataset.options")


def schema_keys() -> list[str]:
    """The top-level keys a command line may set: config.yaml's keys and the config groups."""
    root = OmegaConf.load(conf_dir() / "config.yaml")
    return sorted({str(key) for key in root if key not in ("defaults", "hydra")} | set(GROUPS))


def _unknown_key_message(key: str, known: Sequence[str], where: str = "the config") -> str:
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return f"unknown key {key!r}: not in {where}.{hint} Known keys: {', '.join(known)}"


def check_top_level_keys(overrides) -> None:
    """Refuse overrides of keys the config does not have, `+` or not (Hydra would add `+key` silently)."""
    known = schema_keys()
    for override in overrides:
        key = override.key_or_group
        top = key.split(".", 1)[0].split("/", 1)[0]
        if top in ("hydra",) or top in known:
            continue
        raise UsageError(_unknown_key_message(top, known))


def check_nested_keys(cfg: DictConfig, keys: Iterable[str]) -> None:
    """Refuse ``group.key`` overrides that name no existing key (outside the open option mappings)."""
    missing = object()
    for key in keys:
        if "." not in key or key.startswith("hydra.") or key.startswith(OPEN_MAPPINGS):
            continue
        if OmegaConf.select(cfg, key, default=missing) is missing:
            parent_key = key.rsplit(".", 1)[0]
            parent = OmegaConf.select(cfg, parent_key, default=None)
            siblings = [str(k) for k in parent] if isinstance(parent, DictConfig) else []
            raise UsageError(_unknown_key_message(key.rsplit(".", 1)[1], siblings, f"{parent_key}")
                             .replace(f"unknown key {key.rsplit('.', 1)[1]!r}", f"unknown key {key!r}"))


def print_help_if_asked(argv: Sequence[str], doc: str | None) -> bool:
    """The commands' shared opening: ``-h``/``--help`` anywhere prints the command's docstring (True: exit 0)."""
    if any(a in ("-h", "--help") for a in argv):
        print(doc)
        return True
    return False


def parse_arguments(arguments: Sequence[str]) -> ParsedArgs:
    """Parse Hydra overrides; check group options before composing (clear 'did you mean')."""
    lines = [_normalise(a) for a in arguments]
    for line in lines:
        if line.startswith("-"):
            raise UsageError(f"unknown option {line!r}; use key=value overrides (see --help)")
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
    except HydraException as error:
        raise UsageError(f"cannot parse the overrides: {_one_line(error)}") from None

    check_top_level_keys(parsed)
    known = schema_keys()
    # `+known=value` on a key the config has: the user meant to set it (Hydra would refuse to add it).
    lines = [line.lstrip("+") if override.is_add() and "." not in override.key_or_group
             and override.key_or_group in known else line for override, line in zip(parsed, lines)]
    # A key given twice: the last one wins (as in Hydra), also between a list and a single value.
    last = {o.key_or_group: index for index, o in enumerate(parsed)}
    fixed, sweeps, launcher, keys = [], [], [], set()
    for index, (override, line) in enumerate(zip(parsed, lines)):
        key = override.key_or_group
        if last[key] != index:
            continue
        if key.startswith("hydra/") or key.startswith("hydra."):
            launcher.append(line)
            continue
        keys.add(key)
        if override.is_sweep_override():
            try:
                values = tuple(override.sweep_string_iterator())
            except Exception as error:  # glob sweeps and the like
                raise UsageError(f"unsupported sweep {line!r}: {_one_line(error)}") from None
            if key == "experiment":
                raise UsageError("sweep one experiment at a time (got experiment=" + ",".join(values) + ")")
            _check_group_values(key, values)
            element = override.get_key_element()
            sweeps.append((element.lstrip("+") if "." not in key and key in known else element, values))
        else:
            if key in GROUPS and override.value() is not None:
                _check_group_values(key, (override.get_value_element_as_str(),))
            fixed.append(line)
    return ParsedArgs(tuple(fixed), tuple(sweeps), frozenset(keys), tuple(launcher))


def _check_group_values(group: str, values: Iterable[str]) -> None:
    if group not in GROUPS:
        return
    options = group_options(group)
    for value in values:
        if value in options or value == "null":
            continue
        close = difflib.get_close_matches(value, options, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise UsageError(f"unknown {group} {value!r}.{hint} Available: {', '.join(options)}")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


# --------------------------------------------------------------------------------------------------
# Composition


class Composer:
    """A Hydra compose session over conf/ (use as a context manager)."""

    def __enter__(self) -> Composer:
        self._context = hydra.initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3",
                                              job_name="spectr_repro")
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)

    def compose(self, overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
        """Compose the config; ``choices`` (group -> option) is stored under the key ``choices``."""
        try:
            cfg = hydra.compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as error:
            raise UsageError(_one_line(error)) from None
        choices = {group: cfg.hydra.runtime.choices.get(group) for group in GROUPS}
        with open_dict(cfg):
            if not with_hydra:
                del cfg["hydra"]
            cfg["choices"] = choices
        return cfg


def grid_axes(grid, user_keys: frozenset[str]) -> list[list[tuple[str, tuple[str, ...]]]]:
    """The experiment grid as sub-grids of (key, value strings), minus the axes the user set."""
    if grid is None:
        return [[]]
    subgrids = list(grid) if isinstance(grid, ListConfig | list) else [grid]
    result = []
    for subgrid in subgrids:
        if not isinstance(subgrid, DictConfig | dict):
            raise UsageError(f"experiment grid entries must be mappings key -> list, got {subgrid!r}")
        axes = []
        for key, values in subgrid.items():
            if key in user_keys:
                continue
            values = list(values) if isinstance(values, ListConfig | list) else [values]
            axes.append((str(key), tuple(_value_string(v) for v in values)))
        result.append(axes)
    return result


def _value_string(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def expand(composer: Composer, args: ParsedArgs, use_grid: bool) -> list[DictConfig]:
    """Every cell config of the command (duplicates removed, in grid order).

    Hydra composes once per distinct choice of config groups; plain keys of a sweep (K, L, ...)
    are then set on a copy, exactly as a command-line override would set them (composing every
    cell from scratch costs ~0.3 s each, too slow for grids of hundreds of cells).
    """
    parser = OverridesParser.create()
    # Dotted keys are checked against the config composed without them (a `+group.key` would add itself).
    nested = [key.lstrip("+~") for key in args.user_keys if "." in key]
    if nested:
        plain = [line for line in args.fixed if "." not in line.split("=", 1)[0]]
        check_nested_keys(composer.compose(plain), nested)
    base = composer.compose(args.fixed)
    subgrids = grid_axes(base.get("grid"), args.user_keys) if use_grid else [[]]
    composed: dict[tuple[str, ...], DictConfig] = {(): base}
    cells, seen = [], set()
    for axes in subgrids:
        all_axes = list(args.sweeps) + axes
        for picks in itertools.product(*(values for _, values in all_axes)):
            group_overrides, key_overrides = [], []
            for (key, _), value in zip(all_axes, picks):
                override = parser.parse_override(f"{key}={value}")
                if override.key_or_group in GROUPS or override.is_add() or override.is_delete():
                    group_overrides.append(f"{key}={value}")
                else:
                    key_overrides.append((override.key_or_group, override.value()))
            signature_groups = tuple(group_overrides)
            if signature_groups not in composed:
                composed[signature_groups] = composer.compose(list(args.fixed) + group_overrides)
            cfg = composed[signature_groups]
            if key_overrides:
                cfg = copy.deepcopy(cfg)
                for key, value in key_overrides:
                    try:
                        OmegaConf.update(cfg, key, value, merge=True)
                    except Exception as error:
                        raise UsageError(f"could not set {key}={value}: {_one_line(error)}") from None
            signature = OmegaConf.to_yaml(cfg)
            if signature not in seen:
                seen.add(signature)
                cells.append(cfg)
    return cells


# --------------------------------------------------------------------------------------------------
# Validation


def needs_single_draft(run: RunConfig) -> bool:
    return run.method in VERIFIERS and VERIFIERS[run.method].single_draft and run.K != 1


def single_draft_message(run: RunConfig) -> str:
    return (f"method {run.method} verifies a single draft (K=1), got K={run.K}: its rule is defined for one "
            f"draft only. Use K=1, or a multi-draft method ({', '.join(multi_draft_methods())}).")


def check_writable(output_dir: str, folders: Iterable[str | Path] = ()) -> Path:
    """The output folder and every folder the run will write below it must be creatable and writable.

    For each folder: if it exists it must be a writable directory, else its nearest existing ancestor
    must be. Checked without writing anything (``os.access``).
    """
    path = Path(output_dir).expanduser().resolve()
    for folder in [path, *(Path(f).expanduser().resolve() for f in folders)]:
        probe = folder
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        what = "output_dir" if folder == path else "folder"
        shown = output_dir if folder == path else str(folder)
        if not probe.is_dir():
            raise UsageError(f"{what} {shown!r} is not writable: {probe} is not a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise UsageError(f"{what} {shown!r} is not writable (no write permission on {probe})")
    return path


def check_file_writable(path: str | Path, option: str) -> Path:
    """An output file the command will write: its folder must be writable (:func:`check_writable`) and the file must
    be creatable there. ``os.access`` says yes to root everywhere, and a folder such as /proc takes no new file, so
    the file is created (exclusively) and removed at once: nothing is left behind. UsageError naming ``option``."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UsageError(f"{option} {path} is a folder: name a file")
    try:
        check_writable(str(out.parent))
        if out.exists():
            with open(out, "a", encoding="utf-8"):
                pass
        else:
            os.close(os.open(out, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            out.unlink()
    except UsageError as error:
        raise UsageError(f"{option} {path} cannot be written: {error}") from None
    except OSError as error:
        raise UsageError(f"{option} {path} cannot be written: {error.strerror or error}") from None
    return out


def check_device(device, instead: str = "hardware=cpu") -> None:
    """hardware=cuda on a machine without a visible GPU: say so before loading anything (``instead``: the option
    that picks the CPU in the command's own syntax)."""
    if device and str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"hardware device {device!r} but no CUDA device is visible to torch "
                             f"({torch.__version__}); use {instead}")


def context_window(pair_values: dict | None) -> tuple[int, str] | None:
    """(positions, which model) of the pair's shorter context window (``max_position_embeddings``), read from
    its config files without loading a weight (``pair_values``: the ``model_pair`` node resolved); None when no
    config is here yet (a hub pair not downloaded)."""
    pair = dict(pair_values or {})
    if pair.get("source") == "tiny":
        from spectr_repro.models.tiny import tiny_config  # transformers (~1 s): refusals exit first

        return int(tiny_config(1).max_position_embeddings), "the tiny pair's models"
    windows = []
    for role in ("target", "draft"):
        size = _max_positions(pair, role)
        if size is None:
            return None
        windows.append((size, f"the {role} ({(pair.get(role) or {}).get('hub_id') or role})"))
    return min(windows)


def _max_positions(pair: dict, role: str) -> int | None:
    spec = pair.get(role) or {}
    path = None
    if pair.get("source") == "offline" and spec.get("offline"):
        path = models_dir() / str(spec["offline"]) / "config.json"
    elif spec.get("hub_id"):
        from huggingface_hub import try_to_load_from_cache  # hub/datasets: only a download pays

        cached = try_to_load_from_cache(str(spec["hub_id"]), "config.json", revision=spec.get("revision"))
        path = Path(cached) if isinstance(cached, str) else None
    if path is None or not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError):
        return None  # a damaged config is the loader's to report (one message, exit 1)
    return int(value) if isinstance(value, int) and value > 0 else None


def check_block_fits(run: RunConfig, block_L: int, key: str = "L") -> None:
    """A block of ``block_L`` drafted tokens needs at least one context token before it and must fit in the pair's
    context window: refuse an L no block of this pair can hold, with the bound (before any model loads)."""
    window = context_window(run.pair_values)
    if window is not None and block_L > window[0] - 1:
        size, which = window
        raise UsageError(f"{key}={block_L} cannot fit in a block of model pair {run.model_pair}: "
                         f"the context window of {which} is {size} positions (max_position_embeddings), a block "
                         f"needs L + 1 (its drafts after at least one context token); use {key} <= {size - 1}")


def check_dataset_sizes(wanted: Iterable[tuple[RunConfig, int]]) -> None:
    """UsageError when a config asks for more prompts than its dataset has (``wanted``: (run, num_prompts));
    ResourceError (exit 1) when a dataset cannot be read at all (no data folder, damaged file, hub offline).

    Reading a dataset's records needs no tokenizer (prompts are formatted later), so both are found before any
    model loads (a missing dataset once surfaced only after the Qwen pair's 4 GB had loaded)."""
    largest: dict[str, tuple[dict, int]] = {}
    for run, num_prompts in wanted:
        dataset = run.dataset_values
        key = repr(sorted(dataset.items()))
        largest[key] = (dataset, max(largest.get(key, (dataset, 0))[1], int(num_prompts)))
    for dataset, num_prompts in largest.values():
        try:
            records = get_dataset(dataset["name"]).load_records(**dict(dataset.get("options") or {}))
        except (ValueError, OSError, ImportError) as error:  # the message the run would give, before loading
            raise ResourceError(f"cannot load dataset {dataset['name']}: {error}") from error
        if num_prompts > len(records):
            raise UsageError(f"num_prompts={num_prompts} but dataset {dataset['name']} has only {len(records)} "
                             f"records; use num_prompts <= {len(records)}")


def check_before_loading(runs: Sequence[RunConfig], num_prompts: Sequence[int] | None = None,
                         block_L: Sequence[int] | None = None, L_key: str = "L",
                         rows: Sequence[int] | None = None,
                         batches: Sequence[tuple[int, str]] | None = None) -> None:
    """The one validation of every command that loads models (run, sweep, replay, bias, check, bench), after each
    config was read at its door (:func:`spectr_repro.settings.run_config`: its values): its device, its dataset's
    size and the block length it drafts, as UsageError (one message; the command exits 2) before any model loads.

    ``num_prompts[i]``/``block_L[i]``/``rows[i]``: what config i really asks (a replay's replay.num_prompts, L_max
    and K_max); by default its num_prompts, min(L, max_new_tokens) (a cell's blocks never run past max_new_tokens)
    and K. A long-input bucket (a dataset config that fixes its prompt length) must also fit the pair's context
    window and the device's memory (:func:`spectr_repro.launch.fit.check_context_fits`), and prompts decoded
    ``batches[i]`` = (B, its setting's name) at a time (default ``hardware.batch_prompts``) the device's memory
    (:func:`spectr_repro.launch.fit.check_batch_fits`)."""
    # launch.fit pulls the cost model (pandas): check, replay and bias start without it
    from spectr_repro.launch.fit import check_batch_fits, check_context_fits

    for run in runs:
        check_device(run.hardware.device)
    prompts = num_prompts or [run.num_prompts for run in runs]
    check_dataset_sizes(zip(runs, prompts))
    lengths = block_L or [min(run.L, run.max_new_tokens) for run in runs]
    checked = set()
    for run, length in zip(runs, lengths):
        if (run.model_pair, length) not in checked:
            checked.add((run.model_pair, length))
            check_block_fits(run, length, L_key)
    for run, length, K in zip(runs, lengths, rows or [run.K for run in runs]):
        check_context_fits(run, int(K), int(length), context_window(run.pair_values))
    sizes = batches or [(run.hardware.batch_prompts, "hardware.batch_prompts") for run in runs]
    for run, length, K, (batch, key) in zip(runs, lengths, rows or [run.K for run in runs], sizes):
        check_batch_fits(run, int(batch), int(K), int(length), key)


def run_folders(run: RunConfig, cell_dirs: Iterable[Path] = ()) -> list[Path]:
    """Every folder a run of ``run`` writes: the experiment's cells/ (and each existing cell folder), the
    W&B folder when logging is on, and Hydra's multirun folder (launcher path)."""
    experiment = Path(run.output_dir).expanduser() / run.experiment
    folders = [experiment, experiment / "cells", *cell_dirs]
    logger = run.logger
    if logger is not None and logger.backend == "wandb" and logger.mode in ("offline", "online"):
        folders.append(experiment / "wandb")
    return folders


__all__ = [
    "GROUPS", "Composer", "ParsedArgs", "UsageError", "check_before_loading", "check_block_fits",
    "check_dataset_sizes", "check_device", "context_window", "check_nested_keys", "check_top_level_keys",
    "check_writable", "conf_dir", "expand", "grid_axes", "group_options", "needs_single_draft", "parse_arguments",
    "run_config", "run_folders", "schema_keys", "single_draft_message",
]
