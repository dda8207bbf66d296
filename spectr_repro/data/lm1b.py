"""LM1B (One Billion Word benchmark), held-out shard 0: continue the first half of a news sentence."""

from __future__ import annotations

from spectr_repro.data.base import DatasetSpec, HubSource, read_text_lines


class LM1B(DatasetSpec):
    name = "lm1b"
    typical_prompt_tokens = 40
    description = "LM1B held-out sentences: the prompt is the first half of the words, the reference the rest"
    # The hub's lm1b ships a loading script: read the hub's parquet conversion (any config folder: one config).
    hub = HubSource("lm1b", None, "test", "refs/convert/parquet", ("*/test/*.parquet",))
    base_stop_strings = ("\n",)  # one sentence per line
    chat_stop_strings = ("\n",)
    # Shorter sentences leave too little to continue (a 3-word sentence gives a 1-word prompt).
    option_defaults = {"min_words": 4}

    def local_files(self, data_dir, **options):
        return [data_dir / "lm1b" / "news.en.heldout-00000-of-00050"]

    def read_local(self, paths, min_words=4, **options):
        return self._split(read_text_lines(paths[0]), min_words)

    def read_hub(self, min_words=4, **options):
        return self._split([row["text"] for row in super().read_hub()], min_words)

    @staticmethod
    def _split(lines, min_words):
        records = []
        for line_index, line in enumerate(lines):
            words = line.split()
            if len(words) < min_words:
                continue
            half = len(words) // 2
            records.append(
                {"line": line_index, "prefix": " ".join(words[:half]), "continuation": " ".join(words[half:])}
            )
        return records

    def record_id(self, record, index):
        return f"lm1b/{record['line']}"

    def base_prompt(self, record):
        return record["prefix"]

    def chat_messages(self, record):
        return [
            {
                "role": "user",
                "content": "Continue the following sentence. Reply with the continuation only."
                f"\n\n{record['prefix']}",
            }
        ]

    def reference(self, record):
        return record["continuation"]
