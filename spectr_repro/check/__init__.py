"""``python -m spectr_repro check``: does the harness work on this machine, and what will a run cost here?

    python -m spectr_repro check model_pair=tiny_random                       # seconds, CI
    python -m spectr_repro check                                              # the Qwen pair (after make models)
    python -m spectr_repro check experiment=cpu_quick check.quick=true        # what `make reproduce` runs
    python -m spectr_repro check hardware=cuda model_pair=deepseek_33b_1.3b check.random_weights=true

Keys: those of ``run`` (hardware, model_pair, K, L, experiment, ...; composed by the runner's Hydra config)
plus ``check.*`` (conf/config.yaml): ``random_weights`` (build the pair from its configs, no download),
``quick`` (fewer shapes: the smallest and largest L and prefill chunk), ``output`` (folder of check.json),
``replay_summary`` (a replay's CSV: predict the fastest lossless configuration). With an experiment, the
shapes calibrated are those of its grid (every K and L, its prompt batch size).

It checks, in order:

1. environment: device, free memory, bfloat16/float16, whether torch.compile works, the sandbox mode;
2. memory: whether the pair fits at the largest K, L and batch without offload, before anything loads;
3. correctness on the device, on the pair's draft model in float32 as the target (its own dtype as the
   draft; the tiny pair when weights are absent): greedy AR and sd tokens equal ``model.generate``'s,
   batched decoding gives batch 1's tokens at T=0, every registered rule runs one block;
4. calibration: seconds per forward of target and draft at the run's shapes, written to this machine's
   calibration file (``spectr_repro.check.calibration``), which ``plan`` then uses;
5. timing sanity: the section times of one prompt sum to its synchronised wall time within 5 %.

One table on stdout, ``<check.output>/check.json`` beside it; exit 0 only when every correctness and
timing item passed (1 when one failed or the pair cannot be loaded, 2 for bad input).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

TIMING_TOLERANCE = 0.05  # section times vs synchronised wall time (issue 26)
CONTEXT_TOKENS = 1024  # KV context the memory check provisions per row (a long prompt plus its completion)


@dataclass
class Item:
    section: str
    name: str
    status: str  # "pass", "fail", "info", "skip"
    detail: str
    required: bool = False  # counts for the exit status
    seconds: float = 0.0


class Checker:
    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, section: str, name: str, status: str, detail: str, required: bool = False,
            seconds: float = 0.0) -> Item:
        item = Item(section, name, status, detail, required, round(seconds, 3))
        self.items.append(item)
        print(f"  [{status}] {section}: {name} - {detail}", file=sys.stderr, flush=True)
        return item

    def run(self, section: str, name: str, function, required: bool = True) -> Any:
        """``function()`` -> (passed: bool | None, detail, value); an exception is a failure with its message."""
        start = time.perf_counter()
        try:
            passed, detail, value = function()
        except Exception as error:  # a check that crashes on this device is a failed check, not a traceback
            self.add(section, name, "fail", f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
                     required, time.perf_counter() - start)
            return None
        status = "info" if passed is None else ("pass" if passed else "fail")
        self.add(section, name, status, detail, required and passed is not None, time.perf_counter() - start)
        return value

    @property
    def passed(self) -> bool:
        return all(item.status != "fail" for item in self.items if item.required)


# --------------------------------------------------------------------------------------------------
# Configuration


def compose(argv: Sequence[str]):
    """(base config, every cell config) of the command line, through the runner's Hydra machinery."""
    from spectr_repro.runner.config import Composer, UsageError, expand, parse_arguments, validate

    args = parse_arguments(argv)
    if args.sweeps:
        raise UsageError("check takes one value per key (an experiment gives it a grid's shapes)")
    if args.launcher_overrides:
        raise UsageError("hydra/launcher overrides apply to `sweep` only")
    with Composer() as composer:
        cells = expand(composer, args, use_grid=True)  # first: it refuses unknown nested keys by name
        base = composer.compose(args.fixed)
    for cfg in [base, *cells]:
        validate(cfg)
    device = str(base.hardware.device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"hardware device {device!r} but no CUDA device is visible to torch; use hardware=cpu")
    return base, cells


