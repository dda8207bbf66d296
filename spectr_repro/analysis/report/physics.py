"""The paper's speed-ups against physics: what a roofline allows with the paper's own block efficiencies.

For each pair and method the paper reports both a block efficiency and a speed-up for, the roofline of
``spectr_repro.cost.roofline`` (spec-sheet bandwidth and FLOP/s of an A100, an H100 and an H20, weights and KV cache
over bandwidth, FLOPs over peak, no overhead) gives the speed-up those block efficiencies allow at batch 1. It is a
model, an upper bound, and every table here says so. Beside it, when this machine's calibration (``check``) carries
its measured memory bandwidth and matmul rate, the same roofline against the forwards ``check`` timed here: how far
a roofline is from a real forward, i.e. how far it can be trusted.

Everything renders from files: the paper's numbers (``context.paper``, package data by default), the accelerators'
spec sheet (``cost/accelerators.yaml``), the shipped architecture configs, and the calibration file. The same table
is the generated block of docs/speed.md (``python -m spectr_repro.analysis.physics_docs``, its module).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spectr_repro.analysis.format import markdown
from spectr_repro.analysis.load import METHOD_LABELS
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.cost.calibration import Calibration, read_calibrations
from spectr_repro.cost.roofline import (
    MODEL_LABEL,
    PAPER_ACCELERATORS,
    PAPER_CONTEXT,
    RELEASE_CONTEXT,
    accelerator,
    measured_accelerator,
    paper_setting,
    paper_speedups_against_roofline,
    release_tokens_per_s_against_roofline,
    roofline_against_calibration,
)
from spectr_repro.paper import load_paper_numbers

TABLE_CSV = Path("tables") / "physics_roofline.csv"
RELEASE_CSV = Path("tables") / "physics_roofline_release.csv"
CPU_CSV = Path("tables") / "physics_roofline_cpu.csv"


def _number(value: float) -> str:
    return f"{value:.2f}"


def _optional(value) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.1f}"


def _paper_shown(table: pd.DataFrame, devices, reference: str) -> pd.DataFrame:
    """The paper table's displayed columns, formatted."""
    return pd.DataFrame({
        "pair": table["model_pair"], "dataset": table["dataset"],
        "method": [METHOD_LABELS.get(m, m) for m in table["method"]], "K": table["K"], "L": table["L"],
        "paper BE": table["paper_block_efficiency"].map(_number),
        "paper speed-up": table["paper_speedup"].map(_number),
        **{f"allowed, {d.key}": table[f"allowed_{d.key}"].map(_number) for d in devices},
        f"reported / allowed ({reference})": table[f"reported_over_allowed_{reference}"].map(_number),
        f"implied ms per forward ({reference})": table[f"implied_overhead_ms_{reference}"].map(_optional),
    })


def _paper_notes(table: pd.DataFrame, reference: str) -> list[str]:
    """What the paper table assumes, and what it says (from its numbers)."""
    method_K, L = paper_setting()
    ratio = table[f"reported_over_allowed_{reference}"]
    implied = table[f"implied_overhead_ms_{reference}"].dropna()
    return [
        f"Allowed = AR's seconds per token (one target forward) over the speculative call's seconds per token (seconds "
        f"per call / the paper's block efficiency), batch 1, bfloat16 weights and KV cache, {PAPER_CONTEXT} cached "
        f"tokens under each forward, the paper's main setting (K from `experiment=paper_main`: "
        f"{', '.join(f'{m} {k}' for m, k in sorted(method_K.items()))}; L = {L}); a forward costs "
        "max(bytes / bandwidth, FLOPs / peak), with no per-forward overhead (0 s). The call is the one cost model's "
        "`seconds_per_call` (one target forward over the K rows, each row the last emitted token and its draft). "
        "Implied ms per forward: the fixed overhead, added to AR's forward and to each "
        "of the call's forwards alike, at which this roofline gives exactly the reported speed-up (— where none does).",
        "",
        f"The paper's reported speed-ups are {ratio.min():.2f}-{ratio.max():.2f} of what an {reference} allows at "
        "batch 1 with its own block efficiencies: the rest is what the roofline leaves out (per-forward overhead, "
        "kernels below peak bandwidth, verification, sampling, the prefill), or a different batch, GPU or "
        "implementation than this model assumes (the paper names none of them)."
        + (f" A fixed overhead per forward would account for each row's whole gap: {implied.min():.1f} to "
           f"{implied.max():.1f} ms, depending on the row." if not implied.empty else ""),
        "",
    ]


def release_markdown(release: pd.DataFrame) -> list[str]:
    """The code release's tokens/s against the roofline of its GPU (rows of
    ``release_tokens_per_s_against_roofline``), as Markdown lines ([] when there are none)."""
    if release is None or release.empty:
        return []
    device = accelerator(str(release["device"].iloc[0]))
    shown = pd.DataFrame({
        "pair": release["model_pair"], "method": [METHOD_LABELS.get(m, m) for m in release["method"]],
        "K": release["K"], "L": release["L"], "release BE": release["release_block_efficiency"].map(_number),
        "release tok/s": release["release_tokens_per_s"].map(_number),
        f"allowed tok/s, {device.key}": release["allowed_tokens_per_s"].map(lambda v: f"{v:.0f}"),
        f"AR allowed tok/s, {device.key}": release["allowed_ar_tokens_per_s"].map(lambda v: f"{v:.0f}"),
        "reported / allowed": release["reported_over_allowed"].map(_number),
        "implied ms per forward": release["implied_overhead_ms"].map(_optional),
    })
    return [f"The authors' code release reports tokens/s on one {device.key} (`experiment=release_humaneval`, "
            "float16, its own block-efficiency definition: tokens generated before truncation); against the "
            f"same roofline on that {device.key} ({RELEASE_CONTEXT} cached tokens, no prefill, no overhead):", "",
            markdown(shown), ""]


