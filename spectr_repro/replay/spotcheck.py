"""`python -m spectr_repro spotcheck results/<experiment> [-k 3] [--seed 0] [--here]`: a reviewer's check of committed
results.

MLPerf's TEST01 idea for the replay: pick k committed prompts at random (seeded), rebuild each one's settings from its
group's replay.json through the same config the replay used, re-run the batch of prompts it was replayed with (same
seeds), and compare the new blocks with the committed ones (every value but the wall-clock ``rule_seconds``).

* Same environment (CPU or GPU model, torch and transformers, threads) and the same rules' fingerprint: the blocks
  must be identical, or the command exits 1.
* Another environment: bfloat16 rounds differently on another CPU, so the trajectory may part from the record at a
  near-tie. The command says which recorded environment keys differ and reports how many blocks match and how far
  the values moved on the blocks before the trajectories part; it exits 0 (the laws are compared by the report's
  intervals, never the tokens).

``--here`` draws only among the prompts recorded on this kind of machine with these versions (the prompts whose
re-run must be identical): the check a reviewer runs to catch a record that this code does not reproduce.

It loads the models (minutes); ``seal --check`` checks the committed files without them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spectr_repro import tracking
from spectr_repro.committed import BLOCKS_FILE, ENVIRONMENT_KEYS, MANIFEST_FILE, SETTINGS_FILE, groups_under
from spectr_repro.conf import conf_dir
from spectr_repro.data import encode_prompt
from spectr_repro.environment import environment
from spectr_repro.errors import ResourceError, UsageError
from spectr_repro.launch.pairs import PairCache
from spectr_repro.launch.stops import stop_checker
from spectr_repro.records import read_record_text
from spectr_repro.replay.fingerprint import rules_fingerprint
from spectr_repro.replay.folders import parse, prompt_directory
from spectr_repro.replay.settings import GroupSettings
from spectr_repro.replay.trajectories import replay_prompts

UNTIMED = "rule_seconds"  # a block's wall-clock seconds: never compared


@dataclass
class Comparison:
    """One re-run prompt against its committed record."""

    group: str
    index: str
    batch: list[int]
    identical: bool
    recorded_blocks: int
    rerun_blocks: int
    same_trajectory_blocks: int  # leading blocks whose reference tokens agree (the trajectories have not parted)
    max_value_shift: float  # largest |value change| over those blocks (0.0 when identical)
    environment_differences: list[str] = field(default_factory=list)  # recorded keys that differ from this run
    fingerprint_differences: list[str] = field(default_factory=list)  # rules judged by another version

    @property
    def explained(self) -> bool:
        return self.identical or bool(self.environment_differences or self.fingerprint_differences)


def blocks_of(text: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in json.loads(line).items() if k != UNTIMED} for line in text.splitlines() if line]


def compare_blocks(recorded: Sequence[dict], rerun: Sequence[dict]) -> tuple[bool, int, float]:
    """(identical, leading blocks on the same trajectory, largest value shift on them)."""
    same, shift = 0, 0.0
    for old, new in zip(recorded, rerun):
        if old.get("reference_tokens") != new.get("reference_tokens"):
            break
        old_values = {tuple(v[:3]): float(v[3]) for v in old.get("values", [])}
        for value in new.get("values", []):
            if tuple(value[:3]) in old_values:
                shift = max(shift, abs(float(value[3]) - old_values[tuple(value[:3])]))
        same += 1
    identical = list(recorded) == list(rerun)
    return identical, same, shift


def batch_of(folder: Path, index: int, done: dict[str, Any]) -> list[int]:
    """The prompts replayed together with prompt ``index``: done.json's ``batch`` where recorded, else the prompts of
    the group that share its ``batch_seconds`` (one batch, one wall time), else the prompt alone."""
    if isinstance(done.get("batch"), list):
        return sorted(int(i) for i in done["batch"])
    if int(done.get("batch_prompts", 1)) <= 1 or "batch_seconds" not in done:
        return [index]
    mates = []
    for path in sorted((folder / "prompts").glob("*/done.json")):
        try:
            other = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if other.get("batch_seconds") == done["batch_seconds"]:
            mates.append(int(other["index"]))
    return sorted(mates) if index in mates else [index]


def choose(folders: Sequence[Path], k: int, seed: int, like: dict[str, Any] | None = None) -> list[tuple[Path, str]]:
    """k (group folder, prompt index) drawn without replacement from every prompt the manifests list; with ``like``
    (an environment), only from those recorded in one that differs from it in no compared key."""
    candidates = []
    for folder in folders:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        for index, entry in sorted(manifest["prompts"].items()):
            if like is None or not differing_keys(manifest["environments"][entry["environment"]], like):
                candidates.append((folder, index))
    if len(candidates) < k:
        where = " recorded in this environment" if like is not None else ""
        raise UsageError(f"{k} prompts asked for, {len(candidates)} committed{where}")
    return random.Random(seed).sample(candidates, k)


def rebuild_arguments(meta: dict[str, Any], experiment: str | None, index: int, methods: Sequence[str],
                      support_mass: Any, dtype: str | None = None) -> list[str]:
    """The replay's command line that rebuilds a group's recorded settings (replay.json) up to prompt ``index``, in
    the prompt's recorded ``dtype`` (None: not recorded, so the replay.json of before 2026-12-06 names it)."""
    def listed(values) -> str:
        return ",".join(str(v) for v in values)

    argv = [f"experiment={experiment}"] if experiment else []
    argv += [f"model_pair={meta['model_pair']}", f"dataset={meta['dataset']}", f"temperature={meta['temperature']}",
             f"max_new_tokens={meta['max_new_tokens']}", f"seed={meta['seed']}",
             f"method={listed(methods)}", f"K={listed(meta['K'])}", f"L={listed(meta['L'])}",
             f"replay.num_prompts={max(int(meta['num_prompts']), index + 1)}",
             f"replay.reference={meta['reference']}", f"replay.reference_K={meta['reference_K']}",
             f"replay.reference_L={meta['reference_L']}", f"replay.draws={meta['draws']}",
             f"replay.row_groups={meta['row_groups']}", f"replay.sampled=[{listed(meta.get('sampled', []))}]",
             f"replay.support_mass={'null' if support_mass is None else support_mass}"]
    dtype = dtype or meta.get("dtype")
    if dtype not in (None, "None"):  # "None": the pair's own dtype (replay.json wrote it as a string)
        argv.append(f"hardware.dtype={dtype}")
    return argv


