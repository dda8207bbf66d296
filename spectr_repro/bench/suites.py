"""The benchmarks ``python -m spectr_repro bench`` runs; each returns plain dicts (JSON-ready).

- ``ar_vs_hf_generate``: our AR loop vs ``target.generate(do_sample=True)``.
- ``sd_vs_hf_assisted``: our ``sd`` vs transformers' assisted generation, both drafting exactly L tokens.
- ``best_vs_best``: what a user compares: transformers' generate, its assisted generation at its own defaults
  and at equal L, against ours at equal L and at our best lossless configuration (chosen by a small sweep
  on other seeds, reported).
- ``methods``: every rule's speed-up over our AR and its block efficiency at a few (K, L) points.
- ``verification``: every rule's seconds per call on real blocks the engine builds on the pair (and on
  synthetic ones), as a fraction of one target call of the same shape, with its kernel launches and
  device->host reads per call (``bench.counters``).
"""

from __future__ import annotations

import statistics

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from spectr_repro.bench.blocks import synthetic_block
from spectr_repro.bench.contenders import run_hf, run_ours
from spectr_repro.bench.counters import count_ops
from spectr_repro.bench.measure import PeakMemory, rounds, timed
from spectr_repro.engine import generate
from spectr_repro.engine.cache import crop_to, repeat_rows
from spectr_repro.engine.forward import forward_logits
from spectr_repro.sampling import probs_from_logits
from spectr_repro.verify import VERIFIERS, Verifier, get_verifier

WARMUP_TOKENS = 8


def _ours(pair, prompts, method, K, L, temperature, max_new_tokens, prefill_chunk, use_draft=True):
    """A contender running our loop (see measure.rounds)."""
    def run(round: int):
        chosen = prompts[:1] if round < 0 else prompts
        seconds, tokens, calls, _ = run_ours(pair, chosen, method, K, L, temperature,
                                             WARMUP_TOKENS if round < 0 else max_new_tokens, prefill_chunk,
                                             use_draft=use_draft, seed=1000 * round)
        return seconds, tokens, calls
    return run


def _theirs(pair, prompts, temperature, max_new_tokens, assistant=None, L=None):
    """A contender running transformers' generate / assisted generation."""
    def run(round: int):
        chosen = prompts[:1] if round < 0 else prompts
        return *run_hf(pair, chosen, temperature, WARMUP_TOKENS if round < 0 else max_new_tokens,
                       assistant=assistant, L=L, seed=1000 * round), None
    return run


def _pairwise(measured: dict, ours: str, theirs: str) -> dict:
    """The legacy two-contender layout (ours/hf keys) of two entries of ``measure.rounds``' result."""
    a, b = measured[ours], measured[theirs]
    return {"ours_tokens_per_s": a["tokens_per_s"], "hf_tokens_per_s": b["tokens_per_s"],
            "ratio": a["tokens_per_s"] / b["tokens_per_s"], "ours_all": a["all"], "hf_all": b["all"],
            "peak_memory_mb": max(a["peak_memory_mb"], b["peak_memory_mb"]),
            "ours_profile": a["profile"], "hf_profile": b["profile"]}


def bench_ar_vs_hf(pair, prompts, temperature, max_new_tokens, repeats, prefill_chunk=None) -> dict:
    measured = rounds(f"ar vs generate [{pair.name}]", pair, {
        "ours": _ours(pair, prompts, "ar", 1, 1, temperature, max_new_tokens, prefill_chunk, use_draft=False),
        "hf": _theirs(pair, prompts, temperature, max_new_tokens)}, repeats)
    return _pairwise(measured, "ours", "hf")


def bench_sd_vs_assisted(pair, prompts, temperature, max_new_tokens, L, repeats, prefill_chunk=None) -> dict:
    measured = rounds(f"sd vs assisted [{pair.name}]", pair, {
        "ours": _ours(pair, prompts, "sd", 1, L, temperature, max_new_tokens, prefill_chunk),
        "hf": _theirs(pair, prompts, temperature, max_new_tokens, assistant=pair.draft, L=L)}, repeats)
    return {**_pairwise(measured, "ours", "hf"), "L": L}


def choose_best(pair, prompts, candidates, temperature, max_new_tokens, prefill_chunk=None) -> dict:
    """Our fastest lossless configuration among ``candidates`` [(method, K, L)], by tokens/s over the prompts
    at seeds the timed rounds never use (so the choice is not fitted to the measured draws)."""
    run_ours(pair, prompts[:1], "ar", 1, 1, temperature, WARMUP_TOKENS, prefill_chunk, use_draft=False)
    sweep = []
    for method, K, L in tqdm(candidates, desc=f"best-of sweep [{pair.name}]", leave=False):
        if not VERIFIERS[method].lossless:
            raise ValueError(f"best-against-best compares lossless configurations; {method} is not lossless")
        seconds, tokens, calls, _ = run_ours(pair, prompts, method, K, L, temperature, max_new_tokens,
                                             prefill_chunk, seed=10**6)
        sweep.append({"method": method, "K": K, "L": L, "tokens_per_s": tokens / seconds,
                      "block_efficiency": tokens / calls})
    best = max(sweep, key=lambda row: row["tokens_per_s"])
    return {"best": best, "sweep": sweep}


