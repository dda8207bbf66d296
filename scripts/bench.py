"""Speed benchmarks: our loops against transformers' own generate and assisted generation.

    python scripts/bench.py            # full: SmolLM2 + the Qwen CPU pair (needs `make models`)
    python scripts/bench.py --quick    # reduced (< ~3 min): SmolLM2 only, fewer shapes

Every ratio is measured side by side in one process, on the same prompts, after a warm-up, over
several repeats (the order of the two contenders alternates between repeats), and reported as the
median. Results: a Markdown table on stdout and results/bench/bench.json (same keys in both modes).

How each figure is taken (Spec-Bench style):
- ar_vs_hf_generate: tokens/s of our AR loop / tokens/s of ``target.generate(do_sample=True)`` with the
  same temperature, no top-k/top-p, EOS disabled for both so both emit exactly N tokens.
- sd_vs_hf_assisted: tokens/s of our ``sd`` / tokens/s of ``target.generate(assistant_model=draft,
  do_sample=True, num_assistant_tokens=L, num_assistant_tokens_schedule="constant")``, EOS disabled.
- methods: speed-up over our AR and block efficiency of every rule at a few (K, L) points.
- verification: seconds per call of every rule at V = 151,936 on synthetic p, q (the engine's setting,
  check_inputs=False), and as a fraction of one target call of the same shape (K rows of L+1 tokens
  on a cached prompt) measured on the benchmark's target model.
- peak memory: resident-set high-water mark sampled during each run (CPU), or
  torch.cuda.max_memory_allocated (CUDA).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil
import torch
import transformers
from tqdm import tqdm

from spectr_repro.conf import conf_dir
from spectr_repro.data import load_examples
from spectr_repro.engine import generate
from spectr_repro.engine.cache import crop_to, repeat_rows
from spectr_repro.engine.forward import forward_logits
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.models import load_pair
from spectr_repro.sampling import probs_from_logits, sample
from spectr_repro.verify import VERIFIERS, Verifier, get_verifier

QWEN_VOCAB = 151_936


class PeakMemory:
    """Peak resident memory (bytes) of this process while the block runs; CUDA: peak allocated."""

    def __init__(self, device: torch.device, interval_s: float = 0.02) -> None:
        self.device, self.interval_s, self.peak = device, interval_s, 0
        self._stop = threading.Event()

    def _poll(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            self._stop.wait(self.interval_s)

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()


def timed(device: torch.device, fn):
    """(seconds, result) of ``fn()``, CUDA-synchronised through the engine's timer."""
    timer = SectionTimer(device, ("run",))
    with timer("run"):
        result = fn()
    return timer.seconds["run"], result


def encode_prompts(pair, dataset: str, num_prompts: int) -> list[torch.Tensor]:
    examples = load_examples(dataset, num_prompts, seed=0, tokenizer=pair.tokenizer)
    return [
        pair.tokenizer(ex.prompt, return_tensors="pt", add_special_tokens=False).input_ids[0]
        for ex in examples
    ]


