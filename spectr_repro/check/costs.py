"""``check``'s cost items: the calibration of ``plan`` (seconds per forward), the timing sanity check (and the
overhead per call it measures), the predicted fastest configuration from a replay (``spectr_repro.cost``)."""

from __future__ import annotations

from typing import Any

from spectr_repro.check.checker import Checker
from spectr_repro.check.correctness import LoadedPair, random_prompts

TIMING_TOLERANCE = 0.05  # section times vs synchronised wall time (issue 26)


def calibration_item(checker: Checker, base, pair_cfg, loaded: LoadedPair, shapes, quick: bool, device_name: str):
    from spectr_repro.cost import Calibration, calibration_dtype, today
    from spectr_repro.cost.measure import measure_forward_costs, plan_shapes

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
    from spectr_repro.cost import seconds_per_call
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
    from spectr_repro.cost import best_configuration, describe_best, predict_tokens_per_s, read_replay_summary
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


__all__ = ["TIMING_TOLERANCE", "calibration_item", "prediction_item", "timing_item"]