def run_shapes(base, cells, quick: bool = False) -> dict[str, Any]:
    """K, L, prefill chunks and prompt batch sizes of the cells of the base config's pair (the base config's
    alone without a grid). ``quick``: only the smallest and largest L and prefill chunk (the costs between
    are interpolated, see ``check.calibration``)."""
    from spectr_repro.data import typical_prompt_tokens

    Ks, Ls, chunks, batches = {1, int(base.K)}, {int(base.L)}, set(), {1}
    for cfg in cells:
        if cfg.choices.model_pair != base.choices.model_pair:
            continue
        if cfg.method.name != "ar":
            Ks.add(int(cfg.K))
            Ls.add(int(cfg.L))
        batches.add(int(cfg.hardware.get("batch_prompts") or 1))
        prompt = typical_prompt_tokens(cfg.choices.dataset)
        chunk = int(cfg.hardware.get("prefill_chunk") or prompt)
        chunks.update([min(chunk, prompt)] + ([prompt % chunk] if prompt > chunk and prompt % chunk else []))
    chunks.add(32)  # the runner's warm-up prompt
    if quick:
        Ls, chunks = {min(Ls), max(Ls)}, {min(chunks), max(chunks)}
    return {"Ks": sorted(Ks), "Ls": sorted(Ls), "prefill_chunks": sorted(chunks), "batch_sizes": sorted(batches)}


# --------------------------------------------------------------------------------------------------
# The items


def environment_items(checker: Checker, base) -> dict[str, Any]:
    from spectr_repro.environment import environment

    device = torch.device(str(base.hardware.device))
    env = environment(str(device))
    free, total = free_memory(device)
    checker.add("environment", "device", "info", f"{env['device_name']} ({device}), torch {env['torch']}, "
                f"transformers {env['transformers']}, {env['num_threads']} threads")
    checker.add("environment", "memory free", "info", f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB")
    for dtype in (torch.bfloat16, torch.float16):
        checker.run("environment", f"{str(dtype).removeprefix('torch.')} matmul", lambda dtype=dtype: _dtype_works(
            device, dtype), required=False)
    if bool(base.check.quick) and not base.hardware.compile:  # inductor's first build takes ~30 s on a small CPU
        checker.add("environment", "torch.compile", "skip", "not checked in quick mode (hardware.compile is false)")
    else:
        checker.run("environment", "torch.compile", lambda: _compile_works(device),
                    required=bool(base.hardware.compile))
    checker.run("environment", "sandbox", _sandbox_mode, required=False)
    return env | {"memory_free_bytes": free, "memory_total_bytes": total}


def free_memory(device: torch.device) -> tuple[int, int]:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def _dtype_works(device, dtype):
    a = torch.ones(64, 64, device=device, dtype=dtype)
    value = float((a @ a)[0, 0])
    native = ""
    if device.type == "cpu" and dtype == torch.bfloat16:
        flags = _cpu_flags()
        native = ", native (avx512_bf16/amx)" if {"avx512_bf16", "amx_bf16"} & flags else ", emulated (slow)"
    if device.type == "cuda" and dtype == torch.bfloat16:
        native = ", native" if torch.cuda.is_bf16_supported() else ", not native"
    return value == 64.0, f"runs{native}", None


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compile_works(device):
    start = time.perf_counter()
    compiled = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1)
    x = torch.randn(8, device=device)
    ok = torch.allclose(compiled(x), torch.nn.functional.silu(x) * 2 + 1)
    return ok, f"compiles and matches eager ({time.perf_counter() - start:.1f} s)", None


def _sandbox_mode():
    from spectr_repro.quality.sandbox import SandboxUnavailable, find_sandbox

    try:
        return None, find_sandbox("auto").describe(), None
    except SandboxUnavailable as error:
        return None, f"none isolates here: HumanEval pass@1 will refuse to run ({str(error)[:160]})", None


