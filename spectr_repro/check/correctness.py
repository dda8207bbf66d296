"""``check``'s models and correctness items: the pair on the device (real or random weights), greedy AR and sd
against ``model.generate``, batched decoding against batch 1, every registered rule on one block."""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any

import torch

import spectr_repro.check.architectures as architectures  # a module: tests swap its configs for small ones
from spectr_repro.check.checker import Checker
from spectr_repro.check.environment import pair_dtype
from spectr_repro.engine import generate, generate_batch
from spectr_repro.launch.pairs import PairCache
from spectr_repro.verify import VERIFIERS


@dataclass
class LoadedPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    vocab_size: int
    what: str  # how it was obtained (real weights, random weights, tiny)
    tokenizer: Any = None  # the pair's tokenizer (real weights): real prompts for the rules' timing


def load_models(base, pair_cfg: dict, random_weights: bool) -> LoadedPair:
    """The pair's target and draft on the device: real weights (through the model-pair cache every command
    shares) or random ones."""
    device = torch.device(str(base.hardware.device))
    dtype = pair_dtype(base, pair_cfg)
    if random_weights and pair_cfg["source"] != "tiny":
        target = architectures.build_random_model(architectures.architecture_config(pair_cfg, "target"), device, dtype,
                                                         seed=0)
        draft = architectures.build_random_model(architectures.architecture_config(pair_cfg, "draft"), device, dtype,
                                                        seed=1)
        vocab = min(m.get_output_embeddings().weight.shape[0] for m in (target, draft))
        return LoadedPair(target, draft, vocab, f"random weights from the configs, {str(dtype)[6:]}")
    # check reports offloading itself (its memory item), so the cache is told to allow it; the dtype is check's
    run = base.replace(hardware=base.group("hardware") | {"dtype": str(dtype).removeprefix("torch."),
                                                          "allow_offload": True})
    pair = PairCache(echo=lambda message: print(message, file=sys.stderr)).pair(run)
    what = "tiny random pair" if pair_cfg["source"] == "tiny" else f"real weights, {str(dtype)[6:]}"
    return LoadedPair(pair.target, pair.draft, pair.vocab_size, what,
                      None if pair_cfg["source"] == "tiny" else pair.tokenizer)


def correctness_models(loaded: LoadedPair, pair_cfg: dict):
    """(target, draft) of the correctness items: the pair's draft in float32 as the target and the draft as
    it is as the draft (float32 makes the greedy argmax independent of the call's shape; the second copy in
    the pair's dtype keeps the two models different); the tiny pair as it is."""
    if pair_cfg["source"] == "tiny" or loaded.draft.dtype == torch.float32:
        return loaded.target, loaded.draft
    return copy.deepcopy(loaded.draft).float(), loaded.draft


def random_prompts(count: int, length: int, vocab: int, device, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).to(device) for _ in range(count)]


def correctness_items(checker: Checker, target, draft, vocab: int, quick: bool) -> None:
    device = next(target.parameters()).device
    prompts = random_prompts(1 if quick else 2, 12, vocab, device)
    new = 8 if quick else 12

    def reference(prompt):
        with torch.inference_mode():
            head = target.get_output_embeddings().weight.shape[0]
            out = target.generate(prompt[None], do_sample=False, max_new_tokens=new, eos_token_id=None,
                                  pad_token_id=None, suppress_tokens=list(range(vocab, head)) or None,
                                  attention_mask=torch.ones_like(prompt[None]))
        return out[0, prompt.numel():].tolist()

    references = [reference(p) for p in prompts]

    def equal_to_generate(method, K, L):
        def check():
            got = [generate(target, draft, p, method=method, K=K, L=L, temperature=0.0, max_new_tokens=new,
                            vocab_size=vocab).new_tokens for p in prompts]
            same = got == references
            return same, (f"{len(prompts)} prompt(s) x {new} tokens equal" if same else
                          f"differ: ours {got[0]} vs generate {references[0]}"), None
        return check

    checker.run("correctness", "greedy AR = model.generate", equal_to_generate("ar", 1, 1))
    checker.run("correctness", "sd (T=0, L=4) = model.generate", equal_to_generate("sd", 1, 4))

    def batched():
        batch_prompts = random_prompts(3, 10, vocab, device, seed=1)
        alone = [generate(target, draft, p, method="sbv", K=2, L=3, temperature=0.0, max_new_tokens=new,
                          seed=s, vocab_size=vocab).new_tokens for s, p in enumerate(batch_prompts)]
        together = generate_batch(target, draft, batch_prompts, method="sbv", K=2, L=3, temperature=0.0,
                                  max_new_tokens=new, seeds=[0, 1, 2], vocab_size=vocab)
        got = [o.new_tokens for o in together.outputs]
        return got == alone, "3 prompts batched = each alone (sbv K=2 L=3, T=0)" if got == alone else (
            f"batched {got[0]} vs alone {alone[0]}"), None

    checker.run("correctness", "batched = batch 1 (T=0)", batched)

    def one_block(name):
        def check():
            K, L = (1 if VERIFIERS[name].single_draft else 2), 3
            out = generate(target, draft, prompts[0], method=name, K=K, L=L, temperature=0.7,
                           max_new_tokens=L + 1, seed=0, vocab_size=vocab)
            valid = 1 <= len(out.new_tokens) <= L + 1 and all(0 <= t < vocab for t in out.new_tokens)
            return valid, f"K={K} L={L} T=0.7: {len(out.new_tokens)} tokens in {out.target_calls} call(s)", None
        return check

    for name in VERIFIERS:
        checker.run("correctness", f"rule {name} runs one block", one_block(name))


__all__ = ["LoadedPair", "correctness_items", "correctness_models", "load_models", "random_prompts"]
