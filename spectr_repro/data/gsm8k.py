"""GSM8K test set (1,319 grade-school math word problems; Cobbe et al. 2021)."""

from __future__ import annotations

from spectr_repro.data.answers import extract_number_answer
from spectr_repro.data.base import DatasetSpec, HubSource, read_jsonl

# What instruct models are asked, and what the answer extractor looks for first.
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class GSM8K(DatasetSpec):
    name = "gsm8k"
    typical_prompt_tokens = 120
    quality_metric = "exact match"
    description = "GSM8K test: grade-school math word problems, numeric answers"
    hub = HubSource("openai/gsm8k", "main", "test", "main", ("{config}/test-*.parquet",))
    base_stop_strings = ("Question:", "\n\n\n")

    def local_files(self, data_dir, **options):
        return [data_dir / "gsm8k" / "test.jsonl"]

    def read_local(self, paths, **options):
        return read_jsonl(paths[0], ("question", "answer"))

    def base_prompt(self, record):
        return f"Question: {record['question']}\nAnswer:"

    def chat_messages(self, record):
        return [{"role": "user", "content": f"{record['question']}\n{MATH_INSTRUCTION}"}]

    def reference(self, record):
        # The reference solution ends with "#### <number>".
        return extract_number_answer(record["answer"])

    def meta(self, record):
        return {"solution": record["answer"]}

    def extract_answer(self, text):
        return extract_number_answer(text)
