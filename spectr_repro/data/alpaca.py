"""Alpaca instructions (Taori et al. 2023): the full 52K file when present locally, else the first 5,000."""

from __future__ import annotations

from spectr_repro.data.base import DatasetSpec, HubSource, read_json

# The standard Alpaca prompt templates (tatsu-lab/stanford_alpaca, train.py PROMPT_DICT).
PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


class Alpaca(DatasetSpec):
    name = "alpaca"
    typical_prompt_tokens = 90
    description = (
        "Alpaca instructions with optional input (local: alpaca_data.json, else the 5,000-record head)"
    )
    hub = HubSource("tatsu-lab/alpaca", None, "train", "main", ("data/train-*.parquet",))
    base_stop_strings = ("\n### ",)  # the model starting another "### Instruction:" block

    def local_files(self, data_dir, **options):
        full = data_dir / "alpaca" / "alpaca_data.json"
        return [full if full.is_file() else data_dir / "alpaca" / "alpaca_data_head.json"]

    def read_local(self, paths, **options):
        return read_json(paths[0], ("instruction", "input", "output"))

    def read_hub(self, **options):
        return [{key: row[key] for key in ("instruction", "input", "output")} for row in super().read_hub()]

    def base_prompt(self, record):
        template = PROMPT_WITH_INPUT if record.get("input") else PROMPT_NO_INPUT
        return template.format(instruction=record["instruction"], input=record.get("input", ""))

    def chat_messages(self, record):
        content = record["instruction"]
        if record.get("input"):
            content += "\n\n" + record["input"]
        return [{"role": "user", "content": content}]

    def reference(self, record):
        return record["output"]
