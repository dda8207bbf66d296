"""Dataset loaders on the local copies (shared/datasets): counts, prompt formats, stop strings, references,
answer extraction, seeded selection and the error messages."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from spectr_repro import data
from spectr_repro.conf import conf_dir
from spectr_repro.data import DATASETS, encode_prompt, get_dataset, load_examples
from spectr_repro.data.base import select_indices

REPO = Path(__file__).resolve().parents[2]


def _local_data_dir() -> Path | None:
    configured = os.environ.get("SPECTR_REPRO_DATA")
    candidates = [Path(configured)] if configured else []
    candidates.append(REPO.parent / "shared" / "datasets")
    return next((path for path in candidates if (path / "SOURCES.md").is_file()), None)


DATA_DIR = _local_data_dir()
needs_data = pytest.mark.skipif(
    DATA_DIR is None,
    reason="no local dataset copies: set SPECTR_REPRO_DATA to a folder laid out like shared/datasets",
)


@pytest.fixture(autouse=True)
def _point_at_local_data(monkeypatch):
    if DATA_DIR is not None:
        monkeypatch.setenv("SPECTR_REPRO_DATA", str(DATA_DIR))


@pytest.fixture(scope="module")
def chat_tokenizer():
    from spectr_repro.models.tiny import make_byte_tokenizer

    return make_byte_tokenizer()  # has a minimal chat template: <|user|>\n...\n<|assistant|>\n


# ---- counts --------------------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize(
    "name, options, count",
    [
        ("humaneval", {}, 164),
        ("gsm8k", {}, 1319),
        ("mgsm", {}, 250),
        ("mgsm", {"language": "all"}, 2750),
        ("mgsm", {"language": "de,ja"}, 500),
        ("alpaca", {}, 5000),
    ],
)
def test_record_counts(name, options, count):
    assert len(get_dataset(name).load_records(**options)) == count


@needs_data
def test_lm1b_keeps_sentences_long_enough_to_split():
    lines = (DATA_DIR / "lm1b" / "news.en.heldout-00000-of-00050").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6075
    expected = sum(len(line.split()) >= 4 for line in lines)
    records = get_dataset("lm1b").load_records()
    assert len(records) == expected and 6000 < expected < 6075
    assert len(get_dataset("lm1b").load_records(min_words=1)) == sum(bool(line.split()) for line in lines)


# ---- prompt formats (base style: raw text) -------------------------------------------------------
@needs_data
def test_humaneval_base_prompt_is_the_function_header():
    [example] = [e for e in load_examples("humaneval", None) if e.id == "HumanEval/0"]
    assert example.prompt.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert example.prompt.rstrip().endswith('"""')
    assert example.stop_strings == ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
    assert example.reference.lstrip().startswith("for idx, elem in enumerate(numbers):")
    assert (
        example.meta["entry_point"] == "has_close_elements" and "def check(candidate)" in example.meta["test"]
    )


@needs_data
def test_humaneval_package_copy_matches_local():
    local = get_dataset("humaneval").load_records()
    packaged = get_dataset("humaneval").read_fallback()
    assert packaged == local


@needs_data
def test_gsm8k_base_prompt_and_reference():
    example = load_examples("gsm8k", None)[0]
    assert example.id == "gsm8k/0"
    assert example.prompt.startswith("Question: Janet’s ducks lay 16 eggs per day.")
    assert example.prompt.endswith("?\nAnswer:")
    assert example.reference == "18"
    assert "Question:" in example.stop_strings


@needs_data
def test_mgsm_base_prompt_reference_and_languages():
    examples = load_examples("mgsm", None, language="all")
    by_id = {e.id: e for e in examples}
    english = by_id["mgsm_en/0"]
    assert english.prompt.startswith("Question: Janet’s ducks lay 16 eggs per day.")
    assert english.prompt.endswith("\nStep-by-Step Answer:")
    assert english.reference == "18" and english.meta["language"] == "en"
    # Thousands commas in the tsv (1-based rows 147, 202, 231, 250) are stripped from the reference.
    assert [by_id[f"mgsm_zh/{row - 1}"].reference for row in (147, 202, 231, 250)] == [
        "2125",
        "114200",
        "276000",
        "5600",
    ]
    assert {e.meta["language"] for e in examples} == set(data.MGSM_LANGUAGES)


@needs_data
def test_lm1b_prompt_is_first_half_of_the_words():
    first_line = (
        (DATA_DIR / "lm1b" / "news.en.heldout-00000-of-00050").open(encoding="utf-8").readline().split()
    )
    example = load_examples("lm1b", None)[0]
    assert example.id == "lm1b/0"
    half = len(first_line) // 2
    assert (
        example.prompt == " ".join(first_line[:half]) == "Having a little flexibility on that issue would go"
    )
    assert example.reference == " ".join(first_line[half:])
    assert example.stop_strings == ("\n",)