def _config_of(folder: Path, index: int, methods: Sequence[str], support_mass: Any, logger: str,
               dtype: str | None) -> GroupSettings:
    """The group's settings that replay the group in ``folder`` up to prompt ``index`` with the rules its record holds
    (``methods``: a rule registered later is not re-run), refused when this code's config does not rebuild the
    recorded settings."""
    meta = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
    experiment = folder.parent.parent.name  # results/<experiment>/replay/<group>: its config sets the hardware
    known = (Path(conf_dir()) / "experiment" / f"{experiment}.yaml").exists()
    argv = [*rebuild_arguments(meta, experiment if known else None, index, methods, support_mass, dtype),
            f"logger={logger}"]
    [group] = parse(argv)
    rebuilt = group.meta()
    # dtype: replay.json held it before it became each prompt's (the argument above passes it on)
    differ = [key for key in meta if key not in ("num_prompts", "methods", "dtype") and rebuilt.get(key) != meta[key]]
    if differ:
        raise UsageError(f"{folder}: `{' '.join(argv)}` does not rebuild the recorded settings ({', '.join(differ)})")
    return group


def recorded_methods(blocks: Sequence[dict]) -> list[str]:
    """The rules a prompt's record holds, in the order its blocks list them."""
    return list(dict.fromkeys(value[0] for block in blocks[:1] for value in block.get("values", [])))


def rerun(pairs, folder: Path, batch: list[int], methods: Sequence[str], support_mass: Any, logger: str,
          dtype: str | None = None) -> dict[int, list[dict]]:
    """The blocks of each prompt of ``batch``, replayed again as the replay did (one call, the recorded seeds and
    dtype)."""
    group = _config_of(folder, max(batch), methods, support_mass, logger, dtype)
    pair = pairs.pair(group.run)
    examples = pairs.examples(group.run, pair.tokenizer, group.settings.num_prompts)
    inputs = [encode_prompt(pair.tokenizer, examples[i])[0].tolist() for i in batch]
    stops = [stop_checker(pair.tokenizer, tuple(getattr(examples[i], "stop_strings", ()) or ())) for i in batch]
    seeds = [group.prompt_seed(i) for i in batch]
    results = replay_prompts(pair, inputs, group, seeds, stops)
    return {i: [{k: v for k, v in b.items() if k != UNTIMED} for b in blocks] for i, (blocks, _) in zip(batch, results)}