def physics_markdown(table: pd.DataFrame, release: pd.DataFrame | None = None) -> str:
    """The reported-against-allowed table (rows of ``paper_speedups_against_roofline``) as Markdown, with its
    label, its assumptions and the accelerators' sources; then the code release's tokens/s against the roofline
    (rows of ``release_tokens_per_s_against_roofline``) when given."""
    if table.empty:
        return "No pair of the paper has both a block efficiency and a speed-up: nothing to set against a roofline.\n"
    devices = [accelerator(key) for key in PAPER_ACCELERATORS]
    reference = "H100" if "H100" in PAPER_ACCELERATORS else devices[0].key
    lines = [f"**A model, not a measurement**: {MODEL_LABEL}.", "", markdown(_paper_shown(table, devices, reference)),
             "", *_paper_notes(table, reference), *release_markdown(release),
             "Accelerators (spec-sheet peaks from `spectr_repro/cost/accelerators.yaml`, not measured here):", ""]
    lines += [f"- {d.key}: {d.name}, {d.bandwidth_gbs:,.0f} GB/s, {d.bf16_tflops:,.0f} dense bf16 TFLOP/s; "
              f"{'verified' if d.verified else 'not verified against the vendor sheet'}, recorded {d.recorded}; "
              f"{d.source}" for d in devices]
    return "\n".join(lines) + "\n"


def machine_device(calibration: Calibration):
    """This machine's roofline from the figures its calibration measured (None when it has none)."""
    bandwidth = calibration.extra.get("memory_bandwidth_gbs")
    tflops = calibration.extra.get("matmul_tflops")
    if not bandwidth or not tflops:
        return None
    return measured_accelerator(calibration.device, float(bandwidth), float(tflops),
                                f"measured by `check` {calibration.date}")


def cpu_markdown(calibrations: dict[str, Calibration]) -> tuple[str, pd.DataFrame] | None:
    """The roofline with this machine's measured bandwidth beside the forwards ``check`` calibrated, for every
    calibration entry that carries those measurements; None when none does."""
    parts, frames = [], []
    for key, calibration in sorted(calibrations.items()):
        device = machine_device(calibration)
        if device is None:
            continue
        try:
            table = roofline_against_calibration(calibration, device)
        except ValueError:  # a pair whose architecture is not shipped
            continue
        frames.append(table.assign(entry=key))
        shown = table.assign(calibrated_ms=1e3 * table["calibrated_s"], roofline_ms=1e3 * table["roofline_s"])
        shown = shown[["role", "rows", "tokens", "logits", "calibrated_ms", "roofline_ms", "calibrated_over_roofline"]]
        shown = shown.rename(columns={"calibrated_over_roofline": "calibrated / roofline"})
        for column in ("calibrated_ms", "roofline_ms", "calibrated / roofline"):
            shown[column] = shown[column].map(_number)
        decode = table[(table["rows"] == 1) & (table["tokens"] == 1)]
        summary = ", ".join(f"{r.role} {r.calibrated_over_roofline:.2f}x" for r in decode.itertuples())
        parts += [f"`{key}` ({calibration.note}; roofline at {device.bandwidth_gbs:.1f} GB/s and "
                  f"{device.bf16_tflops:.3g} TFLOP/s measured by the same `check`, no overhead). Decode forward "
                  f"(1 x 1), calibrated over roofline: {summary or 'not calibrated'}.", "", markdown(shown), ""]
    if not frames:
        return None
    return "\n".join(parts), pd.concat(frames, ignore_index=True)


def physics_section(context: ReportContext) -> str | None:
    paper = context.paper if context.paper is not None else load_paper_numbers()
    table = paper_speedups_against_roofline(paper)
    release = release_tokens_per_s_against_roofline(paper)
    (context.out_dir / TABLE_CSV).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(context.out_dir / TABLE_CSV, index=False)
    release.to_csv(context.out_dir / RELEASE_CSV, index=False)
    lines = ["## The paper's speed-ups against physics", "",
             "What a roofline allows at batch 1 with the paper's own block efficiencies, beside the speed-ups it "
             f"reports (`{TABLE_CSV}`; the release's tokens/s: `{RELEASE_CSV}`).", "",
             physics_markdown(table, release)]
    machine = cpu_markdown(read_calibrations())
    if machine is not None:
        text, frame = machine
        frame.to_csv(context.out_dir / CPU_CSV, index=False)
        lines += ["### The same roofline on this machine, against its calibrated forwards", "",
                  f"How far a roofline is from a real forward here (`{CPU_CSV}`): calibrated / roofline = 1 would be "
                  "a forward at this machine's measured read bandwidth with nothing else.", "", text]
    return "\n".join(lines)


__all__ = ["CPU_CSV", "RELEASE_CSV", "TABLE_CSV", "cpu_markdown", "machine_device", "physics_markdown",
           "physics_section", "release_markdown"]