@needs_data
def test_alpaca_template_with_and_without_input():
    examples = load_examples("alpaca", None)
    first = examples[0]  # "Give three tips for staying healthy." has no input
    assert first.prompt == (
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nGive three tips for staying healthy.\n\n### Response:\n"
    )
    records = get_dataset("alpaca").load_records()
    with_input = next(i for i, r in enumerate(records) if r["input"])
    prompt = examples[with_input].prompt
    assert prompt.startswith("Below is an instruction that describes a task, paired with an input")
    assert (
        f"### Instruction:\n{records[with_input]['instruction']}\n\n"
        f"### Input:\n{records[with_input]['input']}"
        "\n\n### Response:\n" in prompt
    )
    assert examples[with_input].reference == records[with_input]["output"]


# ---- chat style ----------------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize("name", [name for name, spec in DATASETS.items() if not spec.needs_tokenizer])
def test_auto_style_uses_the_chat_template(name, chat_tokenizer):
    base = load_examples(name, 3, seed=1)
    chat = load_examples(name, 3, seed=1, tokenizer=chat_tokenizer)
    assert [e.id for e in base] == [e.id for e in chat]
    for b, c in zip(base, chat):
        assert c.meta["prompt_style"] == "chat" and b.meta["prompt_style"] == "base"
        assert c.prompt.startswith("<|bos|><|user|>\n") and "<|assistant|>\n" in c.prompt
        assert c.reference == b.reference
    forced_base = load_examples(name, 3, seed=1, tokenizer=chat_tokenizer, prompt_style="base")
    assert [e.prompt for e in forced_base] == [e.prompt for e in base]


@needs_data
def test_humaneval_chat_reply_starts_with_the_code():
    from spectr_repro.models.tiny import make_byte_tokenizer

    example = load_examples("humaneval", 1, tokenizer=make_byte_tokenizer())[0]
    record = next(r for r in get_dataset("humaneval").load_records() if r["task_id"] == example.id)
    assert example.prompt.endswith("<|assistant|>\n```python\n" + record["prompt"])
    assert "\n```" in example.stop_strings


@needs_data
def test_encode_prompt_adds_special_tokens_for_base_only(chat_tokenizer):
    chat = load_examples("gsm8k", 1, tokenizer=chat_tokenizer)[0]
    base = load_examples("gsm8k", 1, tokenizer=chat_tokenizer, prompt_style="base")[0]
    chat_ids = encode_prompt(chat_tokenizer, chat)[0].tolist()
    assert chat_ids.count(chat_tokenizer.bos_token_id) <= 1  # never a doubled BOS
    assert chat_tokenizer.decode(chat_ids) == chat.prompt
    assert encode_prompt(chat_tokenizer, base).shape[0] == 1


def test_chat_style_requires_a_template():
    with pytest.raises(ValueError, match="chat template"):
        load_examples("gsm8k", 1, prompt_style="chat")
    with pytest.raises(ValueError, match="prompt_style"):
        load_examples("gsm8k", 1, prompt_style="instruct")


# ---- answers -------------------------------------------------------------------------------------
@needs_data
def test_gsm8k_extraction_recovers_every_reference_answer():
    spec = get_dataset("gsm8k")
    records = spec.load_records()
    # Independent reading of the reference: the text after "####", commas removed.
    expected = [r["answer"].split("####")[-1].strip().replace(",", "") for r in records]
    assert all(e.lstrip("-").isdigit() for e in expected)
    extracted = [spec.extract_answer(r["answer"]) for r in records]
    accuracy = sum(x == e for x, e in zip(extracted, expected)) / len(records)
    assert accuracy == 1.0
    assert [spec.reference(r) for r in records] == expected


@needs_data
def test_mgsm_extraction_recovers_every_exemplar_answer_in_every_language():
    spec = get_dataset("mgsm")
    exemplars = json.loads((DATA_DIR / "mgsm" / "mgsm_exemplars.json").read_text(encoding="utf-8"))
    numbers = [str(n) for n in exemplars["EXEMPLAR_NUMBER_ANSWERS"]]
    for lang, shots in exemplars["MGSM_EXEMPLARS"].items():
        extracted = [spec.extract_answer(shots[str(i + 1)]["a"]) for i in range(8)]
        assert extracted == numbers, lang