def memory_item(checker: Checker, base, pair_cfg: dict, shapes: dict[str, Any], free: int) -> bool:
    """Whether target and draft, their KV caches at the largest rows and the logits fit in ``free`` bytes."""
    from spectr_repro.check.architectures import architecture_config, kv_cache_bytes, parameter_count

    dtype = _dtype(base, pair_cfg)
    width = torch.tensor([], dtype=dtype).element_size()
    rows = max(shapes["Ks"]) * max(shapes["batch_sizes"])
    tokens = max(shapes["Ls"]) + 1
    if pair_cfg["source"] == "tiny":
        checker.add("memory", "fits without offload", "pass", "tiny pair (a few MB)")
        return True
    need = 0
    parts = []
    for role in ("target", "draft"):
        config = architecture_config(pair_cfg, role)
        weights = parameter_count(config) * width
        cache = kv_cache_bytes(config, rows, CONTEXT_TOKENS, width)
        logits = 3 * rows * tokens * int(config.vocab_size) * 4  # logits, float32 probabilities, a copy
        need += weights + cache + logits
        parts.append(f"{role} {weights / 2**30:.1f} GiB + KV {cache / 2**30:.2f} + logits {logits / 2**30:.2f}")
    need = int(need * 1.1)  # allocator slack and activations
    fits = need <= free
    checker.add("memory", "fits without offload", "pass" if fits else "fail",
                f"needs ~{need / 2**30:.1f} GiB at {rows} rows x {tokens} tokens ({'; '.join(parts)}), "
                f"{free / 2**30:.1f} GiB free", required=False)
    return fits


def _dtype(base, pair_cfg: dict) -> torch.dtype:
    from spectr_repro.models import as_dtype

    return as_dtype(base.hardware.get("dtype") or pair_cfg.get("dtype") or "float32")


@dataclass
class LoadedPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    vocab_size: int
    what: str  # how it was obtained (real weights, random weights, tiny)


def load_models(base, pair_cfg: dict, random_weights: bool) -> LoadedPair:
    """The pair's target and draft on the device: real weights (``models.load_pair``) or random ones."""
    from spectr_repro import models
    from spectr_repro.check.architectures import architecture_config, build_random_model

    device = torch.device(str(base.hardware.device))
    dtype = _dtype(base, pair_cfg)
    if random_weights and pair_cfg["source"] != "tiny":
        target = build_random_model(architecture_config(pair_cfg, "target"), device, dtype, seed=0)
        draft = build_random_model(architecture_config(pair_cfg, "draft"), device, dtype, seed=1)
        vocab = min(m.get_output_embeddings().weight.shape[0] for m in (target, draft))
        return LoadedPair(target, draft, vocab, f"random weights from the configs, {str(dtype)[6:]}")
    pair = models.load_pair(pair_cfg, device=device, dtype=dtype)
    what = "tiny random pair" if pair_cfg["source"] == "tiny" else f"real weights, {str(dtype)[6:]}"
    return LoadedPair(pair.target, pair.draft, pair.vocab_size, what)


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
    from spectr_repro.engine import generate, generate_batch
    from spectr_repro.verify import VERIFIERS

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


def calibration_item(checker: Checker, base, pair_cfg, loaded: LoadedPair, shapes, quick: bool, device_name: str):
    from spectr_repro.check.calibration import Calibration, measure_forward_costs, plan_shapes, today
    from spectr_repro.runner.plan import calibration_dtype

    wanted = plan_shapes(shapes["Ks"], shapes["Ls"], shapes["prefill_chunks"], shapes["batch_sizes"])
    repeats = 3  # medians of 3 rounds, quick too: one timed forward per shape once read 880 ms for a 320 ms shape

    def measure():
        target = measure_forward_costs(loaded.target, wanted["target"], repeats, vocab_size=loaded.vocab_size)
        draft = measure_forward_costs(loaded.draft, wanted["draft"], repeats, vocab_size=loaded.vocab_size)
        calibration = Calibration(
            hardware=str(base.choices.hardware), model_pair=str(base.choices.model_pair),
            dtype=calibration_dtype(base), device=device_name, date=today(),
            random_weights=loaded.what.startswith("random"), target=target, draft=draft,
            extra={"repeats": repeats, "shapes": shapes})
        detail = (f"{len(wanted['target'])} target and {len(wanted['draft'])} draft shapes; decode "
                  f"{1e3 * target.seconds(1, 1):.1f} / {1e3 * draft.seconds(1, 1):.1f} ms (target / draft)")
        return None, detail, calibration

    return checker.run("calibration", "seconds per forward", measure, required=True)