def recorded_environment(folder: Path, index: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The environment and rules' fingerprint the group's manifest records for prompt ``index``."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    entry = manifest["prompts"][index]
    return (manifest["environments"][entry["environment"]],
            manifest["rules_fingerprints"][entry["rules_fingerprint"]])


def differing_keys(recorded: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """The recorded environment's keys that differ here: not the commit (the code may move on while the rules'
    fingerprint holds), nor the dtype (a prompt is re-run in its own)."""
    return [key for key in ENVIRONMENT_KEYS if key not in ("git_commit", "dtype")
            and str(recorded.get(key)) != str(here.get(key))]


def _differences(recorded: dict[str, Any], versions: dict[str, str], here: dict[str, Any],
                 current: dict[str, str]) -> tuple[list, list]:
    rules = [rule for rule, version in versions.items() if current.get(rule) != version]
    return differing_keys(recorded, here), rules


def spot_check(folders: Sequence[Path], k: int, seed: int, logger: str = "disabled",
               only_here: bool = False) -> list[Comparison]:
    here, comparisons = environment(), []
    chosen = choose(folders, k, seed, here if only_here else None)  # a refusal comes before any model loads
    pairs = PairCache()
    reruns: dict[tuple[Path, tuple[int, ...]], dict[int, list[dict]]] = {}
    for folder, index in chosen:
        directory = prompt_directory(folder, int(index))
        done = json.loads((directory / "done.json").read_text(encoding="utf-8"))
        batch = batch_of(folder, int(index), done)
        settings = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
        recorded = blocks_of(read_record_text(directory / BLOCKS_FILE))
        current = rules_fingerprint(recorded_methods(recorded), sampled=settings.get("sampled", []))
        environment_then, versions = recorded_environment(folder, index)
        key = (folder, tuple(batch))  # two prompts drawn from one batch: the batch is re-run once
        if key not in reruns:
            reruns[key] = rerun(pairs, folder, batch, recorded_methods(recorded), done.get("support_mass"), logger,
                                environment_then.get("dtype"))
        new = reruns[key][int(index)]
        identical, same, shift = compare_blocks(recorded, new)
        env_keys, rules = _differences(environment_then, versions, here, current)
        comparisons.append(Comparison(folder.name, index, batch, identical, len(recorded), len(new), same, shift,
                                      env_keys, rules))
        print(_line(comparisons[-1]), flush=True)
    pairs.release()
    return comparisons


def _line(c: Comparison) -> str:
    verdict = "identical" if c.identical else ("differs, explained" if c.explained else "DIFFERS, unexplained")
    why = ""
    if c.environment_differences:
        why += f"; environment differs in {', '.join(c.environment_differences)}"
    if c.fingerprint_differences:
        why += f"; rules of another version: {', '.join(c.fingerprint_differences)}"
    return (f"{c.group} prompt {c.index} (batch {c.batch}): {verdict}: {c.rerun_blocks} block(s) re-run against "
            f"{c.recorded_blocks} recorded, {c.same_trajectory_blocks} on the same trajectory, largest value shift "
            f"{c.max_value_shift:.3g}{why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectr_repro spotcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="committed results (e.g. results/replay_qwen_grid)")
    parser.add_argument("-k", type=int, default=3, help="prompts to re-run (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="which prompts (default 0)")
    parser.add_argument("--here", action="store_true",
                        help="only prompts recorded on this kind of machine with these versions (must be identical)")
    parser.add_argument("--output", default="results/spotcheck", help="where spotcheck.json goes")
    tracking.add_logger_option(parser)
    args = parser.parse_args(argv)
    folders = [g for g in groups_under(Path(args.folder)) if (g / MANIFEST_FILE).exists()]
    try:
        if args.k < 1:
            raise UsageError(f"-k must be >= 1, got {args.k}")
        if not folders:
            raise UsageError(f"no sealed replay group (with {MANIFEST_FILE}) under {args.folder}")
        comparisons = spot_check(folders, args.k, args.seed, only_here=args.here)
    except UsageError as error:
        print(f"spotcheck: error: {error}", file=sys.stderr)
        return 2
    except ResourceError as error:
        print(f"spotcheck: error: {error}", file=sys.stderr)
        return 1
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(c), "explained": c.explained} for c in comparisons]
    (out / "spotcheck.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    unexplained = [c for c in comparisons if not c.explained]
    print(f"spot check: {sum(c.identical for c in comparisons)} of {len(comparisons)} prompt(s) identical, "
          f"{len(unexplained)} unexplained difference(s); {out / 'spotcheck.json'}")
    tracking.log_command("spotcheck", tracking.logger_config(args.logger), out,
                         tables={"spotcheck": pd.DataFrame(rows)}, config=vars(args))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