@needs_data
def test_mgsm_reference_answers_score_perfectly():
    spec = get_dataset("mgsm")
    for path in sorted((DATA_DIR / "mgsm").glob("mgsm_*.tsv")):
        with open(path, encoding="utf-8", newline="") as handle:
            raw = [row[1] for row in csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]
        records = spec.load_records(language=path.stem.removeprefix("mgsm_"))
        assert len(records) == 250
        hits = [
            data.answers_match(spec.extract_answer(f"The answer is {answer}."), spec.reference(record))
            for answer, record in zip(raw, records)
        ]
        assert sum(hits) == 250
        assert all(int(spec.reference(r)) == int(a.replace(",", "")) for r, a in zip(records, raw))


# ---- selection and errors ------------------------------------------------------------------------
def test_selection_is_seeded_nested_and_bounded():
    assert select_indices(100, 10, seed=3) == select_indices(100, 10, seed=3)
    assert select_indices(100, 10, seed=3) != select_indices(100, 10, seed=4)
    assert select_indices(100, 20, seed=3)[:10] == select_indices(100, 10, seed=3)
    assert len(set(select_indices(100, 100, seed=0))) == 100
    assert select_indices(5, None, seed=0) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="only 5 records"):
        select_indices(5, 6, seed=0)
    with pytest.raises(ValueError, match=">= 1"):
        select_indices(5, 0, seed=0)


@needs_data
def test_same_prompts_for_the_same_seed():
    assert [e.id for e in load_examples("alpaca", 8, seed=7)] == [
        e.id for e in load_examples("alpaca", 8, seed=7)
    ]
    assert [e.id for e in load_examples("alpaca", 8, seed=7)] != [
        e.id for e in load_examples("alpaca", 8, seed=8)
    ]


def test_unknown_dataset_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean gsm8k"):
        get_dataset("gsm8")
    with pytest.raises(ValueError, match="unknown language 'eng'"):
        load_examples("mgsm", 1, language="eng")
    with pytest.raises(ValueError, match="unknown option"):
        load_examples("gsm8k", 1, langauge="en")


def test_missing_local_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"missing local file.*gsm8k/test.jsonl.*SPECTR_REPRO_DATA"):
        load_examples("gsm8k", 1, data_dir=tmp_path)


def test_unreachable_hub_without_local_copy_says_what_to_set(monkeypatch):
    monkeypatch.delenv("SPECTR_REPRO_DATA", raising=False)

    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(data.base, "_load_hub", offline)
    with pytest.raises(ValueError, match=r"could not load 'openai/gsm8k'.*set SPECTR_REPRO_DATA"):
        load_examples("gsm8k", 1)


def test_dataset_configs_name_their_dataset():
    from omegaconf import OmegaConf

    for name in DATASETS:
        cfg = OmegaConf.load(conf_dir() / "dataset" / f"{name}.yaml")
        # a long-input dataset feeds raw code (base); the others follow the tokenizer (auto)
        assert cfg.name == name and cfg.prompt_style == ("base" if DATASETS[name].needs_tokenizer else "auto")
        get_dataset(name).resolve_options(dict(cfg.options))  # options are all known


@needs_data
def test_load_from_a_dataset_config():
    examples = load_examples({"name": "mgsm", "prompt_style": "base", "options": {"language": "fr"}}, 2)
    assert all(e.id.startswith("mgsm_fr/") for e in examples)


@needs_data
def test_load_from_the_composed_hydra_config():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="config", overrides=["dataset=mgsm", "dataset.options.language=[de,fr]"])
    examples = load_examples(cfg.dataset, 6, seed=cfg.seed)
    assert len(examples) == 6 and {e.meta["language"] for e in examples} <= {"de", "fr"}


def test_file_order_takes_the_first_records_whatever_the_seed():
    """prompt_order=file: the first records in file order, the same for every seed; skip_prompts drops the
    first n (a published warm-up prompt); seeded order skips within its own permutation."""
    config = {"name": "humaneval", "prompt_order": "file", "skip_prompts": 1}
    ids = [e.id for e in load_examples(config, 4, seed=1001)]
    assert ids == ["HumanEval/1", "HumanEval/2", "HumanEval/3", "HumanEval/4"]
    assert [e.id for e in load_examples(config, 4, seed=1002)] == ids
    seeded = [e.id for e in load_examples({"name": "humaneval"}, 5, seed=3)]
    assert [e.id for e in load_examples({"name": "humaneval", "skip_prompts": 1}, 4, seed=3)] == seeded[1:]
    assert seeded[:4] != ["HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/3"]  # seeded is not file order


@pytest.mark.parametrize("config, message", [
    ({"name": "humaneval", "prompt_order": "sorted"}, "unknown prompt_order 'sorted'"),
    ({"name": "humaneval", "prompt_order": "file", "skip_prompts": 160}, "after skip_prompts=160"),
    ({"name": "humaneval", "skip_prompts": -1}, "skip_prompts must be >= 0"),
])
def test_bad_prompt_order_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        load_examples(config, 8)
