"""The bias command's measurement at one context: the contexts (cuts of a target continuation where its top token
has probability nearest 1/2), the draft sets drawn there, every rule and control applied to the same draft sets,
and each one's record (``estimators.analyse``: the test, its power, the laws it compared)."""

from __future__ import annotations

import copy
import math
import time

import torch
from transformers import DynamicCache

from spectr_repro.bias import estimators
from spectr_repro.bias.settings import BiasSetting
from spectr_repro.data import encode_prompt
from spectr_repro.engine.cache import repeat_rows
from spectr_repro.engine.drafting import draft_block
from spectr_repro.engine.forward import forward_chunked
from spectr_repro.engine.loop import generate
from spectr_repro.engine.rows import DynamicRows
from spectr_repro.sampling import probs_from_logits
from spectr_repro.verify import VERIFIERS, get_verifier

TOP_TOKENS = 12  # tokens kept per (method, context) for the report's figure


def contexts_of(pair, setting: BiasSetting, examples) -> list[tuple[str, list[int]]]:
    """(name, token ids): per prompt, the ``bias.contexts_per_prompt`` cuts of an AR continuation from p
    (``bias.continuation_tokens`` long; cut 0 is the prompt itself) where the target's most likely next token
    has probability nearest 1/2. Why: where p is (nearly) a point mass every rule emits that token and no bias
    can show (code at T=0.4 is like that at most positions); where p is flat the stated alternatives (mass
    moved off the top token, at most p_top) cannot reach a detectable TV."""
    temperature, chunk, bias = setting.temperature, setting.prefill_chunk, setting.bias
    contexts = []
    for index, example in enumerate(examples):
        prompt = encode_prompt(pair.tokenizer, example)[0].tolist()
        continuation: list[int] = []
        if bias.continuation_tokens > 0:
            continuation = generate(pair.target, None, prompt, method="ar", temperature=temperature,
                                    max_new_tokens=bias.continuation_tokens, seed=setting.seed * 100_003 + index,
                                    eos_token_ids=pair.eos_token_ids, vocab_size=pair.vocab_size,
                                    prefill_chunk=chunk).new_tokens
        eos = set(pair.eos_token_ids)
        usable = next((i for i, token in enumerate(continuation) if token in eos), len(continuation))
        ids = torch.tensor([prompt + continuation[:usable]], device=pair.device)
        with torch.inference_mode():  # p at every cut 0..usable: one target forward
            logits = forward_chunked(pair.target, ids, DynamicCache(), pair.vocab_size, usable + 1, chunk)[0]
            top = probs_from_logits(logits, temperature).amax(-1).float().cpu()
        cuts = sorted(torch.argsort((top - 0.5).abs(), stable=True)[: bias.contexts_per_prompt].tolist())
        for cut in cuts:
            contexts.append((f"{example.id}+{cut}", prompt + continuation[:cut]))
    return contexts