def timing_item(checker: Checker, base, loaded: LoadedPair, calibration, quick: bool):
    """One prompt decoded at the configured method: sections vs wall time; the overhead per call that the
    forwards do not explain (sampling, verification, cache bookkeeping) goes into the calibration."""
    from spectr_repro.check.predict import seconds_per_call
    from spectr_repro.engine import generate
    from spectr_repro.verify import VERIFIERS

    method = base.method.name
    K = 1 if method == "ar" or VERIFIERS[method].single_draft else int(base.K)
    L = 1 if method == "ar" else int(base.L)
    device = next(loaded.target.parameters()).device
    prompt = random_prompts(1, 48, loaded.vocab_size, device, seed=2)[0]

    def check():
        out = generate(loaded.target, loaded.draft, prompt, method=method, K=K, L=L, temperature=float(
            base.temperature), max_new_tokens=16 if quick else 32, seed=0, vocab_size=loaded.vocab_size,
            prefill_chunk=base.hardware.get("prefill_chunk"))
        times = out.stats["time_s"]
        sections = sum(v for k, v in times.items() if k != "total")
        gap = abs(times["total"] - sections) / times["total"]
        overhead = None
        if calibration is not None and method != "ar" and out.target_calls > 1:
            forwards = seconds_per_call(calibration.target, calibration.draft, K, L)
            decode = times["total"] - times.get("prefill", 0.0)
            overhead = max(0.0, decode / (out.target_calls - 1) - forwards)
        detail = (f"{method} K={K} L={L}: sections {sections:.3f} s, wall {times['total']:.3f} s "
                  f"({100 * gap:.1f} % apart, tolerance {100 * TIMING_TOLERANCE:.0f} %)")
        if overhead is not None:
            detail += f"; {1e3 * overhead:.1f} ms per call outside the forwards"
        return gap <= TIMING_TOLERANCE, detail, overhead

    return checker.run("timing", "sections sum to the synchronised wall time", check)


def prediction_item(checker: Checker, base, calibration, replay_summary: str) -> dict | None:
    from spectr_repro.check.predict import best_configuration, describe_best, predict_tokens_per_s, read_replay_summary
    from spectr_repro.data import typical_prompt_tokens

    def predict():
        table = read_replay_summary(replay_summary, _replay_filters(base, replay_summary))
        predictions = predict_tokens_per_s(table, calibration.target, calibration.draft,
                                           float(calibration.extra.get("overhead_s_per_call", 0.0)),
                                           typical_prompt_tokens(base.choices.dataset), int(base.max_new_tokens))
        best = best_configuration(predictions)
        return None, describe_best(best), {"best": best, "predictions": predictions.to_dict("records")}

    return checker.run("prediction", "fastest lossless configuration", predict, required=False)


def _replay_filters(base, path: str) -> dict[str, Any]:
    """Select the replay rows of this command's pair, dataset and temperature where the CSV has those columns."""
    import pandas as pd

    columns = set(pd.read_csv(path, nrows=0).columns)
    wanted = {"model_pair": base.choices.model_pair, "dataset": base.choices.dataset,
              "temperature": float(base.temperature)}
    return {key: value for key, value in wanted.items() if key in columns}


# --------------------------------------------------------------------------------------------------
# Output


def format_table(items: Sequence[Item]) -> str:
    import pandas as pd

    frame = pd.DataFrame([{"section": i.section, "item": i.name, "result": i.status.upper(),
                           "detail": i.detail, "s": f"{i.seconds:.1f}"} for i in items])
    return frame.to_markdown(index=False)


