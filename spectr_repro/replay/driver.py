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

Records: ``<output_dir>/<experiment>/replay/<group>/prompts/<index>/blocks.jsonl`` (one line per block)
and ``done.json`` (written last: a prompt is finished when it exists); ``replay.json`` holds the group's
settings. Prompts are claimed like cells (several runners over one folder compute each prompt once), an
interrupted replay resumes with the prompts it had not finished. The summary (``replay_summary.csv``,
``replay_differences.csv``) is rebuilt at the end from every finished prompt of the folders (a larger
num_prompts extends a replay in its folder: the seeded prompt selection keeps its first prompts).
Bad input: one message, exit 2, before any model loads.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from spectr_repro.replay.core import ROW_GROUPS, block_estimates, check_grid
from spectr_repro.runner.config import Composer, UsageError, expand, parse_arguments, print_help_if_asked, validate
from spectr_repro.runner.store import atomic_write_text
from spectr_repro.verify import VERIFIERS, Verifier, get_verifier

GRID_KEYS = ("method", "K", "L")  # command-line keys that set the replay's grid, not one cell's value


@dataclass(frozen=True)
class ReplaySettings:
    methods: tuple[str, ...]
    K_values: tuple[int, ...]
    L_values: tuple[int, ...]
    reference: str
    reference_K: int
    reference_L: int
    draws: int
    num_prompts: int
    row_groups: str = "disjoint"
    sampled: tuple[str, ...] = ()  # rules taken by their sampler's draws (replay.sampled), not their closed form

    @property
    def K_max(self) -> int:
        return max(*self.K_values, self.reference_K)

    @property
    def L_max(self) -> int:
        return max(*self.L_values, self.reference_L)

    def as_dict(self) -> dict[str, Any]:
        return {"methods": list(self.methods), "K": list(self.K_values), "L": list(self.L_values),
                "reference": self.reference, "reference_K": self.reference_K, "reference_L": self.reference_L,
                "draws": self.draws, "row_groups": self.row_groups,
                **({"sampled": list(self.sampled)} if self.sampled else {})}


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


def _integers(key: str, values) -> tuple[int, ...]:
    try:
        numbers = [int(str(v)) for v in values]
    except ValueError:
        raise UsageError(f"{key} must be integers >= 1, got {','.join(map(str, values))}") from None
    return tuple(dict.fromkeys(numbers))


