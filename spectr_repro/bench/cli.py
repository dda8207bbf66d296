"""``python -m spectr_repro bench [--quick]``: speed benchmarks, our loops against transformers'.

    python -m spectr_repro bench             # preset conf/bench/full.yaml (needs `make models`)
    python -m spectr_repro bench --quick     # preset conf/bench/quick.yaml: SmolLM2 only, a few minutes

Presets are configs (``spectr_repro/conf/bench/<name>.yaml``, composed with the hardware config the runner
uses, so the engine runs as in a sweep). Results: a Markdown report on stdout and ``results/bench/bench.json``
(with the date and the command), from which ``python -m spectr_repro.bench.docs`` regenerates docs/speed.md.
Every ratio is measured side by side in one process, on the same prompts, after a warm-up, over several
rounds in rotating order, and reported as the median (see ``bench.measure`` and ``bench.suites``).
Timings need a quiet machine: nothing else should run beside a benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import shlex
import sys
import time
from pathlib import Path

from spectr_repro.errors import UsageError
from spectr_repro.files import atomic_write_text

log = logging.getLogger(__name__)

TARGETS = {"ar_vs_hf_generate": ">= 1.0", "sd_vs_hf_assisted": ">= 1.2 (equal L)",
           "best_vs_hf_assisted_defaults": ">= 1.15", "best_vs_hf_generate": ">= 1.5"}


def compose_preset(name: str, device: str):
    """The bench preset ``name`` and the hardware config of ``device`` (cpu or cuda), through Hydra. A preset with
    ``batches`` is refused here, before any model loads, when its largest batch does not fit the device's memory
    (UsageError naming the largest B that does)."""
    from spectr_repro.runner.config import Composer  # hydra, omegaconf, torch: bench.cli starts in ~0.09 s
    from spectr_repro.runner.fit import check_batch_fits  # the cost model, as runner.config: bench.cli stays light

    with Composer() as composer:
        cfg = composer.compose([f"+bench={name}", f"hardware={device}"])
        batches = cfg.bench.get("batches")
        if batches:
            whole = composer.compose([f"+bench={name}", f"hardware={device}", f"model_pair={cfg.bench.pair}",
                                      f"dataset={batches.datasets[0]}", f"max_new_tokens={cfg.bench.max_new_tokens}"])
            check_batch_fits(whole, max(int(b) for b in batches.B), max(int(c[1]) for c in batches.contenders),
                             max(int(c[2]) for c in batches.contenders), f"bench.batches.B (preset {name})")
    return cfg.bench, cfg.hardware


def predicted_pick(replay_summary: str, hardware, preset, pair, prompts, calibrate=None) -> dict:
    """ours_best predicted from a replay summary and the pair's costs measured here, in this process, just before
    the rounds (``cost.measure.measure_forward_costs`` at the shapes the replay's K and L call): a cost
    file written earlier by ``check`` can be off by the machine's drift since (measured: 120 ms, then 207 ms,
    for one decode forward on the shared 2-core VM); its per-call overhead is used where there is one.
    ``calibrate``: (pair, shapes) -> (target costs, draft costs), for tests."""
    import pandas as pd  # cost model/pandas (~0.7 s): this command's start-up does not pay for it

    from spectr_repro.cost.calibration import find_calibration, today  # cost model/pandas (~0.7 s): start-up without

    # cost model/pandas (~0.7 s): this command's start-up does not pay for it
    from spectr_repro.cost.measure import measure_forward_costs, plan_shapes
    from spectr_repro.cost.model import CallCosts  # cost model/pandas (~0.7 s): start-up without

    # cost model/pandas (~0.7 s): this command's start-up does not pay for it
    from spectr_repro.cost.predict import best_configuration, predict_tokens_per_s, read_replay_summary

    try:
        columns = pd.read_csv(replay_summary, nrows=0).columns
        # The replay's rows at the bench's setting: its temperature and, for a replay of several datasets, its dataset.
        wanted = {"temperature": float(preset.temperature), "dataset": preset.get("dataset")}
        table = read_replay_summary(replay_summary, {key: value for key, value in wanted.items()
                                                     if key in columns and value is not None})
    except (OSError, ValueError) as error:
        raise UsageError(str(error)) from None
    prompt_tokens = round(sum(len(p) for p in prompts) / len(prompts))
    shapes = plan_shapes(sorted(set(table["K"].astype(int))), sorted(set(table["L"].astype(int))), [prompt_tokens])

    def measure(pair, shapes):
        return tuple(measure_forward_costs(model, shapes[role], repeats=3, vocab_size=pair.vocab_size)
                     for model, role in ((pair.target, "target"), (pair.draft, "draft")))

    target, draft = (calibrate or measure)(pair, shapes)
    stored = find_calibration("cuda" if pair.device.type == "cuda" else "cpu", preset.pair,
                              str(pair.dtype).removeprefix("torch."))
    # The forwards from this process; the rules' calls and the sections' overheads from `check`'s calibration.
    stored_costs = CallCosts.from_calibration(stored) if stored is not None else CallCosts(target, draft)
    costs = dataclasses.replace(stored_costs, target=target, draft=draft)
    predictions = predict_tokens_per_s(table, costs, prompt_tokens, int(preset.max_new_tokens))
    return best_configuration(predictions) | {
        "calibration": (f"forwards measured in this process before the rounds, {today()}"
                        + (f"; rules and overheads {stored.note}" if stored is not None else "")),
        "predictions": json.loads(predictions.head(10).to_json(orient="records"))}


def run(preset, hardware, device: str | None, dtype: str | None, replay_summary: str | None = None,
        checkpoint: Path | None = None) -> dict:
    """Every section of ``preset``; the batch section keeps its progress in ``checkpoint`` and resumes from it."""
    from spectr_repro.bench import suites  # torch, models, transformers: bench.cli starts in ~0.09 s
    from spectr_repro.bench.contenders import encode_prompts  # torch, models, transformers: bench.cli starts in ~0.09 s
    from spectr_repro.environment import environment  # torch, models, transformers: bench.cli starts in ~0.09 s
    from spectr_repro.models import clear_cache, load_pair  # torch, models, transformers: bench.cli starts in ~0.09 s

    chunk = hardware.get("prefill_chunk")
    # A preset may leave sections out (e.g. verification_qwen: the verification rows only).
    results: dict = {"settings": {key: preset.get(key) for key in ("dataset", "num_prompts", "max_new_tokens",
                                                                    "temperature", "repeats", "assist_L")},
                     "ar_vs_hf_generate": {}, "sd_vs_hf_assisted": {}, "methods": {}}
    T, n, m, repeats = preset.temperature, preset.num_prompts, preset.max_new_tokens, preset.repeats
    started = time.perf_counter()
    for name in preset.get("pairs_ar") or []:
        if name == preset.pair:
            continue  # measured below, with the pair loaded once
        pair = load_pair(name, device=device, dtype=dtype)
        prompts = encode_prompts(pair, preset.dataset, n)
        results["ar_vs_hf_generate"][name] = suites.bench_ar_vs_hf(pair, prompts, T, m, repeats, chunk)
        del pair
        clear_cache()  # one pair in memory at a time
    pair = load_pair(preset.pair, device=device, dtype=dtype)
    prompts = encode_prompts(pair, preset.dataset, n)
    if preset.pair in (preset.get("pairs_ar") or []):
        results["ar_vs_hf_generate"][pair.name] = suites.bench_ar_vs_hf(pair, prompts, T, m, repeats, chunk)
    if preset.get("assist_L"):
        results["sd_vs_hf_assisted"][pair.name] = suites.bench_sd_vs_assisted(pair, prompts, T, m, preset.assist_L,
                                                                             repeats, chunk)
    best = preset.get("best_vs_best")
    if best:
        pick = predicted_pick(replay_summary, hardware, preset, pair, prompts) if replay_summary else None
        results["best_vs_best"] = {pair.name: suites.bench_best_vs_best(
            pair, prompts, T, m, best.equal_L, [tuple(c) for c in best.candidates], repeats, chunk, pick=pick)}
    if preset.get("methods"):
        results["methods"][pair.name] = suites.bench_methods(pair, prompts, T, m,
                                                             [tuple(p) for p in preset.methods], chunk)
    if preset.get("batches"):
        results["batches"] = {"pair": pair.name, **_batches(pair, preset.batches, T, m, chunk, checkpoint)}
    ver = preset.get("verification")
    if ver:
        results["verification"] = {"target_model": pair.name, "rows": suites.bench_verification(
            pair, prompts[0], list(ver.Ks), list(ver.Ls), ver.repeats, ver.blocks_per_shape, chunk,
            rules=list(ver.get("rules") or []) or None)}
    results["environment"] = environment(str(pair.device))
    results["wall_time_s"] = time.perf_counter() - started
    return results


def _batches(pair, spec, temperature: float, new_tokens: int, chunk, checkpoint: Path | None = None) -> dict:
    """The timed batch groups of ``spec`` (``bench.batches``): each dataset's first ``prompts_per_dataset`` prompts,
    and the next prompt of the first dataset for the calibration (decoded by no group)."""
    from spectr_repro.bench.batches import BatchCheckpoint, bench_batches, checkpoint_identity  # torch: light start-up
    from spectr_repro.bench.contenders import encode_prompts  # torch/models: light start-up

    needed = int(spec.prompts_per_dataset)
    prompts = {str(name): encode_prompts(pair, str(name), needed + (1 if i == 0 else 0))
               for i, name in enumerate(spec.datasets)}
    calibration_prompt = prompts[str(spec.datasets[0])].pop()
    kept = None
    if checkpoint is not None:
        kept = BatchCheckpoint(checkpoint, checkpoint_identity(pair, spec, temperature, new_tokens, chunk))
        if kept.note:
            print(kept.note, file=sys.stderr)
    return bench_batches(pair, prompts, calibration_prompt, [tuple(c) for c in spec.contenders],
                         [int(b) for b in spec.B], temperature, new_tokens, chunk, kept)


def _profile_cells(prof: dict) -> str:
    return (f"{prof['block_efficiency']:.2f} | {prof.get('target_forwards_per_token', 0):.3f} | "
            f"{prof.get('target_ms_per_forward', 0):.1f} | {prof.get('draft_forwards_per_token', 0):.3f} | "
            f"{prof.get('draft_ms_per_forward', 0):.1f} | {prof['ms_per_token_outside_forwards']:.1f} | "
            f"{100 * (prof['fraction_inside_forwards'] or 0):.1f}% |")


PROFILE_HEADER = ("BE | target fwd/tok | ms/target fwd | draft fwd/tok | ms/draft fwd | ms/tok outside forwards | "
                  "inside forwards |")


def markdown(results: dict) -> str:
    if results.get("batches"):
        from spectr_repro.bench.batches import markdown as batches_markdown  # torch/engine: bench.docs stays light

        return batches_markdown(results["batches"], results["batches"]["pair"])
    if not (results["ar_vs_hf_generate"] or results["sd_vs_hf_assisted"]):  # a preset without those sections
        return _best_methods_verification(results, [])
    lines = ["| benchmark | pair | ours tok/s | HF tok/s | ratio | target |", "|---|---|---|---|---|---|"]
    for key in ("ar_vs_hf_generate", "sd_vs_hf_assisted"):
        for pair, r in results[key].items():
            lines.append(f"| {key} | {pair} | {r['ours_tokens_per_s']:.2f} | {r['hf_tokens_per_s']:.2f} | "
                         f"{r['ratio']:.3f} | {TARGETS[key]} |")
    lines += ["", "Where the time goes (per generated token, all timed rounds; forwards timed by hooks):", "",
              f"| benchmark | pair | loop | tok/s | {PROFILE_HEADER}", "|---|---|---|---|" + "---|" * 7]
    for key in ("ar_vs_hf_generate", "sd_vs_hf_assisted"):
        for pair, r in results[key].items():
            for who in ("ours", "hf"):
                prof = r[f"{who}_profile"]
                lines.append(f"| {key} | {pair} | {who} | {1e3 / prof['ms_per_token']:.2f} | {_profile_cells(prof)}")
    return _best_methods_verification(results, lines)


def _best_methods_verification(results: dict, lines: list[str]) -> str:
    """The best-against-best, methods and verification sections (each only where the results have it)."""
    for pair, r in results.get("best_vs_best", {}).items():
        best = r["best"]
        chosen = "predicted from a replay" if "predicted_tokens_per_s" in r else "chosen by a sweep on other seeds"
        lines += ["", f"Best against best on {pair} (same rounds; ours_best = {best['method']} K={best['K']} "
                  f"L={best['L']}, {chosen}):", "",
                  f"| contender | tok/s | vs HF assisted (defaults) | vs HF generate | {PROFILE_HEADER}",
                  "|---|---|---|---|" + "---|" * 7]
        base_assisted = r["contenders"]["hf_assisted_defaults"]["tokens_per_s"]
        base_generate = r["contenders"]["hf_generate"]["tokens_per_s"]
        for name, c in r["contenders"].items():
            lines.append(f"| {name} | {c['tokens_per_s']:.2f} | {c['tokens_per_s'] / base_assisted:.2f}x | "
                         f"{c['tokens_per_s'] / base_generate:.2f}x | {_profile_cells(c['profile'])}")
        if "predicted_tokens_per_s" in r:
            lines += ["", f"ours_best predicted from the replay ({best.get('calibration', 'calibrated')}): "
                      f"{r['predicted_tokens_per_s']:.2f} tok/s; measured "
                      f"{r['contenders']['ours_best']['tokens_per_s']:.2f} ({r['measured_over_predicted']:.2f}x "
                      "the prediction; target within 10 %)."]
        lines += ["", f"ours_best / HF assisted at its defaults: {r['best_vs_hf_assisted_defaults']:.2f} "
                  f"(target {TARGETS['best_vs_hf_assisted_defaults']}); ours_best / HF generate: "
                  f"{r['best_vs_hf_generate']:.2f} (target {TARGETS['best_vs_hf_generate']})."]
        if r["sweep"]:
            lines += ["", "Sweep that chose ours_best (tok/s on seeds the rounds do not use):", "",
                      "| method | K | L | tok/s | BE |", "|---|---|---|---|---|"]
            lines += [f"| {s['method']} | {s['K']} | {s['L']} | {s['tokens_per_s']:.2f} | "
                      f"{s['block_efficiency']:.2f} |" for s in r["sweep"]]
        if best.get("predictions"):  # the prediction's runners-up, as predicted
            lines += ["", "Predicted tokens/s of the fastest lossless configurations (replay x costs measured here):",
                      "", "| method | K | L | tokens per call | ms per call | predicted tok/s |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {q['method']} | {q['K']} | {q['L']} | {q['tokens_per_call']:.2f} | "
                      f"{1e3 * q['seconds_per_call']:.0f} | {q['tokens_per_s']:.2f} |" for q in best["predictions"]]
    for pair, rows in results["methods"].items():
        lines += ["", f"Methods on {pair} (T={results['settings']['temperature']}):", "",
                  "| method | K | L | BE | speed-up vs our AR | tok/s | verify/target time | peak MB |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            frac = r.get("verify_fraction_of_target")
            lines.append(f"| {r['method']} | {r['K']} | {r['L']} | {r['block_efficiency']:.2f} | "
                         f"{r['speedup']:.2f}x | {r['tokens_per_s']:.2f} | "
                         f"{'' if frac is None else f'{100 * frac:.1f}%'} | {r['peak_memory_mb']:.0f} |")
    ver = results.get("verification")
    if not ver:
        return "\n".join(lines)
    lines += ["", f"Verification per call ({ver['target_model']}, V={ver['rows'][0]['V']}): median over real blocks "
              "the engine built on the pair (HumanEval prompt, T=0.7), and on synthetic blocks with agreeing drafts; "
              "fraction = real / one target call of the same shape; ops (kernel launches) and host reads "
              "(device->host synchronisations) per call, worst over the blocks:", "",
              "| rule | K | L | ms, real blocks | ms, synthetic | target call ms | fraction | ops | host reads |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in ver["rows"]:
        lines.append(f"| {r['rule']} | {r['K']} | {r['L']} | {r['verify_ms']:.2f} | "
                     f"{r['verify_ms_synthetic']:.2f} | {r['target_call_ms']:.1f} | "
                     f"{100 * r['fraction_of_target_call']:.1f}% | {r['ops_per_call']} | {r['host_reads_per_call']} |")
    return "\n".join(lines)


def checkpoint_path(out: Path) -> Path:
    """Where a bench writing ``out`` keeps its progress (the batch section: an hour or more on a CPU)."""
    return out.with_name(f"{out.stem}.partial.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectr_repro bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="preset 'quick': SmolLM2 only, a few minutes")
    parser.add_argument("--preset", default=None, help="a preset of conf/bench/ (default: full)")
    parser.add_argument("--out", default="results/bench/bench.json",
                        help="the results' JSON; a batch preset keeps its progress beside it (<name>.partial.json) "
                             "and the same command resumes from it")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--replay-summary", default=None,
                        help="a replay's replay_summary.csv: ours_best is the fastest lossless configuration "
                             "predicted from it and this machine's calibration (`check`), not the one-run sweep")
    parser.add_argument("--dtype", default=None,
                        help="model dtype for every contender (default: the pair's own; bfloat16 for the Qwen pair)")
    from spectr_repro import tracking  # torch, models, transformers: bench.cli starts in ~0.09 s

    tracking.add_logger_option(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    import torch  # torch (~2.8 s): bench.cli starts in ~0.09 s

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        from spectr_repro.runner.config import check_device  # hydra, omegaconf, torch: bench.cli starts in ~0.09 s

        check_device(device, "--device cpu")  # the message every command that loads models gives, before any loads
        preset, hardware = compose_preset(args.preset or ("quick" if args.quick else "full"), device.split(":")[0])
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        results = run(preset, hardware, device, args.dtype, args.replay_summary, checkpoint_path(Path(args.out)))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results["settings"]["preset"] = args.preset or ("quick" if args.quick else "full")
    # Where the figures came from, for the tables docs/speed.md is generated from (`python -m spectr_repro.bench.docs`).
    results["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results["command"] = shlex.join(["python", "-m", "spectr_repro", "bench", *argv])
    out = Path(args.out)
    atomic_write_text(out, json.dumps(results, indent=2))
    checkpoint_path(out).unlink(missing_ok=True)  # everything it kept is in ``out`` now
    print(markdown(results))
    print(f"\nwrote {out} ({results['wall_time_s']:.0f} s)")
    tracking.log_command("bench", tracking.logger_config(args.logger), out.parent, results=results,
                         config={**results["settings"], "environment": results.get("environment")})
    return 0


__all__ = ["compose_preset", "main", "markdown", "run"]
