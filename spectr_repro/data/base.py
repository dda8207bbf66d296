"""What every dataset spec provides, and the shared machinery: sources, prompt styles, seeded selection.

A spec (one small subclass per dataset, in the style of lm-evaluation-harness task configs) declares:

* where the records come from: a hub id (``datasets.load_dataset``) and local file(s) under
  ``$SPECTR_REPRO_DATA`` (a folder laid out like ``shared/datasets``, see its SOURCES.md);
* how a record becomes a prompt for a base model (raw text) or for a chat model (messages, plus an optional
  start of the assistant's reply);
* the stop strings of each style, the reference answer, and (for math) the answer extractor.

Local files are checked against the folder's ``SHA256SUMS`` when it has one (``checksums.py``), and every
reader names the file and the line of anything it cannot parse (``read_jsonl``, ``read_json``,
``read_text_lines``): a damaged file is one ValueError, never a traceback from deep inside a parser.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import json
import os
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from spectr_repro.data.checksums import verify_files
from spectr_repro.errors import HubDataError

DATA_ENV_VAR = "SPECTR_REPRO_DATA"
PROMPT_STYLES = ("auto", "base", "chat")


@dataclass(frozen=True)
class Example:
    """One prompt ready for generation.

    ``prompt`` is the final text. When ``meta["prompt_style"] == "chat"`` the chat template already wrote any
    BOS token, so tokenize it with ``add_special_tokens=False`` (``encode_prompt`` does the right thing).
    ``stop_strings`` end the completion (checked on the generated text only).
    """

    id: str
    prompt: str
    reference: str | None
    stop_strings: tuple[str, ...]
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HubSource:
    """Where a dataset's parquet files live on the HuggingFace hub.

    ``revision`` is a branch or commit of the dataset repository: datasets that ship a loading script
    (which ``datasets`` 4+ refuses to run) are read from the hub's own parquet conversion,
    ``refs/convert/parquet``. ``files`` are glob patterns of the split's parquet files in that revision;
    ``{config}`` is replaced by the config (MGSM's language).
    """

    path: str
    config: str | None
    split: str
    revision: str = "main"
    files: tuple[str, ...] = ()

    def patterns(self, config: str | None = None) -> list[str]:
        config = config if config is not None else self.config
        return [pattern.format(config=config, split=self.split) for pattern in self.files]


class DatasetSpec:
    """Base class of the dataset specs. Subclasses set the class attributes and override the record hooks."""

    name: ClassVar[str]
    description: ClassVar[str]
    hub: ClassVar[HubSource]
    base_stop_strings: ClassVar[tuple[str, ...]] = ()
    chat_stop_strings: ClassVar[tuple[str, ...]] = ()
    option_defaults: ClassVar[dict[str, Any]] = {}
    # What the plan assumes of a prompt's length before any is tokenized (Qwen tokenizer, the records' median
    # rounded; the plan's time estimates only): per-dataset, so a new dataset brings its own.
    typical_prompt_tokens: ClassVar[int] = 100
    # The metric `python -m spectr_repro quality` scores ("pass@1", "exact match"), or None: not scored.
    quality_metric: ClassVar[str | None] = None
    # True: a prompt is cut in the pair's tokens, so examples need the tokenizer (a long-input bucket)
    needs_tokenizer: ClassVar[bool] = False

    # ---- sources -------------------------------------------------------------------------------------
    def local_files(self, data_dir: Path, **options) -> list[Path]:
        """The local files to read (all must exist)."""
        raise NotImplementedError

    def read_local(self, paths: list[Path], **options) -> list[dict]:
        raise NotImplementedError

    def read_hub(self, **options) -> list[dict]:
        """Records from the hub, in the local schema (subclasses remap fields that differ)."""
        return [dict(row) for row in _load_hub(self.hub)]

    def read_fallback(self, **options) -> list[dict] | None:
        """An offline source besides ``$SPECTR_REPRO_DATA`` (e.g. a package's copy), or None."""
        return None

    # ---- records -> prompts ---------------------------------------------------------------------------
    def record_id(self, record: dict, index: int) -> str:
        return f"{self.name}/{index}"

    def base_prompt(self, record: dict) -> str:
        raise NotImplementedError

    def chat_messages(self, record: dict) -> list[dict[str, str]]:
        raise NotImplementedError

    def assistant_prefix(self, record: dict) -> str:
        """Text that starts the assistant's reply in chat style (appended after the generation prompt)."""
        return ""

    def reference(self, record: dict) -> str | None:
        return None

    def prompt_tokens(self, options: dict) -> int | None:
        """The prompt length (tokens) the options fix before tokenizing (a long-input bucket), else None."""
        return None

    def meta(self, record: dict) -> dict:
        return {}

    def extract_answer(self, text: str) -> str | None:
        """The final answer in a completion (math datasets); None for datasets without one."""
        return None

    # ---- driver ---------------------------------------------------------------------------------------
    def resolve_options(self, options: dict) -> dict:
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            allowed = ", ".join(self.option_defaults) or "none"
            raise ValueError(f"dataset {self.name}: unknown option(s) {unknown}; allowed: {allowed}")
        return {**self.option_defaults, **options}

    def load_records(self, data_dir: str | Path | None = None, **options) -> list[dict]:
        """All records, from ``data_dir`` / ``$SPECTR_REPRO_DATA`` when set, else a fallback, else the hub."""
        options = self.resolve_options(options)
        data_dir = data_dir or os.environ.get(DATA_ENV_VAR)
        if data_dir:
            data_dir = Path(data_dir).expanduser()
            paths = self.local_files(data_dir, **options)
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                raise ValueError(
                    f"dataset {self.name}: missing local file(s) {', '.join(missing)} (the data folder "
                    f"comes from {DATA_ENV_VAR}={data_dir}; lay it out like shared/datasets, see SOURCES.md)"
                )
            verify_files(data_dir, paths)
            return self._read_checked(paths, **options)
        fallback = self.read_fallback(**options)
        if fallback is not None:
            return fallback
        try:
            return self.read_hub(**options)
        except Exception as error:  # datasets raises many types for "no network" / "no such dataset"
            raise ValueError(
                f"dataset {self.name}: could not load {self.hub.path!r} from the HuggingFace hub "
                f"({type(error).__name__}: {str(error)[:300]}) and no local copy is set: set {DATA_ENV_VAR} "
                "to a folder laid out like shared/datasets (see its SOURCES.md)"
            ) from error

    def _read_checked(self, paths: list[Path], **options) -> list[dict]:
        """``read_local`` with any parser error left unnamed by the reader turned into one ValueError."""
        try:
            records = self.read_local(paths, **options)
        except (EOFError, zlib.error, gzip.BadGzipFile, csv.Error, UnicodeDecodeError) as error:
            files = ", ".join(str(p) for p in paths)
            raise ValueError(f"dataset {self.name}: cannot read {files} ({type(error).__name__}: {error})") from error
        if not records:
            raise ValueError(f"dataset {self.name}: no records in {', '.join(str(p) for p in paths)}")
        return records

    def to_example(self, record: dict, index: int, tokenizer=None, style: str = "base") -> Example:
        if style == "chat":
            prompt = apply_chat_template(tokenizer, self.chat_messages(record)) + self.assistant_prefix(
                record
            )
            stops = self.chat_stop_strings
        else:
            prompt, stops = self.base_prompt(record), self.base_stop_strings
        return Example(
            id=self.record_id(record, index),
            prompt=prompt,
            reference=self.reference(record),
            stop_strings=tuple(stops),
            meta={"dataset": self.name, "index": index, "prompt_style": style, **self.meta(record)},
        )


# ---- readers that name the file and line of what they cannot parse -----------------------------------
def _record(path: Path, where: str, record: Any, required: Sequence[str]) -> dict:
    if not isinstance(record, dict):
        raise ValueError(f"{path}, {where}: expected a JSON object, got {type(record).__name__}")
    missing = [key for key in required if not isinstance(record.get(key), str)]
    if missing:
        raise ValueError(f"{path}, {where}: record lacks the text field(s) {missing} (has {sorted(record)[:8]})")
    return record


def read_jsonl(path: Path, required: Sequence[str] = ()) -> list[dict]:
    """The records of a JSON Lines file (gzip-compressed when its name ends in ``.gz``), each a JSON object
    with the ``required`` string fields; ValueError naming the file and line otherwise."""
    opener = gzip.open if path.suffix == ".gz" else open
    records, number = [], 0
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(
                        f"{path}, line {number}: not valid JSON ({error.msg}, column {error.colno}); "
                        "the file is truncated or damaged"
                    ) from None
                records.append(_record(path, f"line {number}", record, required))
    except (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path}: unreadable after line {number} ({type(error).__name__}: {error}); the file is truncated "
            "or damaged"
        ) from None
    return records


def read_json(path: Path, required: Sequence[str] = ()) -> list[dict]:
    """A JSON file holding a list of objects with the ``required`` string fields (ValueError naming the
    file, and the line and column of a syntax error)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}, line {error.lineno} column {error.colno}: not valid JSON ({error.msg}); the file is "
            "truncated or damaged"
        ) from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 at byte {error.start}; the file is damaged") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return [_record(path, f"record {i}", record, required) for i, record in enumerate(data)]


def read_text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file without their newlines (universal newlines, as text-mode ``open``);
    ValueError naming the line of bytes that are not UTF-8."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 (byte {error.start}); the file is damaged") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines



def fetch_hub_files(repo: str, revision: str, patterns: list[str]) -> list[Path]:
    """Local paths of the files matching ``patterns`` in the dataset repository ``repo`` at ``revision``.

    The one function that reaches the hub: ``huggingface_hub.snapshot_download`` (which answers from the
    local HF cache when the hub is offline, HF_HUB_OFFLINE=1 or no network).
    """
    from huggingface_hub import constants, snapshot_download  # hub/datasets: only a download pays
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError  # hub/datasets: only a download pays

    where = f"{repo}@{revision}"
    try:
        folder = Path(snapshot_download(repo, repo_type="dataset", revision=revision, allow_patterns=patterns,
                                        local_files_only=bool(constants.HF_HUB_OFFLINE)))
    except LocalEntryNotFoundError:
        raise HubDataError(f"{where} is not in the local HF cache ({constants.HF_HUB_CACHE}) and the hub cannot "
                           "be reached (offline or no network)") from None
    except HfHubHTTPError as error:
        raise HubDataError(f"{where}: the hub answered {' '.join(str(error).split())[:200]}") from None
    files = sorted({path for pattern in patterns for path in folder.glob(pattern) if path.is_file()})
    if not files:
        raise HubDataError(f"{where} has no files matching {patterns} (in {folder})")
    return files


def _load_hub(source: HubSource, config: str | None = None) -> list[dict]:
    """The rows of ``source``'s split (``config`` overrides its config), read from its parquet files with the
    installed ``datasets`` (its parquet builder: no loading script is ever run)."""
    import datasets  # hub/datasets: only a download pays

    files = fetch_hub_files(source.path, source.revision, source.patterns(config))
    table = datasets.load_dataset("parquet", data_files={"rows": [str(f) for f in files]}, split="rows")
    return [dict(row) for row in table]


def resolve_prompt_style(prompt_style: str, tokenizer) -> str:
    """``auto``: chat when the tokenizer has a chat template, else base; ``chat`` requires a template."""
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if prompt_style == "chat" and not has_template:
        raise ValueError("prompt_style='chat' needs a tokenizer with a chat template")
    if prompt_style == "auto":
        return "chat" if has_template else "base"
    return prompt_style


def apply_chat_template(tokenizer, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise ValueError(f"apply_chat_template returned {type(text).__name__}, expected the prompt text")
    return text


def select_indices(num_records: int, num_prompts: int | None, seed: int) -> list[int]:
    """``num_prompts`` record indices drawn without replacement from a seeded permutation.

    The permutation depends on ``seed`` and ``num_records`` only, so every method of a sweep gets the same
    prompts, and a larger ``num_prompts`` extends a smaller one. ``None`` keeps every record in file order.
    """
    if num_prompts is None:
        return list(range(num_records))
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1 (or None for all), got {num_prompts}")
    if num_prompts > num_records:
        raise ValueError(f"num_prompts={num_prompts} but the dataset has only {num_records} records")
    order = list(range(num_records))
    random.Random(seed).shuffle(order)
    return order[:num_prompts]


def parse_choice(value: str | Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    """``"all"``, one value, a comma list or a list, each checked against ``allowed``."""
    if isinstance(value, str):
        values = list(allowed) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    else:
        values = list(value)
    for item in values:
        if item not in allowed:
            close = difflib.get_close_matches(item, allowed, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown {what} {item!r}{hint} (choose from {', '.join(allowed)} or 'all')")
    if not values:
        raise ValueError(f"no {what} given")
    return values