def hf_generation_config(model, temperature: float, max_new_tokens: int):
    """The model's generation config with plain sampling at ``temperature`` and EOS disabled."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.temperature = True, temperature
    config.top_k, config.top_p, config.min_p = 0, 1.0, None
    config.max_new_tokens, config.min_new_tokens = max_new_tokens, None
    # An empty list, not None: transformers 5 fills None from the model's own config (Qwen then stopped
    # at EOS while our loop ran on, and tokens/s compared runs of different lengths).
    config.eos_token_id = []
    if config.pad_token_id is None:
        config.pad_token_id = 0
    return config


def hardware_setting(device: torch.device, key: str):
    """A key of conf/hardware/<cpu|cuda>.yaml: the bench runs the engine as the runner does."""
    from omegaconf import OmegaConf

    return OmegaConf.load(conf_dir() / "hardware" / f"{device.type}.yaml").get(key)


class ForwardMeter:
    """Counts the forwards of some models and the seconds spent inside them while the block runs.

    The profile that bounds the ratios: two loops driving the same models can differ only in how many
    forwards they run, on what shapes, and in what they do between forwards.
    """

    def __init__(self, device: torch.device, **models: torch.nn.Module) -> None:
        self.device, self.models = device, models
        self.stats = {name: {"calls": 0, "tokens_fed": 0, "seconds": 0.0} for name in models}
        self._handles: list = []

    def __enter__(self):
        for name, model in self.models.items():
            self._handles.append(model.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self._handles.append(model.register_forward_hook(self._post(name), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _pre(self, name):
        def hook(module, args, kwargs):
            self._sync()
            module._bench_started = time.perf_counter()
        return hook

    def _post(self, name):
        def hook(module, args, kwargs, output):
            self._sync()
            entry = self.stats[name]
            ids = kwargs.get("input_ids", args[0] if args else None)
            entry["calls"] += 1
            entry["tokens_fed"] += int(ids.numel()) if ids is not None else 0
            entry["seconds"] += time.perf_counter() - module._bench_started
        return hook


def run_ours(pair, prompts, method, K, L, temperature, max_new_tokens, use_draft=True, seed=0):
    """Total (seconds, tokens, target_calls, time split) over the prompts; prompt i uses seed + i."""
    seconds = tokens = calls = 0
    split = {"prefill": 0.0, "draft": 0.0, "target": 0.0, "verify": 0.0}
    chunk = hardware_setting(pair.device, "prefill_chunk")  # read once, outside the timed calls
    for i, ids in enumerate(prompts):
        elapsed, out = timed(pair.device, lambda ids=ids, i=i: generate(
            pair.target, pair.draft if use_draft else None, ids.to(pair.device), method=method, K=K, L=L,
            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i, eos_token_ids=(),
            vocab_size=pair.vocab_size, prefill_chunk=chunk))
        seconds, tokens, calls = seconds + elapsed, tokens + len(out.new_tokens), calls + out.target_calls
        for key in split:
            split[key] += out.stats["time_s"].get(key, 0.0)
    return seconds, tokens, calls, split


def run_hf(pair, prompts, temperature, max_new_tokens, assistant=None, L=None, seed=0):
    config = hf_generation_config(pair.target, temperature, max_new_tokens)
    extra = {}
    if assistant is not None:
        extra = dict(assistant_model=assistant)
        # transformers reads these from the ASSISTANT's generation config (its defaults: up to 20 tokens,
        # cut early when the draft's confidence < 0.4); pin exactly L drafted tokens per iteration, as ours.
        saved = copy.deepcopy(assistant.generation_config)
        assistant.generation_config.num_assistant_tokens = L
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = L, "constant"
        config.assistant_confidence_threshold = 0.0
    try:
        return _run_hf_prompts(pair, prompts, config, extra, seed)
    finally:
        if assistant is not None:
            assistant.generation_config = saved


def _run_hf_prompts(pair, prompts, config, extra, seed):
    seconds = tokens = 0
    for i, ids in enumerate(prompts):
        torch.manual_seed(seed + i)
        batch = ids.to(pair.device).unsqueeze(0)
        elapsed, out = timed(pair.device, lambda batch=batch: pair.target.generate(
            batch, attention_mask=torch.ones_like(batch), generation_config=config, **extra))
        seconds, tokens = seconds + elapsed, tokens + out.shape[1] - batch.shape[1]
    return seconds, tokens


def side_by_side(label, pair, ours_fn, theirs_fn, repeats: int) -> dict:
    """Median tokens/s ratio ours/theirs over ``repeats`` alternating rounds (after one warm-up each).

    ``fn(round)`` runs one contender (round -1: the short warm-up) and returns (seconds, tokens,
    iterations), iterations None meaning one per target forward (transformers' loops). Round r
    seeds prompt i with 1000 r + i for both contenders, so the rounds also average over the sampling
    luck of the block efficiency. Model forwards are counted and timed (``ForwardMeter``) in every
    timed round: ``*_profile`` says how much of each contender's time was spent inside forwards.
    """
    ours_fn(-1)
    theirs_fn(-1)
    rates = {"ours": [], "hf": []}
    profiles = {"ours": _empty_profile(), "hf": _empty_profile()}
    peaks = []
    for r in tqdm(range(repeats), desc=label, leave=False):
        order = [("ours", ours_fn), ("hf", theirs_fn)]
        for who, fn in order if r % 2 == 0 else order[::-1]:
            with PeakMemory(pair.device) as mem, ForwardMeter(pair.device, target=pair.target,
                                                              draft=pair.draft) as meter:
                seconds, tokens, iterations = fn(r)
            rates[who].append(tokens / seconds)
            peaks.append(mem.peak)
            _add_profile(profiles[who], seconds, tokens, meter.stats,
                         meter.stats["target"]["calls"] if iterations is None else iterations)
    ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["hf"])
    result = {"ours_tokens_per_s": ours, "hf_tokens_per_s": theirs, "ratio": ours / theirs,
              "ours_all": rates["ours"], "hf_all": rates["hf"], "peak_memory_mb": max(peaks) / 2**20}
    for who in ("ours", "hf"):
        result[f"{who}_profile"] = _finish_profile(profiles[who])
    return result


def _empty_profile() -> dict:
    return {"seconds": 0.0, "tokens": 0, "iterations": 0, "forwards": {}}


def _add_profile(profile: dict, seconds: float, tokens: int, forwards: dict, iterations: int) -> None:
    profile["seconds"] += seconds
    profile["tokens"] += tokens
    profile["iterations"] += iterations
    for model, entry in forwards.items():
        total = profile["forwards"].setdefault(model, {"calls": 0, "tokens_fed": 0, "seconds": 0.0})
        for key in total:
            total[key] += entry[key]


def _finish_profile(profile: dict) -> dict:
    """Per generated token: forwards of each model, ms inside them, and ms outside every forward."""
    tokens = max(profile["tokens"], 1)
    inside = sum(entry["seconds"] for entry in profile["forwards"].values())
    out = {"tokens": profile["tokens"], "seconds": profile["seconds"],
           "block_efficiency": profile["tokens"] / max(profile["iterations"], 1),
           "ms_per_token": 1e3 * profile["seconds"] / tokens,
           "ms_per_token_outside_forwards": 1e3 * (profile["seconds"] - inside) / tokens,
           "fraction_inside_forwards": inside / profile["seconds"] if profile["seconds"] else None}
    for model, entry in profile["forwards"].items():
        if entry["calls"]:
            out[f"{model}_forwards_per_token"] = entry["calls"] / tokens
            out[f"{model}_ms_per_forward"] = 1e3 * entry["seconds"] / entry["calls"]
            out[f"{model}_ms_per_token"] = 1e3 * entry["seconds"] / tokens
    return out


def bench_ar_vs_hf(pair, prompts, temperature, max_new_tokens, repeats) -> dict:
    warm = prompts[:1]

    def ours(round):
        s, n, calls, _ = run_ours(pair, warm if round < 0 else prompts, "ar", 1, 1, temperature,
                                  8 if round < 0 else max_new_tokens, use_draft=False, seed=1000 * round)
        return s, n, calls

    def theirs(round):
        return *run_hf(pair, warm if round < 0 else prompts, temperature, 8 if round < 0 else max_new_tokens,
                       seed=1000 * round), None

    return side_by_side(f"ar vs generate [{pair.name}]", pair, ours, theirs, repeats)


def bench_sd_vs_assisted(pair, prompts, temperature, max_new_tokens, L, repeats) -> dict:
    warm = prompts[:1]

    def ours(round):
        s, n, calls, _ = run_ours(pair, warm if round < 0 else prompts, "sd", 1, L, temperature,
                                  8 if round < 0 else max_new_tokens, seed=1000 * round)
        return s, n, calls

    def theirs(round):
        return *run_hf(pair, warm if round < 0 else prompts, temperature, 8 if round < 0 else max_new_tokens,
                       assistant=pair.draft, L=L, seed=1000 * round), None

    result = side_by_side(f"sd vs assisted [{pair.name}]", pair, ours, theirs, repeats)
    result["L"] = L
    return result


def bench_methods(pair, prompts, temperature, max_new_tokens, points) -> list[dict]:
    """Speed-up over our AR and block efficiency per (method, K, L), AR timed in the same process."""
    run_ours(pair, prompts[:1], "ar", 1, 1, temperature, 8, use_draft=False)  # warm-up
    with PeakMemory(pair.device) as mem:
        ar_s, ar_n, _, _ = run_ours(pair, prompts, "ar", 1, 1, temperature, max_new_tokens, use_draft=False)
    rows = [{"method": "ar", "K": 1, "L": 1, "block_efficiency": 1.0, "speedup": 1.0,
             "tokens_per_s": ar_n / ar_s, "peak_memory_mb": mem.peak / 2**20}]
    for method, K, L in tqdm(points, desc=f"methods [{pair.name}]", leave=False):
        with PeakMemory(pair.device) as mem:
            s, n, calls, split = run_ours(pair, prompts, method, K, L, temperature, max_new_tokens)
        rows.append({"method": method, "K": K, "L": L, "block_efficiency": n / calls,
                     "speedup": (ar_s / ar_n) / (s / n), "tokens_per_s": n / s,
                     "verify_fraction_of_target": split["verify"] / split["target"] if split["target"] else None,
                     "peak_memory_mb": mem.peak / 2**20})
    return rows


def synthetic_block(K: int, L: int, V: int, generator: torch.Generator, device: torch.device):
    """p, q at temperature 0.7 from random peaked logits, q a noisy copy of p; K drafts drawn
    independently (they part at the first token). Cheap for the multi-draft rules: see real_blocks."""
    base = torch.randn(K, L + 1, V, generator=generator, device=device) * 4
    noise = torch.randn(K, L + 1, V, generator=generator, device=device)
    target_probs = probs_from_logits(base, 0.7)
    draft_probs = probs_from_logits(base[:, :L] + noise[:, :L], 0.7)
    return sample(draft_probs, generator), draft_probs, target_probs


class BlockRecorder(Verifier):
    """Runs a real rule in the engine and keeps the inputs of its first ``count`` calls."""

    def __init__(self, name: str, count: int) -> None:
        super().__init__(check_inputs=False)
        self.inner = get_verifier(name, check_inputs=False)
        self.name, self.single_draft, self.count = name, self.inner.single_draft, count
        self.blocks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        if len(self.blocks) < self.count:
            self.blocks.append((draft_tokens.clone(), draft_probs.clone(), target_probs.clone()))
        return self.inner(draft_tokens, draft_probs, target_probs, generator=generator, state=state)


def real_blocks(pair, prompt: torch.Tensor, K: int, L: int, count: int, temperature: float = 0.7) -> list:
    """``count`` (draft_tokens, q, p) blocks the engine builds on the pair (K drafts of L tokens).

    The multi-draft rules' cost depends on how long drafts stay together (SpecTr solves for rho* at every
    depth with >= 2 survivors): on code the Qwen pair's drafts often coincide for many tokens, which
    synthetic blocks do not show. Recorded under spectr (sd at K = 1); every rule is then timed on them.
    """
    recorder = BlockRecorder("sd" if K == 1 else "spectr", count)
    generate(pair.target, pair.draft, prompt.to(pair.device), method=recorder, K=K, L=L, temperature=temperature,
             max_new_tokens=count * (L + 1), seed=0, vocab_size=pair.vocab_size,
             should_stop=lambda tokens: len(recorder.blocks) >= count,
             prefill_chunk=hardware_setting(pair.device, "prefill_chunk"))
    return recorder.blocks


def target_call_seconds(pair, K: int, L: int, prompt_len: int, repeats: int) -> float:
    """Median seconds of one target call: K rows of L+1 tokens on a cached prompt."""
    from transformers import DynamicCache

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


def bench_verification(pair, prompt, Ks, Ls, repeats, V: int = QWEN_VOCAB, blocks_per_shape: int = 3) -> list[dict]:
    """Seconds per call of every rule on real blocks of the pair (median over ``blocks_per_shape`` blocks x
    ``repeats``) and on synthetic ones, as a fraction of one target call of the same shape."""
    device = pair.device
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    shapes = [(K, L) for K in Ks for L in Ls]
    call_s = {shape: target_call_seconds(pair, *shape, prompt_len=128, repeats=max(2, repeats // 2))
              for shape in tqdm(shapes, desc=f"target calls [{pair.name}]", leave=False)}
    for K, L in tqdm(shapes, desc=f"verification [{pair.name}]", leave=False):
        real = real_blocks(pair, prompt, K, L, blocks_per_shape)
        synthetic = [synthetic_block(K, L, V, gen, device)]
        for name, spec in VERIFIERS.items():
            if spec.single_draft and K != 1:
                continue
            rule = get_verifier(name, check_inputs=False)
            medians = {}
            for case, blocks in (("real", real), ("synthetic", synthetic)):
                times = []
                for inputs in blocks:
                    rule(*inputs, generator=gen)  # warm-up
                    times += [timed(device, lambda rule=rule, inputs=inputs: rule(*inputs, generator=gen))[0]
                              for _ in range(repeats)]
                medians[case] = statistics.median(times)
            rows.append({"rule": name, "K": K, "L": L, "V": int(real[0][1].shape[-1]),
                         "verify_ms": 1e3 * medians["real"],
                         "verify_ms_synthetic": 1e3 * medians["synthetic"],
                         "real_blocks": len(real),
                         "target_call_ms": 1e3 * call_s[(K, L)],
                         "fraction_of_target_call": medians["real"] / call_s[(K, L)]})
        del real, synthetic
    return rows


def environment(device: torch.device) -> dict:
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def markdown(results: dict) -> str:
    lines = ["| benchmark | pair | ours tok/s | HF tok/s | ratio | target |", "|---|---|---|---|---|---|"]
    for key, target in (("ar_vs_hf_generate", ">= 1.0"), ("sd_vs_hf_assisted", ">= 1.2")):
        for pair, r in results[key].items():
            lines.append(f"| {key} | {pair} | {r['ours_tokens_per_s']:.2f} | {r['hf_tokens_per_s']:.2f} | "
                         f"{r['ratio']:.3f} | {target} |")
    lines += ["", "Where the time goes (per generated token, all timed rounds; forwards timed by hooks):", "",
              "| benchmark | pair | loop | tok/s | BE | target fwd/tok | ms/target fwd | draft fwd/tok | "
              "ms/draft fwd | ms/tok outside forwards | inside forwards |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in ("ar_vs_hf_generate", "sd_vs_hf_assisted"):
        for pair, r in results[key].items():
            for who in ("ours", "hf"):
                prof = r[f"{who}_profile"]
                lines.append(
                    f"| {key} | {pair} | {who} | {1e3 / prof['ms_per_token']:.2f} | {prof['block_efficiency']:.2f} | "
                    f"{prof.get('target_forwards_per_token', 0):.3f} | {prof.get('target_ms_per_forward', 0):.1f} | "
                    f"{prof.get('draft_forwards_per_token', 0):.3f} | {prof.get('draft_ms_per_forward', 0):.1f} | "
                    f"{prof['ms_per_token_outside_forwards']:.1f} | {100 * prof['fraction_inside_forwards']:.1f}% |")
    for pair, rows in results["methods"].items():
        lines += ["", f"Methods on {pair} (T={results['settings']['temperature']}):", "",
                  "| method | K | L | BE | speed-up vs our AR | tok/s | verify/target time | peak MB |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            frac = r.get("verify_fraction_of_target")
            lines.append(f"| {r['method']} | {r['K']} | {r['L']} | {r['block_efficiency']:.2f} | "
                         f"{r['speedup']:.2f}x | {r['tokens_per_s']:.2f} | "
                         f"{'' if frac is None else f'{100 * frac:.1f}%'} | {r['peak_memory_mb']:.0f} |")
    ver = results["verification"]
    lines += ["", f"Verification per call ({ver['target_model']}, V={ver['rows'][0]['V']}): median over real blocks "
              "the engine built on the pair (HumanEval prompt, T=0.7), and on synthetic blocks; fraction = real / "
              "one target call of the same shape:", "",
              "| rule | K | L | ms, real blocks | ms, synthetic | target call ms | fraction |",
              "|---|---|---|---|---|---|---|"]
    for r in ver["rows"]:
        lines.append(f"| {r['rule']} | {r['K']} | {r['L']} | {r['verify_ms']:.2f} | "
                     f"{r['verify_ms_synthetic']:.2f} | {r['target_call_ms']:.1f} | "
                     f"{100 * r['fraction_of_target_call']:.1f}% |")
    by_key = {(r["rule"], r["K"], r["L"]): r["verify_ms"] for r in ver["rows"]}
    for K, L in sorted({(r["K"], r["L"]) for r in ver["rows"]}):
        if (("spectr", K, L) in by_key) and (("spectr_gbv", K, L) in by_key):
            lines.append(f"\nspectr_gbv / spectr verification time at K={K}, L={L}: "
                         f"{by_key[('spectr_gbv', K, L)] / by_key[('spectr', K, L)]:.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced run on SmolLM2 (< ~3 minutes)")
    parser.add_argument("--out", default="results/bench/bench.json")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None,
                        help="model dtype for both contenders (default: the pair's own, bfloat16 for the Qwen pair)")
    args = parser.parse_args(argv)

    if args.quick:
        pairs_ar, pair_spec = ["smollm2_135m_self"], "smollm2_135m_self"
        num_prompts, max_new_tokens, repeats, L_assist = 2, 32, 3, 6
        points = [("sd", 1, 6), ("bv", 1, 6), ("spectr", 3, 6), ("spectr_gbv", 3, 6), ("sbv", 3, 6)]
        Ks, Ls, ver_repeats = [1, 3], [4, 12], 3
    else:
        pairs_ar, pair_spec = ["smollm2_135m_self", "qwen25coder_1.5b_0.5b"], "qwen25coder_1.5b_0.5b"
        # The reference setting (4 HumanEval prompts, 64 tokens, T=0.7, L=6): about 30 minutes on
        # 2 CPU cores in bfloat16 (a Qwen 1.5B decode step ~0.2 s, a prompt prefill 2-5 s).
        num_prompts, max_new_tokens, repeats, L_assist = 4, 64, 3, 6
        points = [("sd", 1, 6), ("bv", 1, 6), ("gbv", 1, 6)] + [
            (m, 3, 6) for m in ("spectr", "spectr_gbv", "rbv", "sbv")]
        Ks, Ls, ver_repeats = [1, 3, 7], [4, 12, 24], 5

    results: dict = {"settings": {"quick": args.quick, "temperature": args.temperature, "dataset": args.dataset,
                                  "num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
                                  "repeats": repeats, "assist_L": L_assist},
                     "ar_vs_hf_generate": {}, "sd_vs_hf_assisted": {}, "methods": {}}
    started = time.perf_counter()
    for name in pairs_ar:
        pair = load_pair(name, device=args.device, dtype=args.dtype)
        prompts = encode_prompts(pair, args.dataset, num_prompts)
        results["ar_vs_hf_generate"][name] = bench_ar_vs_hf(pair, prompts, args.temperature, max_new_tokens,
                                                            repeats)
    pair = load_pair(pair_spec, device=args.device, dtype=args.dtype)
    prompts = encode_prompts(pair, args.dataset, num_prompts)
    results["sd_vs_hf_assisted"][pair.name] = bench_sd_vs_assisted(pair, prompts, args.temperature,
                                                                  max_new_tokens, L_assist, repeats)
    results["methods"][pair.name] = bench_methods(pair, prompts, args.temperature, max_new_tokens, points)
    results["verification"] = {"target_model": pair.name,
                               "rows": bench_verification(pair, prompts[0], Ks, Ls, ver_repeats)}
    results["environment"] = environment(pair.device)
    results["wall_time_s"] = time.perf_counter() - started

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, out)
    print(markdown(results))
    print(f"\nwrote {out} ({results['wall_time_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