@torch.inference_mode()
def measure_context(pair, setting: BiasSetting, ids: list[int], methods: list[str], number: int,
                    bar) -> dict[str, dict]:
    """Draw the setting's draft sets at one context, apply every method to them, analyse each."""
    K, L, S, B = setting.K, setting.L, setting.bias.samples, setting.bias.batch
    temperature, draft_temperature = setting.temperature, setting.draft_temperature
    V, chunk = pair.vocab_size, setting.prefill_chunk
    context = torch.tensor([ids], device=pair.device)
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    p0 = probs_from_logits(forward_chunked(pair.target, context, target_cache, V, 1, chunk)[0, -1], temperature)
    q0 = probs_from_logits(forward_chunked(pair.draft, context, draft_cache, V, 1, chunk)[0, -1], draft_temperature)
    seed = setting.seed * 1_000_003 + number
    draw_generator = torch.Generator(device=pair.device).manual_seed(seed)
    caps = {m: min(S, setting.bias.sample_cap.get(m, S)) for m in methods}
    verifiers = {m: get_verifier(m, check_inputs=False) for m in methods if m in VERIFIERS}
    parts: dict[str, list] = {m: [] for m in methods}
    seconds = dict.fromkeys(["models", *methods], 0.0)  # indicative: where the time goes (host clock)
    done = 0
    while done < S:
        n = min(B, S - done)
        started = time.perf_counter()
        rows = DynamicRows(pair.draft, V, chunk)
        rows.cache = copy.deepcopy(draft_cache)
        draft_tokens, draft_probs = draft_block(rows, q0, n * K, L, draft_temperature, draw_generator)
        cache = copy.deepcopy(target_cache)
        repeat_rows(cache, n * K)
        logits = forward_chunked(pair.target, draft_tokens, cache, V, L, None)  # [nK, L, V]: rows 1..L
        target_probs = torch.cat([p0.expand(n * K, 1, V), probs_from_logits(logits, temperature)], dim=1)
        draft_tokens = draft_tokens.view(n, K, L)
        draft_probs = draft_probs.view(n, K, L, V)
        target_probs = target_probs.view(n, K, L + 1, V)
        seconds["models"] += time.perf_counter() - started
        for method in methods:
            take = min(n, caps[method] - done)
            if take <= 0:
                continue
            started = time.perf_counter()
            width = 1 if method in estimators.CONTROLS else K  # the controls verify draft 0 of each set
            draws = estimators.rule_draws(method, draft_tokens[:take, :width], draft_probs[:take, :width],
                                          target_probs[:take, :width], setting.bias.rule_calls, draw_generator,
                                          verifier=verifiers.get(method))
            parts[method].append(draws)
            seconds[method] += time.perf_counter() - started
        done += n
        bar.update(n)
        del cache, logits, target_probs, draft_probs
    generator = torch.Generator().manual_seed(seed)
    records = {}
    for method in methods:
        draws = estimators.concat_draws(parts[method])
        records[method] = _record(method, draws, p0, q0, setting, generator)
        records[method]["seconds"] = {"draft_and_target_forwards": seconds["models"], "rule": seconds[method]}
    return records


def _record(method: str, draws, p0, q0, setting: BiasSetting, generator) -> dict:
    result = estimators.analyse(draws, p0, generator)
    exact_tv = math.nan
    if method in estimators.CONTROLS:
        exact_tv = float(estimators.total_variation(estimators.control_exact_law(method, p0, q0), p0))
    elif method in VERIFIERS and VERIFIERS[method].lossless:
        exact_tv = 0.0  # proven lossless (exact tests on toys): the target's law, exactly
    p64 = p0.double().cpu()
    top = torch.topk(torch.maximum(p64, result.law), min(TOP_TOKENS, p64.numel())).indices
    acceptance = float(torch.minimum(p0, q0).double().sum())  # SD's acceptance at the context: 1 - TV(p, q)
    return {
        "method": method, "K": setting.K, "L": setting.L, "temperature": setting.temperature,
        "draft_temperature": setting.draft_temperature, "model_pair": setting.model_pair,
        "dataset": setting.dataset, "samples": result.samples, "tv_estimate": result.tv_estimate,
        "interval": list(result.interval), "p_value": result.p_value, "detectable_tv": result.detectable_tv,
        "estimator": estimators.estimator_name(method, setting.bias.rule_calls), "acceptance": acceptance,
        "exact_tv": exact_tv, "power_model": result.power_model.as_dict(), "test": result.test,
        "bins": result.bins, "target_bins": p64[result.bins].tolist(),
        "binned_laws": [[round(v, 8) for v in row] for row in result.binned.tolist()],  # the test's data, kept
        "top_tokens": top.tolist(), "top_target": p64[top].tolist(), "top_rule": result.law[top].tolist(),
    }


__all__ = ["TOP_TOKENS", "contexts_of", "measure_context"]
