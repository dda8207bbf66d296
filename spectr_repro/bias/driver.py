"""``python -m spectr_repro bias``: does a rule change the law of the first token it emits? Real models.

    python -m spectr_repro bias model_pair=tiny_random method=spectr_gbv,sbv K=3 L=6 bias.samples=32
    python -m spectr_repro bias experiment=bias_qwen          # the experiment's grid of settings

Keys are those of ``sweep`` (composed and validated by :mod:`spectr_repro.launch.config`: the same keys,
the same messages), plus ``bias.*`` (conf/config.yaml). Cells sharing everything but the method form one
setting. For each of its contexts (per prompt, ``bias.contexts_per_prompt`` cuts of an AR continuation
sampled from the target, where its top token has probability nearest 1/2: see ``contexts_of``) it draws
``bias.samples`` independent draft sets, B = ``bias.batch`` at a time (the draft model on B*K rows, then
the target on the same B*K rows), and every method of the setting -- plus the negative controls -- is
applied to the SAME draft sets and target rows. p(.|context) is the target's row 0, from the same
forward. Estimators and the test: :mod:`spectr_repro.bias.estimators`; the measurement at a context:
:mod:`spectr_repro.bias.measure`; the folders and the table: :mod:`spectr_repro.bias.records`.

Output: ``<output_dir>/<experiment>/bias/bias.csv`` (rebuilt from one JSON per (setting, context, method)
under ``bias/contexts/``, written as each context finishes, then the context's ``done.json`` with each file's
sha256 and line count: a rerun skips finished contexts, so an interrupted run resumes; a damaged or partial
context is named, its files set aside under ``bias/set_aside/`` (never deleted) and measured again; a file the
table cannot read is named and left out). Bad input: one message, exit 2, before any model loads, nothing
written (:func:`spectr_repro.launch.config.check_before_loading`, the checks every command shares). SIGTERM and
SIGINT say what is kept and how to resume.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from spectr_repro import tracking
from spectr_repro.bias import estimators, measure
from spectr_repro.bias.records import (
    context_problem,
    missing_methods,
    safe_name,
    start_setting,
    write_context,
    write_csv,
)
from spectr_repro.bias.settings import BiasSetting, bias_folder, bias_setting_groups, bias_settings
from spectr_repro.errors import ResourceError, exit_at_the_door
from spectr_repro.launch.config import (
    Composer,
    UsageError,
    check_before_loading,
    check_writable,
    expand,
    needs_single_draft,
    parse_arguments,
    print_help_if_asked,
    single_draft_message,
)
from spectr_repro.launch.pairs import PairCache
from spectr_repro.launch.signals import Budget, RunProgress, Terminated, stop_on_signals, stop_status
from spectr_repro.settings import RunConfig, run_config


def check_bias_config(run: RunConfig) -> None:
    """The bias-specific keys and the single-draft rule (UsageError, before any model loads)."""
    bias_settings(run)
    if run.temperature <= 0:
        raise UsageError("bias needs temperature > 0 (at 0 every rule emits the target's argmax)")
    if run.method == "ar":
        raise UsageError("method ar has no verification rule to measure; name rules (method=spectr_gbv,sbv,...)")
    if needs_single_draft(run):
        raise UsageError(single_draft_message(run))


@dataclass
class Progress(RunProgress):
    """What this run has done so far (contexts): what a stop by signal reports."""

    current: str | None = None  # the context being measured
    budget: Budget = field(default_factory=Budget)  # bias.budget_minutes
    planned: dict[str, int] = field(default_factory=dict)  # setting id -> its contexts (settings reached)

    def stopped_message(self, stop: BaseException, folder: Path) -> str:
        return self.stop_report(stop, [folder], "context", "measured", "rerun the same command to resume.")

    def budget_message(self, settings: Sequence[BiasSetting], argv: Sequence[str]) -> str:
        """What a run stopped by its budget kept, counted on disk; a setting not reached yet counts its
        num_prompts x contexts_per_prompt contexts (at most that many)."""
        finished = left = 0
        for setting in settings:
            folder = setting.contexts_folder
            done = sum(context_problem(d) is None for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else 0
            planned = self.planned.get(setting.id, setting.num_prompts * setting.bias.contexts_per_prompt)
            finished, left = finished + done, left + max(planned - done, 0)
        return self.budget.message(self.computed, max(finished - self.computed, 0), left, "context", "bias", argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        settings = parse(argv)
    except (UsageError, ResourceError) as error:  # bad input, or a dataset that cannot be read: before any model loads
        return exit_at_the_door(error)
    started = time.perf_counter()
    pairs = PairCache()  # settings of one pair share it: loaded once
    folder = settings[0].folder
    progress = Progress(budget=Budget(settings[0].bias.budget_minutes))
    try:
        with stop_on_signals():
            for setting in settings:
                run_setting(setting, pairs, progress)
                if progress.budget.stopped:
                    break
            try:
                path = write_csv(folder)
            except OSError as error:
                raise ResourceError(f"cannot write {folder / 'bias.csv'}: {error}") from error
    except ResourceError as error:
        print(f"error: {error}\n(finished contexts are kept; fix the above and rerun the same command)",
              file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        print("\n" + progress.stopped_message(stop, folder), file=sys.stderr)
        return stop_status(stop)
    print(f"bias: {path} (wall time {time.perf_counter() - started:.0f} s)")
    tracking.log_command("bias", settings[0].logger, path.parent.parent, tables={"rows": path},
                         config=tracking.top_level_config(setting.values() for setting in settings))
    if progress.budget.stopped:
        print(progress.budget_message(settings, argv))
    return 0


def parse(argv: Sequence[str]) -> list[BiasSetting]:
    """The command's settings (cells sharing all but the rule), checked like every command that loads models
    (UsageError, nothing loaded)."""
    args = parse_arguments(argv)
    if args.launcher_overrides:
        raise UsageError("bias runs in one process (hydra/launcher overrides apply to `sweep` only)")
    with Composer() as composer:
        runs = [run_config(cfg) for cfg in expand(composer, args, use_grid=True)]
    for run in runs:
        check_bias_config(run)
    # every draft set is a whole block of L tokens (never cut by max_new_tokens)
    check_before_loading(runs, block_L=[run.L for run in runs])
    for run in runs:
        check_writable(run.output_dir, [bias_folder(run)])
    return bias_setting_groups(runs)


# --------------------------------------------------------------------------------------------------
# One setting


_CONTEXTS: dict[tuple, list[tuple[str, list[int]]]] = {}  # this process's contexts, by what fixes them


def run_setting(setting: BiasSetting, pairs: PairCache, progress: Progress | None = None) -> None:
    progress = progress or Progress()
    folder = setting.contexts_folder
    pair = pairs.pair(setting.run)
    examples = pairs.examples(setting.run, pair.tokenizer)
    if setting.contexts_key not in _CONTEXTS:  # settings that differ only by method, K or L share their contexts
        _CONTEXTS[setting.contexts_key] = measure.contexts_of(pair, setting, examples)
    contexts = _CONTEXTS[setting.contexts_key]
    progress.planned[setting.id] = len(contexts)
    all_methods = [*setting.methods, *estimators.CONTROLS]
    verified = start_setting(folder, setting.values())
    samples = setting.bias.samples
    with tqdm(total=len(contexts) * samples, desc=f"bias K={setting.K} T={setting.temperature:g}",
              unit="draft set", file=sys.stderr) as bar:
        for number, (name, ids) in enumerate(contexts):
            directory = folder / safe_name(name)
            missing = missing_methods(directory, all_methods, verified)
            if not missing:
                progress.earlier += 1
                bar.update(samples)
                continue
            if progress.budget.spent():
                return  # the next context would not fit in bias.budget_minutes
            progress.current = f"{setting.id}/{name}"
            with progress.budget.unit():
                results = measure.measure_context(pair, setting, ids, missing, number, bar)
                try:
                    write_context(directory, {method: {**record, "context": name, "context_tokens": len(ids),
                                                       "top_strings": [pair.tokenizer.decode([token])
                                                                       for token in record["top_tokens"]]}
                                              for method, record in results.items()})
                except OSError as error:
                    raise ResourceError(f"cannot write context {name} into {directory}: {error}") from error
            progress.computed += 1  # kept from here on: a stop while the table is rebuilt below loses nothing
            progress.current = None
            try:
                write_csv(setting.folder)
            except OSError as error:
                raise ResourceError(f"cannot write {setting.folder / 'bias.csv'}: {error}") from error


__all__ = ["Progress", "check_bias_config", "main", "parse", "run_setting"]
