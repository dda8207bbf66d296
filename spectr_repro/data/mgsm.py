"""MGSM: 250 GSM8K test problems translated into 10 languages (+ English; Shi et al. 2022)."""

from __future__ import annotations

import csv
import re

from spectr_repro.data.answers import NUMBER, extract_number_answer, normalize_number
from spectr_repro.data.base import DatasetSpec, HubSource, _load_hub, parse_choice
from spectr_repro.data.gsm8k import MATH_INSTRUCTION

LANGUAGES = ("bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh")
_ANSWER = re.compile(NUMBER)  # the whole answer column: "18", "2,125"; "5,60" (a cut "5,600") is refused


class MGSM(DatasetSpec):
    name = "mgsm"
    typical_prompt_tokens = 120
    quality_metric = "exact match"
    description = "MGSM: multilingual grade-school math (language option: one code, a comma list or 'all')"
    # juletxara/mgsm shipped a loading script: read the hub's parquet conversion, one folder per language.
    hub = HubSource("juletxara/mgsm", "en", "test", "refs/convert/parquet", ("{config}/test/*.parquet",))
    base_stop_strings = ("Question:", "\n\n\n")
    option_defaults = {"language": "en"}

    def local_files(self, data_dir, language="en", **options):
        return [
            data_dir / "mgsm" / f"mgsm_{lang}.tsv" for lang in parse_choice(language, LANGUAGES, "language")
        ]

    def read_local(self, paths, **options):
        records = []
        for path in paths:
            lang = path.stem.removeprefix("mgsm_")
            # No header; two columns (question, answer). QUOTE_NONE: questions contain bare quote marks.
            with open(path, encoding="utf-8", newline="") as handle:
                reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
                for row_index, row in enumerate(reader):
                    if len(row) != 2:
                        raise ValueError(f"{path}, line {reader.line_num}: expected 2 tab-separated columns "
                                         f"(question, answer), got {len(row)}")
                    question, answer = row
                    if _ANSWER.fullmatch(answer.strip()) is None:
                        raise ValueError(f"{path}, line {reader.line_num}: answer {answer!r} is not a number "
                                         "(the file is truncated or damaged)")
                    records.append({"language": lang, "row": row_index, "question": question, "answer": answer})
        return records

    def read_hub(self, language="en", **options):
        records = []
        for lang in parse_choice(language, LANGUAGES, "language"):
            for row_index, row in enumerate(_load_hub(self.hub, config=lang)):
                records.append(
                    {
                        "language": lang,
                        "row": row_index,
                        "question": row["question"],
                        "answer": str(row["answer_number"]),
                    }
                )
        return records

    def record_id(self, record, index):
        return f"mgsm_{record['language']}/{record['row']}"

    def base_prompt(self, record):
        # The English form of MGSM's own exemplar format ("Question: ... Step-by-Step Answer: ...").
        return f"Question: {record['question']}\nStep-by-Step Answer:"

    def chat_messages(self, record):
        return [{"role": "user", "content": f"{record['question']}\n{MATH_INSTRUCTION}"}]

    def reference(self, record):
        return normalize_number(record["answer"])  # "2,125" -> "2125"

    def meta(self, record):
        return {"language": record["language"]}

    def extract_answer(self, text):
        return extract_number_answer(text)
