"""A tiny random Llama pair and a byte-level tokenizer, built in code (no download).

Used by the engine tests and available to the runner as the model pair ``tiny_random``.

    target, draft, tokenizer = make_tiny_pair(seed=0)

The draft is the target with Gaussian noise added to every weight (``draft_noise``), so the two
models agree often but not always, like a real target/draft pair (the default 0.15 gives SD a block
efficiency of about 2.5 at L=4, T=0.7); ``draft_noise=0`` gives a draft with the target's exact
weights. The target's output head is padded past the tokenizer length (as
real checkpoints often are) so the engine's vocabulary slicing is exercised everywhere.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")

# A minimal chat format so that real dataset prompts go through the same path as with chat models.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def make_byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: ids 0..255 are the bytes, then <|bos|>, <|eos|>, <|pad|> (259 tokens).

    Any text round-trips through encode/decode (UTF-8 bytes, no merges, no unknown token).
    """
    byte_symbols = ByteLevel.alphabet()  # the 256 printable stand-ins for raw bytes
    # Order the symbols by the byte they stand for, so that id == byte value.
    symbol_of_byte = _bytes_to_unicode()
    assert set(symbol_of_byte.values()) == set(byte_symbols)
    vocab = {symbol_of_byte[b]: b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the one ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def tiny_config(vocab_size: int, hidden_size: int = 64, num_layers: int = 2, **overrides) -> LlamaConfig:
    """A small Llama config (float32, no tied embeddings)."""
    options = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    options.update(overrides)
    return LlamaConfig(**options)


def make_tiny_models(
    vocab_size: int,
    seed: int = 0,
    draft_noise: float = 0.3,
    logit_scale: float = 3.0,
    target_vocab_padding: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """Seeded random (target, draft) Llama models over ``vocab_size`` tokens.

    logit_scale: standard deviation of the output logits at init (the default init gives almost
        uniform next-token laws, where every verifier accepts nearly everything; 3 gives peaked,
        varied conditionals closer to a trained model's).
    draft_noise: the draft's weights are target + draft_noise * std(weight) * N(0, 1), per tensor.
    target_vocab_padding: extra rows in the target's head (ids the tokenizer never produces).
    """
    generator = torch.Generator().manual_seed(seed)
    target_vocab = vocab_size + target_vocab_padding
    target = LlamaForCausalLM(tiny_config(target_vocab, hidden_size, num_layers))
    with torch.no_grad():
        for param in target.parameters():  # re-seed every weight: independent of torch's global RNG
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        # RMS-normalised hidden states have entries ~1, so logits have std ~ weight_std * sqrt(hidden).
        head = target.lm_head.weight
        head.copy_(torch.randn(head.shape, generator=generator) * (logit_scale / hidden_size**0.5))

    draft = LlamaForCausalLM(tiny_config(vocab_size, hidden_size, num_layers))
    with torch.no_grad():
        draft_params = dict(draft.named_parameters())
        for name, param in target.named_parameters():
            is_vocab_matrix = name in ("model.embed_tokens.weight", "lm_head.weight")
            value = param[:vocab_size] if is_vocab_matrix else param
            if draft_noise > 0 and value.dim() >= 2:
                value = value + draft_noise * value.std() * torch.randn(value.shape, generator=generator)
            draft_params[name].copy_(value)
    for model in (target, draft):
        model.eval()
        model.generation_config.pad_token_id = None
        model.generation_config.eos_token_id = None
        model.generation_config.bos_token_id = None
    return target.to(device=device, dtype=dtype), draft.to(device=device, dtype=dtype)


def make_tiny_pair(
    seed: int = 0,
    draft_noise: float = 0.15,
    logit_scale: float = 3.0,
    target_vocab_padding: int = 5,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    **model_options,
) -> tuple[LlamaForCausalLM, LlamaForCausalLM, PreTrainedTokenizerFast]:
    """(target, draft, tokenizer): tiny random Llamas over the byte tokenizer's 259 ids.

    The target head has ``target_vocab_padding`` extra rows (264 by default), the draft head none.
    """
    tokenizer = make_byte_tokenizer()
    target, draft = make_tiny_models(
        len(tokenizer),
        seed=seed,
        draft_noise=draft_noise,
        logit_scale=logit_scale,
        target_vocab_padding=target_vocab_padding,
        device=device,
        dtype=dtype,
        **model_options,
    )
    for model in (target, draft):
        model.config.bos_token_id = model.generation_config.bos_token_id = tokenizer.bos_token_id
        model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    return target, draft, tokenizer


__all__ = ["CHAT_TEMPLATE", "make_byte_tokenizer", "make_tiny_models", "make_tiny_pair", "tiny_config"]
