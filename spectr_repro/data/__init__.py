"""Datasets by name: ``load_examples("gsm8k", num_prompts=8, seed=0, tokenizer=tok) -> list[Example]``.

One small spec per dataset (``humaneval``, ``gsm8k``, ``mgsm``, ``lm1b``, ``alpaca``; ``longcode``: long inputs
cut from the standard library at a bucket of tokens, ``data/longcode.py``) says where the records
come from (``$SPECTR_REPRO_DATA`` local copies first, then a package copy, then the HuggingFace hub), how a
record becomes a prompt for a base model or a chat model, its stop strings, reference answer and answer
extractor. Configs: ``conf/dataset/<name>.yaml`` (``name``, ``prompt_style``, ``options``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

import yaml

from spectr_repro.data.alpaca import Alpaca
from spectr_repro.data.answers import answers_match, extract_number_answer, normalize_number
from spectr_repro.data.base import (
    DATA_ENV_VAR,
    PROMPT_STYLES,
    DatasetSpec,
    Example,
    resolve_prompt_style,
    select_indices,
)
from spectr_repro.data.gsm8k import GSM8K
from spectr_repro.data.humaneval import HumanEval
from spectr_repro.data.lm1b import LM1B
from spectr_repro.data.longcode import LongCode
from spectr_repro.data.mgsm import LANGUAGES as MGSM_LANGUAGES
from spectr_repro.data.mgsm import MGSM

# The one dataset registry: its order is the order of every table and figure; the plan, the analysis and the
# quality scorer read their per-dataset facts (typical prompt length, quality metric) from the specs.
DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in (HumanEval(), GSM8K(), MGSM(), LM1B(), Alpaca(), LongCode())
}
DATASET_ORDER: tuple[str, ...] = tuple(DATASETS)
QUALITY_DATASETS: tuple[str, ...] = tuple(name for name, spec in DATASETS.items() if spec.quality_metric)
# How a dataset config orders its records before num_prompts are taken (see load_examples).
PROMPT_ORDERS = ("seeded", "file")


def get_dataset(name: str) -> DatasetSpec:
    """The spec named ``name`` (ValueError naming the closest names otherwise)."""
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown dataset {name!r}{hint} (known: {', '.join(DATASETS)})")
    return DATASETS[name]


def load_examples(
    dataset: str | Mapping,
    num_prompts: int | None,
    seed: int = 0,
    tokenizer=None,
    prompt_style: str | None = None,
    data_dir: str | Path | None = None,
    **dataset_options,
) -> list[Example]:
    """``num_prompts`` examples drawn from a seeded permutation of the dataset (None: all, in file order).

    ``dataset`` is a name or a dataset config (``name``, optional ``prompt_style`` and ``options``); explicit
    arguments override the config. ``prompt_style``: ``auto`` (default; chat template when ``tokenizer`` has
    one), ``base`` (raw text) or ``chat`` (force the template). A config may also set ``prompt_order``
    (``seeded``, the default, or ``file``: the records in file order, whatever the seed) and ``skip_prompts``
    (the first n of that order are left out, e.g. a warm-up prompt a published setting does not report).
    """
    prompt_order, skip = "seeded", 0
    if isinstance(dataset, Mapping):
        config = dict(dataset)
        name = config.get("name")
        if name is None:
            raise ValueError(f"dataset config lacks 'name': {config}")
        dataset_options = {**dict(config.get("options") or {}), **dataset_options}
        prompt_style = prompt_style or config.get("prompt_style")
        prompt_order, skip = config.get("prompt_order") or "seeded", int(config.get("skip_prompts") or 0)
    else:
        name = dataset
    spec = get_dataset(name)
    style = resolve_prompt_style(prompt_style or "auto", tokenizer)
    records = spec.load_records(data_dir, **dataset_options)
    indices = _prompt_indices(len(records), num_prompts, seed, prompt_order, skip)
    return [spec.to_example(records[i], i, tokenizer, style) for i in indices]


def _prompt_indices(num_records: int, num_prompts: int | None, seed: int, prompt_order: str, skip: int) -> list[int]:
    """The record indices of a dataset config's prompts: ``num_prompts`` after the first ``skip`` of the order."""
    if prompt_order not in PROMPT_ORDERS:
        raise ValueError(f"unknown prompt_order {prompt_order!r}; known: {', '.join(PROMPT_ORDERS)}")
    if skip < 0:
        raise ValueError(f"skip_prompts must be >= 0, got {skip}")
    if prompt_order == "file":
        order = select_indices(num_records, None, seed)
        if num_prompts is not None and not 1 <= num_prompts <= num_records - skip:
            raise ValueError(f"num_prompts={num_prompts} after skip_prompts={skip} but the dataset has only "
                             f"{num_records} records")
        return order[skip:][:num_prompts] if num_prompts is not None else order[skip:]
    if num_prompts is None:
        return select_indices(num_records, None, seed)[skip:]
    return select_indices(num_records, num_prompts + skip, seed)[skip:]


def typical_prompt_tokens(name: str) -> int:
    """The prompt length the plan assumes for dataset config ``name`` (100 for a name not registered): a bucket's
    own length for a config of a long-input dataset (``conf/dataset/longcode_4k.yaml``: its ``tokens``)."""
    if name in DATASETS:
        return DATASETS[name].typical_prompt_tokens
    config = _packaged_dataset_config(name)
    if config is not None and config.get("name") in DATASETS:
        declared = declared_prompt_tokens(config)
        return declared if declared is not None else DATASETS[config["name"]].typical_prompt_tokens
    return DatasetSpec.typical_prompt_tokens


def bucket_tokens(name: str) -> int | None:
    """The input length a packaged dataset config fixes (``longcode_4k``: 4096), None for any other dataset."""
    config = _packaged_dataset_config(name)
    if config is None or config.get("name") not in DATASETS:
        return None
    return declared_prompt_tokens(config)


def _packaged_dataset_config(name: str) -> dict | None:
    """The packaged ``conf/dataset/<name>.yaml`` as a dict (read as a file: data sits below the configs' users), or
    None when there is none or it cannot be read."""
    path = Path(__file__).resolve().parent.parent / "conf" / "dataset" / f"{name}.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return config if isinstance(config, dict) else None


def declared_prompt_tokens(dataset: Mapping) -> int | None:
    """The prompt length a dataset config fixes before any tokenizer runs (a long-input bucket's ``tokens``), or
    None (the prompts' lengths are known once tokenized): what the context and memory checks provision."""
    spec = get_dataset(str(dataset.get("name")))
    return spec.prompt_tokens(dict(dataset.get("options") or {}))


def encode_prompt(tokenizer, example: Example):
    """Token ids [1, T] of ``example.prompt``: special tokens added for base prompts only (the chat template
    already wrote them)."""
    add_special = example.meta.get("prompt_style") != "chat"
    return tokenizer(example.prompt, add_special_tokens=add_special, return_tensors="pt").input_ids


__all__ = [
    "DATASETS",
    "DATASET_ORDER",
    "DATA_ENV_VAR",
    "PROMPT_STYLES",
    "QUALITY_DATASETS",
    "DatasetSpec",
    "Example",
    "MGSM_LANGUAGES",
    "answers_match",
    "bucket_tokens",
    "declared_prompt_tokens",
    "encode_prompt",
    "extract_number_answer",
    "get_dataset",
    "load_examples",
    "normalize_number",
    "typical_prompt_tokens",
]