def settings_of(cfg: DictConfig, grid: dict[str, list[str]]) -> ReplaySettings:
    """The replay's grid and reference, checked (UsageError with one message)."""
    replay = cfg.get("replay") or {}
    methods = grid.get("method") or replay.get("methods") or list(VERIFIERS)
    K_values = _integers("K", grid.get("K") or replay.get("K") or [1])
    L_values = _integers("L", grid.get("L") or replay.get("L") or [cfg.L])
    draws = replay.get("draws", 8)
    try:
        check_grid(list(methods), list(K_values), list(L_values), draws)
    except ValueError as error:
        raise UsageError(str(error)) from None
    reference = str(replay.get("reference", "sbv"))
    reference_K, reference_L = replay.get("reference_K", 3), replay.get("reference_L", 6)
    if reference not in VERIFIERS or not VERIFIERS[reference].lossless:
        lossless = ", ".join(n for n, s in VERIFIERS.items() if s.lossless)
        raise UsageError(f"replay.reference must be a lossless rule ({lossless}), got {reference!r}: its text "
                         f"must have the target's law")
    for key, value in (("replay.reference_K", reference_K), ("replay.reference_L", reference_L)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{key} must be an integer >= 1, got {value!r}")
    if VERIFIERS[reference].single_draft and reference_K != 1:
        raise UsageError(f"replay.reference {reference} verifies a single draft: set replay.reference_K=1")
    num_prompts = replay.get("num_prompts") or cfg.num_prompts
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise UsageError(f"replay.num_prompts must be an integer >= 1, got {num_prompts!r}")
    row_groups = replay.get("row_groups", "disjoint")
    if row_groups not in ROW_GROUPS:
        raise UsageError(f"replay.row_groups must be one of {', '.join(ROW_GROUPS)}, got {row_groups!r}")
    sampled = tuple(str(m) for m in replay.get("sampled") or ())
    unknown = [m for m in sampled if m not in methods]
    if unknown:
        raise UsageError(f"replay.sampled names rules the replay does not run: {', '.join(unknown)} "
                         f"(it runs {', '.join(methods)})")
    return ReplaySettings(tuple(dict.fromkeys(methods)), K_values, L_values, reference, int(reference_K),
                          int(reference_L), int(draws), int(num_prompts), str(row_groups), sampled)


def parse(argv: Sequence[str]) -> list[tuple[DictConfig, ReplaySettings]]:
    """(cell config, replay settings) per group: one per dataset x temperature x ... of the command."""
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
        validate(cfg)
        groups.append((cfg, settings_of(cfg, grid)))
    return groups


# --------------------------------------------------------------------------------------------------
# One prompt


class ReplayingReference(Verifier):
    """The reference rule on the first reference_K x reference_L of each block, after replaying the grid.

    Not lossless as far as the engine is concerned, so that every block is drafted whole (L_max): the
    replay's sub-blocks never run past the block. The text it emits is the reference's (lossless).
    """

    name = "replay"
    lossless = False

    def __init__(self, settings: ReplaySettings, generator: torch.Generator) -> None:
        super().__init__(check_inputs=False)
        self.settings = settings
        self.reference = get_verifier(settings.reference, check_inputs=False)
        self.generator = generator  # the replay's own draws (the trajectory keeps the engine's)
        self.blocks: list[dict[str, Any]] = []

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        s = self.settings
        start = time.perf_counter()  # the estimates end in host reads: the clock sees their device work too
        estimates = block_estimates(draft_tokens, draft_probs, target_probs, s.methods, s.K_values, s.L_values,
                                    s.draws, self.generator, row_groups=s.row_groups, sampled=s.sampled)
        K, L = s.reference_K, s.reference_L
        result = self.reference(draft_tokens[:K, :L], draft_probs[:K, :L], target_probs[:K, :L + 1],
                                generator=generator, state=state)
        self.blocks.append({
            "iteration": len(self.blocks),
            "reference_tokens": int(result.num_accepted) + 1,
            "values": [[e.method, e.K, e.L, e.tokens, e.estimator, e.draws] for e in estimates],
            "rule_seconds": time.perf_counter() - start,  # the grid and the reference on this block (plan: replay cost)
        })
        return result


def replay_prompt(pair, input_ids, settings: ReplaySettings, cfg: DictConfig, seed: int, should_stop=None
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(block rows, prompt summary) of one prompt's trajectory."""
    from spectr_repro.engine.loop import generate

    draws = torch.Generator(device=pair.device).manual_seed(seed * 7919 + 17)
    reference = ReplayingReference(settings, draws)
    start = time.perf_counter()
    out = generate(pair.target, pair.draft, input_ids, method=reference, K=settings.K_max, L=settings.L_max,
                   temperature=float(cfg.temperature), max_new_tokens=int(cfg.max_new_tokens), seed=seed,
                   eos_token_ids=pair.eos_token_ids, should_stop=should_stop, vocab_size=pair.vocab_size,
                   prefill_chunk=cfg.hardware.get("prefill_chunk"))
    summary = {"new_tokens": len(out.new_tokens), "target_calls": out.target_calls, "blocks": len(reference.blocks),
               "trajectory_block_efficiency": out.block_efficiency, "seconds": time.perf_counter() - start}
    return reference.blocks, summary


# --------------------------------------------------------------------------------------------------
# Folders


def group_name(cfg: DictConfig, settings: ReplaySettings) -> str:
    """One folder per (pair, dataset, temperature, length, seed, reference, dtype). Not the number of prompts:
    a larger num_prompts extends a smaller one (the seeded selection keeps its first prompts), so a replay
    grows in its folder, prompt by prompt."""
    identity = {"model_pair": cfg.choices.model_pair, "dataset": cfg.choices.dataset,
                "temperature": float(cfg.temperature),
                "max_new_tokens": int(cfg.max_new_tokens), "seed": int(cfg.seed),
                "reference": [settings.reference, settings.reference_K, settings.reference_L],
                "dtype": str(cfg.hardware.get("dtype")), "device": str(cfg.hardware.get("device"))}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    return f"{cfg.choices.model_pair}__{cfg.choices.dataset}__T{float(cfg.temperature):g}__{digest}"


def replay_root(cfg: DictConfig) -> Path:
    return Path(cfg.output_dir) / cfg.experiment / "replay"


def group_meta(cfg: DictConfig, settings: ReplaySettings) -> dict[str, Any]:
    return {"model_pair": cfg.choices.model_pair, "dataset": cfg.choices.dataset,
            "temperature": float(cfg.temperature), "num_prompts": settings.num_prompts,
            "max_new_tokens": int(cfg.max_new_tokens), "seed": int(cfg.seed),
            "dtype": str(cfg.hardware.get("dtype")), **settings.as_dict()}


def changed_settings(folder: Path, meta: dict[str, Any]) -> list[str]:
    """The settings (keys of ``group_meta``) in which the replay held in ``folder`` differs from ``meta``,
    num_prompts aside (a larger one extends it); [] for a folder without a replay yet."""
    path = folder / "replay.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    return [key for key in meta if key != "num_prompts" and old.get(key) != meta[key]]


def _check_group_folder(folder: Path, meta: dict[str, Any], force: bool) -> None:
    """A folder holds one grid: a rerun with another grid is refused unless force=true (which restarts it)."""
    if not force:
        changed = changed_settings(folder, meta)
        if changed:
            raise UsageError(f"{folder} holds a replay with other settings ({', '.join(changed)}): rerun with "
                             f"the same ones to resume, force=true to start it over, or another experiment=")


def group_folder(cfg: DictConfig, settings: ReplaySettings) -> Path:
    return replay_root(cfg) / group_name(cfg, settings)


def prompt_directory(folder: Path, index: int) -> Path:
    """The records of prompt ``index`` (its place in the seeded selection) of the group in ``folder``."""
    return folder / "prompts" / f"{index:04d}"


def prompt_finished(directory: Path) -> bool:
    return (directory / "done.json").exists() and (directory / "blocks.jsonl").exists()


def write_prompt(directory: Path, blocks: Sequence[dict[str, Any]], done: dict[str, Any]) -> None:
    """A prompt's block lines, then ``done.json`` (last: the prompt is finished once it exists)."""
    atomic_write_text(directory / "blocks.jsonl", "".join(json.dumps(b) + "\n" for b in blocks))
    atomic_write_text(directory / "done.json", json.dumps(done, indent=2) + "\n")


# --------------------------------------------------------------------------------------------------
# The command


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        groups = parse(argv)
        for cfg, settings in groups:
            _check_group_folder(group_folder(cfg, settings), group_meta(cfg, settings), bool(cfg.force))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from spectr_repro.errors import ResourceError
    from spectr_repro.runner.claims import Runner
    from spectr_repro.runner.pairs import PairCache

    done = computed = 0
    try:
        with Runner() as runner:
            pairs = PairCache(on_load=lambda name: runner.set_state("loading", name))
            for cfg, settings in groups:
                finished, ran = _run_group(pairs, runner, cfg, settings)
                done, computed = done + finished, computed + ran
            pairs.release()
    except ResourceError as error:
        print(f"error: {error}\n(finished prompts are kept; fix the above and rerun the same command)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nstopped by SIGINT (Ctrl-C): kept {computed} prompt(s) replayed in this run; the prompt being "
              f"replayed starts over; rerun the same command to resume.", file=sys.stderr)
        return 130
    from spectr_repro.analysis.replay import write_summaries

    roots = list(dict.fromkeys(replay_root(cfg) for cfg, _ in groups))
    for root in roots:
        table = write_summaries(root)
        print(table)
    print(f"{computed} prompt(s) replayed, {done - computed} finished earlier or elsewhere; "
          f"results in {', '.join(map(str, roots))}")
    return 0


def _run_group(pairs, runner, cfg: DictConfig, settings: ReplaySettings) -> tuple[int, int]:
    """Replay every prompt of one group not finished yet; returns (prompts finished, prompts computed here)."""
    from spectr_repro.data import encode_prompt
    from spectr_repro.runner.stops import stop_checker

    folder = group_folder(cfg, settings)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "replay.json", json.dumps(group_meta(cfg, settings), indent=2) + "\n")
    pair = pairs.pair(cfg)
    cfg_prompts = OmegaConf.merge(cfg, {"num_prompts": settings.num_prompts})
    examples = pairs.examples(cfg_prompts, pair.tokenizer)
    force = bool(cfg.force)
    label = f"replay {cfg.choices.dataset} T={float(cfg.temperature):g}"
    bar = tqdm(list(enumerate(examples)), desc=label, unit="prompt", file=sys.stderr, dynamic_ncols=True)
    finished = computed = 0
    for index, example in bar:
        directory = prompt_directory(folder, index)
        if prompt_finished(directory) and not force:
            finished += 1
            continue
        claim = runner.claim(directory)
        if not claim.acquired:
            continue  # another live runner replays it
        try:
            (directory / "done.json").unlink(missing_ok=True)
            input_ids = encode_prompt(pair.tokenizer, example)[0].tolist()
            stops = tuple(getattr(example, "stop_strings", ()) or ())
            blocks, summary = replay_prompt(pair, input_ids, settings, cfg, seed=int(cfg.seed) * 100_003 + index,
                                            should_stop=stop_checker(pair.tokenizer, stops))
            write_prompt(directory, blocks, {"prompt_id": str(example.id), "index": index, **summary})
        finally:
            runner.release(directory)
        finished += 1
        computed += 1
        bar.set_postfix(blocks=summary["blocks"])
    bar.close()
    return finished, computed


__all__ = ["ReplaySettings", "ReplayingReference", "changed_settings", "group_folder", "group_meta", "group_name",
           "main", "parse", "prompt_directory", "prompt_finished", "replay_prompt", "replay_root", "settings_of",
           "write_prompt"]
