"""The long-input dataset (spectr_repro/data/longcode.py): deterministic, cut within tolerance at a token boundary
(never inside a multi-byte character), every source file checked against the manifest (one message naming a damaged
file), buckets as dataset configs of the one registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectr_repro.data import DATASETS, declared_prompt_tokens, encode_prompt, load_examples, typical_prompt_tokens
from spectr_repro.data.longcode import (
    LongCode,
    cut_to_tokens,
    repository_text,
    stdlib_root,
    tolerance,
    write_manifest,
)
from spectr_repro.models.tiny import make_byte_tokenizer


@pytest.fixture(scope="module")
def byte_tokenizer():
    return make_byte_tokenizer()  # one token per byte: the hardest case for cutting at a character boundary


def _bucket(tokens: int, min_tokens: int | None = 8192) -> dict:
    return {"name": "longcode", "prompt_style": "base", "options": {"tokens": tokens, "min_tokens": min_tokens}}


def test_the_same_seed_gives_the_same_prompts_and_another_seed_others(byte_tokenizer):
    first = load_examples(_bucket(1024), 4, seed=0, tokenizer=byte_tokenizer)
    again = load_examples(_bucket(1024), 4, seed=0, tokenizer=byte_tokenizer)
    other = load_examples(_bucket(1024), 4, seed=1, tokenizer=byte_tokenizer)
    ids = [encode_prompt(byte_tokenizer, e)[0].tolist() for e in first]
    assert [e.id for e in first] == [e.id for e in again]
    assert ids == [encode_prompt(byte_tokenizer, e)[0].tolist() for e in again]
    assert [e.id for e in other] != [e.id for e in first]  # the seed does choose (the check above could not pass
    # by ignoring the seed's effect)


@pytest.mark.parametrize("tokens", [1024, 4096])
def test_prompts_are_cut_within_tolerance_as_a_prefix_of_the_repository(tokens, byte_tokenizer):
    spec = DATASETS["longcode"]
    records = {spec.record_id(r, 0): r for r in spec.load_records(tokens=tokens, min_tokens=8192)}
    for example in load_examples(_bucket(tokens), 3, seed=0, tokenizer=byte_tokenizer):
        length = encode_prompt(byte_tokenizer, example).shape[1]
        assert tokens - tolerance(tokens) <= length <= tokens
        assert example.meta["prompt_tokens"] == length and example.meta["bucket_tokens"] == tokens
        record = records[example.id]
        assert repository_text(Path(record["root"]), record["files"]).startswith(example.prompt)


def test_buckets_of_one_pool_draw_the_same_repositories_and_nest(byte_tokenizer):
    short = load_examples(_bucket(1024), 3, seed=0, tokenizer=byte_tokenizer)
    long = load_examples(_bucket(4096), 3, seed=0, tokenizer=byte_tokenizer)
    assert [e.id for e in short] == [e.id for e in long]
    assert all(b.prompt.startswith(a.prompt) and len(b.prompt) > len(a.prompt) for a, b in zip(short, long))


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "Lib"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root, write_manifest(root, tmp_path / "manifest.json")


def test_a_cut_never_falls_inside_a_multibyte_character(tmp_path, byte_tokenizer):
    # Two-, three- and four-byte characters between ASCII: with one token per byte, most token counts end inside a
    # character, and the cut must back off to the character's start.
    line = "s = 'é日本🙂x'  # ünïcödé\n"
    root, manifest = _tree(tmp_path, {"pkg/__init__.py": line * 400})
    spec = LongCode(root=root, manifest=manifest)
    text = repository_text(root, spec.load_records(tokens=512)[0]["files"])
    inside = 0
    for tokens in range(300, 340):
        raw = text.encode("utf-8")[:tokens - 1]  # what a byte-level cut would keep (one BOS token aside)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            inside += 1  # the negative control: a naive cut here splits a character
        prompt, length = cut_to_tokens(text, byte_tokenizer, tokens)
        assert text.startswith(prompt)  # a prefix of the text: whole characters only
        assert tokens - tolerance(tokens) <= length <= tokens
        assert len(byte_tokenizer(prompt).input_ids) == length
    assert inside >= 10  # the sizes tried do fall inside characters


def test_a_damaged_source_file_is_one_message_naming_it(tmp_path):
    root, manifest = _tree(tmp_path, {"pkg/__init__.py": "x = 1\n" * 200, "pkg/util.py": "y = 2\n" * 200})
    LongCode(root=root, manifest=manifest).load_records(tokens=16)  # intact: loads
    (root / "pkg" / "util.py").write_text("y = 3\n" * 200, encoding="utf-8")
    with pytest.raises(ValueError, match=r"source file .*pkg/util\.py does not match its manifest"):
        LongCode(root=root, manifest=manifest).load_records(tokens=16)
    (root / "pkg" / "util.py").unlink()
    with pytest.raises(ValueError, match=r"pkg/util\.py is missing"):
        LongCode(root=root, manifest=manifest).load_records(tokens=16)


def test_another_interpreter_is_refused_by_name(tmp_path):
    manifest = json.loads(DATASETS["longcode"].manifest.read_text(encoding="utf-8"))
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({**manifest, "interpreter": "CPython 3.99.0"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"CPython 3\.99\.0.*this interpreter is CPython"):
        LongCode(manifest=path).load_records(tokens=1024)


def test_the_shipped_manifest_matches_this_interpreter():
    manifest = json.loads(DATASETS["longcode"].manifest.read_text(encoding="utf-8"))
    assert manifest["licence"].startswith("PSF") and len(manifest["files"]) > 100
    name = sorted(manifest["files"])[0]
    assert (stdlib_root() / name).is_file()


def test_buckets_are_configs_of_the_one_registry():
    from omegaconf import OmegaConf

    from spectr_repro.conf import conf_dir

    for tokens, name in ((1024, "longcode_1k"), (4096, "longcode_4k"), (8192, "longcode_8k"),
                         (16384, "longcode_16k"), (32768, "longcode_32k")):
        config = OmegaConf.to_container(OmegaConf.load(conf_dir() / "dataset" / f"{name}.yaml"))
        assert config["name"] == "longcode" and declared_prompt_tokens(config) == tokens
        assert typical_prompt_tokens(name) == tokens  # what plan, check and the report's costs assume
    assert typical_prompt_tokens("humaneval") == DATASETS["humaneval"].typical_prompt_tokens


def test_bad_options_and_no_tokenizer_are_one_message(byte_tokenizer):
    with pytest.raises(ValueError, match="min_tokens=1024 is below tokens=4096"):
        load_examples(_bucket(4096, 1024), 1, tokenizer=byte_tokenizer)
    with pytest.raises(ValueError, match="needs the pair's tokenizer"):
        load_examples(_bucket(1024), 1)
    with pytest.raises(ValueError, match="no repository"):
        LongCode().load_records(tokens=10**7)