def run_check(argv: Sequence[str]) -> tuple[int, dict[str, Any]]:
    from omegaconf import OmegaConf

    from spectr_repro import models
    from spectr_repro.check.calibration import write_calibration

    started = time.perf_counter()
    base, cells = compose(argv)
    settings = base.check
    quick, random_weights = bool(settings.quick), bool(settings.random_weights)
    pair_cfg = models.pair_config(OmegaConf.to_container(base.model_pair, resolve=True)
                                  | {"name": base.model_pair.get("name") or base.choices.model_pair})
    shapes = run_shapes(base, cells, quick)
    checker = Checker()
    print(f"check: model pair {base.choices.model_pair} on hardware={base.choices.hardware}"
          f"{' (random weights)' if random_weights else ''}{' (quick)' if quick else ''}", file=sys.stderr)
    env = environment_items(checker, base)
    try:
        fits = memory_item(checker, base, pair_cfg, shapes, env["memory_free_bytes"])
    except ValueError as error:  # no config of the pair's architecture here: say so, load as usual
        fits = None
        checker.add("memory", "fits without offload", "skip", str(error))
    result: dict[str, Any] = {"model_pair": base.choices.model_pair, "hardware": base.choices.hardware,
                              "random_weights": random_weights, "quick": quick, "shapes": shapes,
                              "output": str(settings.output), "environment": env}
    loaded = None
    if fits is False:
        checker.add("models", "load", "skip", "the pair does not fit: nothing loaded, no calibration")
    else:
        start = time.perf_counter()
        try:
            loaded = load_models(base, pair_cfg, random_weights)
            checker.add("models", "load", "pass", loaded.what, required=True, seconds=time.perf_counter() - start)
        except (ValueError, OSError, ImportError) as error:
            checker.add("models", "load", "fail", " ".join(str(error).split())[:400], required=True,
                        seconds=time.perf_counter() - start)
    if loaded is not None:
        target, draft = correctness_models(loaded, pair_cfg)
        correctness_items(checker, target, draft, loaded.vocab_size, quick)
        del target, draft
        calibration = calibration_item(checker, base, pair_cfg, loaded, shapes, quick, env["device_name"])
        overhead = timing_item(checker, base, loaded, calibration, quick)
        if calibration is not None:
            if overhead is not None:
                calibration.extra["overhead_s_per_call"] = overhead
            path = write_calibration(calibration)
            checker.add("calibration", "written", "info", f"{calibration.note} -> {path}")
            result["calibration"] = {"path": str(path), **calibration.to_json()}
            if settings.get("replay_summary"):
                result["prediction"] = prediction_item(checker, base, calibration, str(settings.replay_summary))
    result["items"] = [asdict(item) for item in checker.items]
    result["passed"] = checker.passed and loaded is not None
    result["wall_time_s"] = time.perf_counter() - started
    return (0 if result["passed"] else 1), result


def main(argv: Sequence[str] | None = None) -> int:
    from spectr_repro.errors import UsageError
    from spectr_repro.runner.config import print_help_if_asked
    from spectr_repro.runner.store import atomic_write_text

    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        code, result = run_check(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # a pair config that names no usable architecture
        print(f"error: {error}", file=sys.stderr)
        return 1
    items = [Item(**item) for item in result["items"]]
    print(format_table(items))
    if result.get("prediction"):
        from spectr_repro.check.predict import describe_best

        print("\n" + describe_best(result["prediction"]["best"]))
    output = Path(result["output"]).expanduser() / "check.json"
    atomic_write_text(output, json.dumps(result, indent=2, default=str) + "\n")
    verdict = "every correctness item passed" if code == 0 else "SOME CORRECTNESS ITEM FAILED (see the table)"
    print(f"\n{verdict}; {result['wall_time_s']:.0f} s; wrote {output}")
    return code


__all__ = ["Item", "TIMING_TOLERANCE", "main", "run_check", "run_shapes"]
