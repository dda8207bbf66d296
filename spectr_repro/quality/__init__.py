"""Quality parity on real text: does each method's output score like plain autoregressive (AR) decoding?

A lossless rule samples exactly the target's distribution, so its task accuracy must agree with AR's
within sampling error; a lossy rule (the released SpecTr-GBV) may drift. Read from the runner's records
(``<results>/**/cells/<cell>/records.jsonl`` + ``summary.json``, through ``spectr_repro.records.read_cells``):

- HumanEval pass@1 (``score``): the completion is appended to the problem's prompt and run against the
  dataset's tests. **THIS EXECUTES MODEL-WRITTEN CODE**, in the sandbox of ``spectr_repro.quality.sandbox``:
  bubblewrap where it works (new namespaces, no network, read-only root, private /tmp), else ``unshare``
  (the same namespaces, every mount read-only), always with its own process group killed at exit or timeout,
  limits on processes, file size, open files, memory, CPU and output bytes, in a temporary folder, as
  ``nobody`` when the harness is root. Where neither tool works it refuses to run unless asked to with
  ``--sandbox none`` (limits only, no isolation). The mode used is recorded in quality.csv (column ``sandbox``).
- GSM8K and MGSM exact match (``score``): ``get_dataset(name).extract_answer(completion)`` against the
  record's reference answer (numbers normalised, ``spectr_repro.data.answers.answers_match``). Which
  scorer a dataset gets is its spec's ``quality_metric`` in the data registry.

Each method's accuracy is reported with a Wilson 95 % interval, next to AR's on the same dataset, pair and
temperature, with a Newcombe (hybrid Wilson) 95 % interval for the difference method − AR (``intervals``).
``tables`` writes quality.csv and quality_prompts.csv, which the report renders; ``cli`` is the command.

    python -m spectr_repro.quality results/cpu_quick      # writes quality.csv, quality_prompts.csv; prints them
"""

import importlib

# Each name's module, imported on first use: ``import spectr_repro.quality.sandbox`` (check's environment item) must
# not pay for the tables' statsmodels and scipy (~3.6 s), and ``quality.X`` still finds every name below.
_MODULES = {
    "cli": ("main",),
    "intervals": ("difference_interval", "wilson_interval"),
    "sandbox": ("MODE_DESCRIPTIONS", "SANDBOX_MODES", "Sandbox", "SandboxUnavailable", "find_sandbox"),
    "score": ("DEFAULT_TIMEOUT_S", "ExecutionResult", "humaneval_pass", "humaneval_problems", "humaneval_program",
              "math_correct", "run_program", "score_records"),
    "tables": ("PROMPTS_FILE", "PROMPT_COLUMNS", "PROMPT_SETTING", "QUALITY_FILE", "quality_tables", "write_quality"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


__all__ = sorted(_MODULE_OF)
