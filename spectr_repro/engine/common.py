"""What the batch-1 loop (:mod:`~spectr_repro.engine.loop`) and the batched one
(:mod:`~spectr_repro.engine.batched`) share: argument checks, the prompt tensor, the verifier results read to
the host, each block's draft length, the block efficiency, and the step of a decoding (``BlockStep``: the blocks a
rule verifies, one per running prompt) through which both hand their blocks to whoever verifies them."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spectr_repro.engine.forward import resolve_vocab_size
from spectr_repro.verify import VERIFIERS, Verifier, VerifyResult, get_verifier


def read_outcomes(results, draft_tokens: torch.Tensor, blocks: Sequence[int], K: int, rule: str) -> list[list[int]]:
    """The emitted tokens of each verifier result, read to the host in ONE transfer together with the
    draft prefix each result claims to accept, which must match (the verifier contract; ``rule`` names the rule in
    the error).

    draft_tokens: [R, K, >= block] (R = len(results); batch 1: R = 1).
    """
    pieces, sizes = [], []
    for i, (result, block) in enumerate(zip(results, blocks)):
        tau, chosen = int(result.num_accepted), int(result.draft_index)
        if not 0 <= chosen < K or not 0 <= tau <= block or result.tokens.numel() != tau + 1:
            raise RuntimeError(f"{rule} returned {result.tokens.numel()} tokens, num_accepted={tau}, "
                               f"draft_index={chosen} for K={K}, L={block}")
        pieces += [result.tokens.to(draft_tokens.device), draft_tokens[i, chosen, :tau]]
        sizes.append(tau)
    flat = torch.cat(pieces).tolist()
    emitted, offset = [], 0
    for tau in sizes:
        tokens, prefix = flat[offset:offset + tau + 1], flat[offset + tau + 1:offset + 2 * tau + 1]
        if tokens[:tau] != prefix:
            raise RuntimeError(f"{rule}: accepted tokens are not a prefix of the chosen draft")
        emitted.append(tokens)
        offset += 2 * tau + 1
    return emitted


@dataclass
class DraftedBlock:
    """One prompt's block at one iteration: what its rule verifies, with the generator and carry-over state the
    rule is called with (``rule(draft_tokens, draft_probs, target_probs, generator=, state=)``)."""

    prompt: int  # the prompt's place in the prompts decoded
    draft_tokens: torch.Tensor  # [K, block]
    draft_probs: torch.Tensor  # [K, block, V]
    target_probs: torch.Tensor  # [K, block + 1, V]
    generator: torch.Generator  # the prompt's own: the rule's draws come from it, after the drafts'
    state: Any  # what the prompt's previous verification carried over (None on the first)
    output_position: int  # tokens the prompt emitted before this block


@dataclass
class BlockStep:
    """One iteration of a decoding: a block for each prompt still running. Whoever drives the decoding sets
    ``results[i]`` to the rule's VerifyResult on ``blocks[i]`` before asking for the next step."""

    blocks: list[DraftedBlock]
    results: list[VerifyResult | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.blocks)

    def verified(self) -> list[VerifyResult]:
        missing = [block.prompt for block, result in zip(self.blocks, self.results) if result is None]
        if missing:
            raise RuntimeError(f"the blocks of prompt(s) {missing} were not verified before the next step")
        return list(self.results)


@dataclass(frozen=True)
class DecodingSetup:
    """What every block of one speculative decoding shares; checked values (``check_numbers``, ``check_setup``)."""

    K: int  # drafts per block
    L: int  # the longest block drafted
    temperature: float  # of both models (0: greedy)
    eos: frozenset[int]
    vocab_size: int  # the shared tokenizer's; logits past it are dropped
    prefill_chunk: int | None  # prompt fed in chunks of this many tokens (None: one call)
    compile: bool | dict = False  # static caches under torch.compile (engine.rows; the one-prompt path only)


class Decoding:
    """A decoding whose rule is its caller's: iterate it for the steps (``BlockStep``), verify each step's blocks,
    then read ``outputs`` (one ``GenerationOutput`` per prompt, in the order given). The engine's own work (drafting,
    scoring, advancing the caches) runs under ``torch.inference_mode``; the caller verifies in whatever mode it
    chose (``generate`` and the replay choose inference mode too), and a caller that stops early leaves no mode
    behind."""

    def __init__(self, steps: Generator[BlockStep, None, Any], finish: Callable[[Any], list]) -> None:
        self._steps, self._finish = steps, finish
        self.outputs: list | None = None  # set once every step has been verified

    def __iter__(self) -> Iterator[BlockStep]:
        if self.outputs is not None:
            raise RuntimeError("a decoding runs once")
        while True:
            with torch.inference_mode():  # entered per step, so that no mode is held across the yield below
                try:
                    step = next(self._steps)
                except StopIteration as finished:
                    returned = finished.value
                    break
            yield step
        self.outputs = self._finish(returned)


def verify_each(steps: Iterable[BlockStep], rule_of: Callable[[int], Verifier]) -> None:
    """Drive a decoding's steps with each prompt's rule (``rule_of(prompt)``), as ``generate`` does."""
    for step in steps:
        step.results = [rule_of(b.prompt)(b.draft_tokens, b.draft_probs, b.target_probs, generator=b.generator,
                                          state=b.state) for b in step.blocks]