def bench_best_vs_best(pair, prompts, temperature, max_new_tokens, equal_L, candidates, repeats,
                       prefill_chunk=None, pick: dict | None = None) -> dict:
    """Every contender in the same rounds: transformers' generate, assisted generation at its defaults and at
    exactly ``equal_L`` drafted tokens, our sd at ``equal_L`` and our best configuration.

    ``pick``: our best configuration as predicted from a replay and this machine's calibration
    (``spectr_repro.cost.predict.best_configuration``: method, K, L, tokens_per_s) instead of the one-run
    sweep over ``candidates``; the result then says how far the measured rate is from the predicted one."""
    if pick is not None:
        if not VERIFIERS[pick["method"]].lossless:
            raise ValueError(f"best-against-best compares lossless configurations; {pick['method']} is not lossless")
        chosen = {"best": dict(pick), "sweep": []}
    else:
        chosen = choose_best(pair, prompts, candidates, temperature, max_new_tokens, prefill_chunk)
    best = chosen["best"]
    contenders = {
        "hf_generate": _theirs(pair, prompts, temperature, max_new_tokens),
        "hf_assisted_defaults": _theirs(pair, prompts, temperature, max_new_tokens, assistant=pair.draft),
        f"hf_assisted_L{equal_L}": _theirs(pair, prompts, temperature, max_new_tokens, assistant=pair.draft,
                                           L=equal_L),
        f"ours_sd_L{equal_L}": _ours(pair, prompts, "sd", 1, equal_L, temperature, max_new_tokens, prefill_chunk),
        "ours_best": _ours(pair, prompts, best["method"], best["K"], best["L"], temperature, max_new_tokens,
                           prefill_chunk),
    }
    measured = rounds(f"best vs best [{pair.name}]", pair, contenders, repeats)
    best_rate = measured["ours_best"]["tokens_per_s"]
    result = {"contenders": measured, "best": best, "sweep": chosen["sweep"], "equal_L": equal_L,
              "best_vs_hf_assisted_defaults": best_rate / measured["hf_assisted_defaults"]["tokens_per_s"],
              "best_vs_hf_generate": best_rate / measured["hf_generate"]["tokens_per_s"]}
    if pick is not None:
        result["predicted_tokens_per_s"] = float(pick["tokens_per_s"])
        result["measured_over_predicted"] = best_rate / float(pick["tokens_per_s"])
    return result


def bench_methods(pair, prompts, temperature, max_new_tokens, points, prefill_chunk=None) -> list[dict]:
    """Speed-up over our AR and block efficiency per (method, K, L), AR timed in the same process."""
    run_ours(pair, prompts[:1], "ar", 1, 1, temperature, WARMUP_TOKENS, prefill_chunk, use_draft=False)
    with PeakMemory(pair.device) as mem:
        ar_s, ar_n, _, _ = run_ours(pair, prompts, "ar", 1, 1, temperature, max_new_tokens, prefill_chunk,
                                    use_draft=False)
    rows = [{"method": "ar", "K": 1, "L": 1, "block_efficiency": 1.0, "speedup": 1.0,
             "tokens_per_s": ar_n / ar_s, "peak_memory_mb": mem.peak / 2**20}]
    for method, K, L in tqdm(points, desc=f"methods [{pair.name}]", leave=False):
        with PeakMemory(pair.device) as mem:
            s, n, calls, split = run_ours(pair, prompts, method, K, L, temperature, max_new_tokens, prefill_chunk)
        rows.append({"method": method, "K": K, "L": L, "block_efficiency": n / calls,
                     "speedup": (ar_s / ar_n) / (s / n), "tokens_per_s": n / s,
                     "verify_fraction_of_target": split["verify"] / split["target"] if split["target"] else None,
                     "peak_memory_mb": mem.peak / 2**20})
    return rows


class BlockRecorder(Verifier):
    """Runs a real rule in the engine and keeps the inputs of its first ``count`` calls."""

    def __init__(self, name: str, count: int) -> None:
        super().__init__(check_inputs=False)
        self.inner = get_verifier(name, check_inputs=False)
        self.name, self.single_draft, self.count = name, self.inner.single_draft, count
        self.lossless = self.inner.lossless
        self.blocks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        if len(self.blocks) < self.count:
            self.blocks.append((draft_tokens.clone(), draft_probs.clone(), target_probs.clone()))
        return self.inner(draft_tokens, draft_probs, target_probs, generator=generator, state=state)


