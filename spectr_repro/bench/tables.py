"""The bench's results as Markdown tables (what ``python -m spectr_repro bench`` prints and
``python -m spectr_repro.bench.docs`` writes into docs/speed.md): plain formatting of the results' JSON, no
torch, so the docs regenerate without loading anything."""

from __future__ import annotations

import math
from typing import Any

TARGETS = {"ar_vs_hf_generate": ">= 1.0", "sd_vs_hf_assisted": ">= 1.2 (equal L)",
           "best_vs_hf_assisted_defaults": ">= 1.15", "best_vs_hf_generate": ">= 1.5"}


def _profile_cells(prof: dict) -> str:
    return (f"{prof['block_efficiency']:.2f} | {prof.get('target_forwards_per_token', 0):.3f} | "
            f"{prof.get('target_ms_per_forward', 0):.1f} | {prof.get('draft_forwards_per_token', 0):.3f} | "
            f"{prof.get('draft_ms_per_forward', 0):.1f} | {prof['ms_per_token_outside_forwards']:.1f} | "
            f"{100 * (prof['fraction_inside_forwards'] or 0):.1f}% |")


PROFILE_HEADER = ("BE | target fwd/tok | ms/target fwd | draft fwd/tok | ms/draft fwd | ms/tok outside forwards | "
                  "inside forwards |")


def markdown(results: dict) -> str:
    if results.get("batches"):
        return batch_markdown(results["batches"], results["batches"]["pair"])
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


def batch_markdown(result: dict[str, Any], pair_name: str) -> str:
    """The timed cells as a table, with the prediction's median and worst error."""
    settings = result["settings"]
    lines = [f"Speed-up against batch size on {pair_name} ({settings['prompts']} prompts of "
             f"{', '.join(settings['datasets'])} in turn, cut into groups of B; {settings['max_new_tokens']} tokens a "
             f"prompt, EOS off; T={settings['temperature']}; AR at the same B is 1.0):", "",
             "| rule | K | L | B | groups | tokens per call | measured (95 %) | predicted | error "
             "| after prefill: measured (95 %) | predicted | error |", "|---" * 12 + "|"]

    def measured(c, prefix):
        low, high = c[f"{prefix}speedup_low"], c[f"{prefix}speedup_high"]
        bounds = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
        error = 100 * c[f"{prefix}error"]
        return f"{c[f'{prefix}speedup']:.2f}{bounds} | {c[f'{prefix}predicted']:.2f} | {error:+.0f} %"

    for c in result["cells"]:
        lines.append(f"| {c['method']} | {c['K']} | {c['L']} | {c['B']} | {c['groups']} | {c['tokens_per_call']:.2f} | "
                     f"{measured(c, '')} | {measured(c, 'decode_')} |")
    retimed = "calibration_median_abs_error" in result
    source = ("each group's forwards timed again just before it; the rest " if retimed else "") + result["costs_source"]
    lines += ["", f"Prediction ({source}): end to end, median |error| "
              f"{100 * result['median_abs_error']:.1f} %, worst {100 * result['worst_abs_error']:.1f} %; after the "
              f"prefill, median {100 * result['decode_median_abs_error']:.1f} %, worst "
              f"{100 * result['decode_worst_abs_error']:.1f} % ({len(result['cells'])} cells)."]
    if retimed:
        lines += ["", "From the calibration alone (no forward timed again): end to end, median |error| "
                  f"{100 * result['calibration_median_abs_error']:.1f} %, worst "
                  f"{100 * result['calibration_worst_abs_error']:.1f} %; after the prefill, median "
                  f"{100 * result['decode_calibration_median_abs_error']:.1f} %, worst "
                  f"{100 * result['decode_calibration_worst_abs_error']:.1f} %."]
    if result.get("seconds_against_prediction"):  # runs from 2026-12-08 keep it; earlier: docs/speed.md's prose
        lines += ["", where_the_error_is(result["seconds_against_prediction"])]
    return "\n".join(lines)


def where_the_error_is(found: dict[str, Any]) -> str:
    """``bench.batches.seconds_against_prediction`` (as kept in the file: JSON) in a sentence."""
    Bs = ", ".join(str(B) for B in found["ar"])
    text = (f"Measured over predicted seconds after the prefill (medians at B = {Bs}): AR "
            + ", ".join(f"{v:.2f}" for v in found["ar"].values()) + "; the rules "
            + ", ".join(f"{v:.2f}" for v in found["rules"].values()) + ".")
    drift = [f"{found[f'{role}_drift'][0]:.2f}x ({role}, median of {found[f'{role}_drift'][1]} shapes)"
             for role in ("target", "draft") if f"{role}_drift" in found]
    if drift:
        text += (" The forwards timed again before the groups took " + " and ".join(drift)
                 + " the calibration's seconds at the same shapes.")
    return text


__all__ = ["PROFILE_HEADER", "TARGETS", "batch_markdown", "markdown", "where_the_error_is"]