def block_length(verifier: Verifier, state: Any, L: int, remaining: int) -> int:
    """Draft length of the next block: L, or for a lossless rule carrying no state only as long as the
    ``remaining`` tokens need (every iteration adds one token of its own after the drafted ones)."""
    if verifier.lossless and state is None:
        return max(1, min(L, remaining - 1))
    return L


def block_efficiency(new_tokens: list[int], calls: int) -> float:
    return len(new_tokens) / calls if calls else 0.0


def is_integer(value) -> bool:
    """An int (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_numbers(K, L, temperature, max_new_tokens) -> None:
    """ValueError unless K, L >= 1 and max_new_tokens >= 0 are integers and the temperature is finite and >= 0."""
    if not is_integer(K) or K < 1:
        raise ValueError(f"K must be an integer >= 1, got {K!r}")
    if not is_integer(L) or L < 1:
        raise ValueError(f"L must be an integer >= 1, got {L!r}")
    if (not isinstance(temperature, numbers.Real) or isinstance(temperature, bool)
            or not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not is_integer(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def check_arguments(draft, method, K, L, temperature, max_new_tokens, verifier_options) -> Verifier | None:
    """Validate the arguments; return the verifier (None for AR)."""
    check_numbers(K, L, temperature, max_new_tokens)
    if isinstance(method, Verifier):
        verifier, single_draft = method, method.single_draft
    elif method == "ar":
        return None
    elif isinstance(method, str) and method in VERIFIERS:
        if verifier_options is not None and not isinstance(verifier_options, Mapping):
            raise ValueError(f"verifier_options must be a dict of {method}'s options, got {verifier_options!r}")
        try:
            verifier = get_verifier(method, **{"check_inputs": False, **(verifier_options or {})})
        except TypeError as error:  # an option the rule does not take
            raise ValueError(f"method {method!r}: {error}") from None
        single_draft = VERIFIERS[method].single_draft
    else:
        known = ", ".join(["ar", *VERIFIERS])
        raise ValueError(f"unknown method {method!r}; known: {known}")
    if single_draft and K != 1:
        raise ValueError(f"method {verifier.name!r} verifies a single draft; got K={K}")
    if draft is None:
        raise ValueError(f"method {verifier.name!r} needs a draft model")
    return verifier


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def eos_ids(eos_token_ids) -> frozenset[int]:
    """One id or an iterable of ids, each a non-negative integer."""
    ids = [eos_token_ids] if is_integer(eos_token_ids) else eos_token_ids
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise ValueError(f"eos_token_ids must be token ids (an int or a list of ints), got {eos_token_ids!r}")
    ids = list(ids)
    if not all(is_integer(t) and t >= 0 for t in ids):
        raise ValueError(f"eos_token_ids must be non-negative integers, got {eos_token_ids!r}")
    return frozenset(int(t) for t in ids)


def check_setup(target, draft, speculative: bool, prefill_chunk, vocab_size, eos_token_ids):
    """(device, prefill_chunk, vocab_size, eos ids) checked and resolved: what generate and generate_batch share
    (``speculative``: the draft takes part)."""
    if prefill_chunk is not None and (not is_integer(prefill_chunk) or prefill_chunk < 1):
        raise ValueError(f"prefill_chunk must be a positive integer or None, got {prefill_chunk!r}")
    if vocab_size is not None and not is_integer(vocab_size):
        raise ValueError(f"vocab_size must be an integer or None, got {vocab_size!r}")
    eos = eos_ids(eos_token_ids)
    device = model_device(target)
    if speculative and model_device(draft) != device:
        # One generator drives every draw; cross-device pairs would also copy tokens every step.
        raise ValueError(f"target and draft must be on one device, got {device} and {model_device(draft)}")
    vocab_size = resolve_vocab_size(target, draft if speculative else None, vocab_size)
    return device, None if prefill_chunk is None else int(prefill_chunk), vocab_size, eos


def prompt_tensor(input_ids, device: torch.device, models: Sequence[torch.nn.Module]) -> torch.Tensor:
    """input_ids as a 1-D LongTensor on ``device``: integer ids every model can embed."""
    if input_ids is None or isinstance(input_ids, (str, bytes)):
        raise ValueError(f"input_ids must be token ids (a 1-D or [1, T] tensor or list of ints), got {input_ids!r}")
    try:
        prompt = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"input_ids must be token ids (a 1-D or [1, T] tensor or list of ints): {error}") from None
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ValueError(f"input_ids must be 1-D or [1, T], got shape {tuple(prompt.shape)}")
    if prompt.numel() == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token (e.g. BOS)")
    if prompt.dtype == torch.bool or prompt.is_floating_point() or prompt.is_complex():
        raise ValueError(f"input_ids must be integer token ids, got dtype {prompt.dtype}")
    rows = min(model.get_input_embeddings().num_embeddings for model in models)
    low, high = torch.stack(torch.aminmax(prompt)).tolist()  # one read per prompt, before decoding
    if low < 0 or high >= rows:
        raise ValueError(f"input_ids must be in [0, {rows}) (the models' embedding rows), got ids from {low} to {high}")
    return prompt.long().to(device)


__all__ = ["BlockStep", "Decoding", "DecodingSetup", "DraftedBlock", "block_efficiency", "block_length",
           "check_arguments", "check_numbers", "check_setup", "eos_ids", "is_integer", "model_device", "prompt_tensor",
           "read_outcomes", "verify_each"]