def real_blocks(pair, prompt: torch.Tensor, K: int, L: int, count: int, temperature: float = 0.7,
                prefill_chunk=None) -> list:
    """``count`` (draft_tokens, q, p) blocks the engine builds on the pair (K drafts of L tokens).

    The multi-draft rules' cost depends on how long drafts stay together (SpecTr solves for rho* at every
    depth with >= 2 survivors): on code the Qwen pair's drafts often coincide for many tokens, which
    synthetic blocks do not show. Recorded under spectr (sd at K = 1); every rule is then timed on them.
    """
    recorder = BlockRecorder("sd" if K == 1 else "spectr", count)
    generate(pair.target, pair.draft, prompt.to(pair.device), method=recorder, K=K, L=L, temperature=temperature,
             max_new_tokens=count * (L + 1) + 1, seed=0, vocab_size=pair.vocab_size,
             should_stop=lambda tokens: len(recorder.blocks) >= count, prefill_chunk=prefill_chunk)
    return recorder.blocks


def target_call_seconds(pair, K: int, L: int, prompt_len: int, repeats: int) -> float:
    """Median seconds of one target call: K rows of L+1 tokens on a cached prompt."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, pair.vocab_size, (1, prompt_len), generator=gen).to(pair.device)
    rows = torch.randint(0, pair.vocab_size, (K, L + 1), generator=gen).to(pair.device)
    times = []
    with torch.inference_mode():
        cache = DynamicCache()
        forward_logits(pair.target, prompt, cache, pair.vocab_size, keep_last=1)
        for _ in range(repeats + 1):
            repeat_rows(cache, K)
            elapsed, _ = timed(pair.device, lambda: probs_from_logits(
                forward_logits(pair.target, rows, cache, pair.vocab_size), 0.7))
            times.append(elapsed)
            crop_to(cache, prompt_len)
            if K > 1:
                cache.batch_select_indices(torch.tensor([0], device=pair.device))
    return statistics.median(times[1:])


def _verify_once(rule, inputs, generator):
    return rule(*inputs, generator=generator)


def bench_verification(pair, prompt, Ks, Ls, repeats, blocks_per_shape: int = 3, prefill_chunk=None,
                       rules: list[str] | None = None) -> list[dict]:
    """Seconds per call of every rule (or of ``rules``) on real blocks of the pair (median over
    ``blocks_per_shape`` blocks x ``repeats``) and on synthetic ones (agreeing drafts, the worst case), as a
    fraction of one target call of the same shape; plus the worst ops and host reads per call over the real and
    synthetic blocks."""
    device = pair.device
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    shapes = [(K, L) for K in Ks for L in Ls]
    call_s = {shape: target_call_seconds(pair, *shape, prompt_len=128, repeats=max(2, repeats // 2))
              for shape in tqdm(shapes, desc=f"target calls [{pair.name}]", leave=False)}
    for K, L in tqdm(shapes, desc=f"verification [{pair.name}]", leave=False):
        real = real_blocks(pair, prompt, K, L, blocks_per_shape, prefill_chunk=prefill_chunk)
        V = int(real[0][1].shape[-1])
        synthetic = [synthetic_block(K, L, V, agreement="shared", seed=K * 100 + L, device=device)]
        for name, spec in VERIFIERS.items():
            if (spec.single_draft and K != 1) or (rules is not None and name not in rules):
                continue
            rule = get_verifier(name, check_inputs=False)
            medians, ops, reads = {}, 0, 0
            for case, blocks in (("real", real), ("synthetic", synthetic)):
                times = []
                for inputs in blocks:
                    with count_ops() as counts:
                        _verify_once(rule, inputs, gen)  # also the warm-up
                    ops, reads = max(ops, counts.ops), max(reads, counts.host_reads)
                    times += [timed(device, lambda rule=rule, inputs=inputs: _verify_once(rule, inputs, gen))[0]
                              for _ in range(repeats)]
                medians[case] = statistics.median(times)
            rows.append({"rule": name, "K": K, "L": L, "V": V,
                         "verify_ms": 1e3 * medians["real"],
                         "verify_ms_synthetic": 1e3 * medians["synthetic"],
                         "real_blocks": len(real),
                         "target_call_ms": 1e3 * call_s[(K, L)],
                         "fraction_of_target_call": medians["real"] / call_s[(K, L)],
                         "ops_per_call": ops, "host_reads_per_call": reads})
        del real, synthetic
    return rows


__all__ = ["BlockRecorder", "bench_ar_vs_hf", "bench_best_vs_best", "bench_methods", "bench_sd_vs_assisted",
           "bench_verification", "choose_best", "real_blocks", "target_call_seconds"]
