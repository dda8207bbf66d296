"""REPORT.md's "Context length and output position": every rule's tokens per call against the input length (the
replay's long-input buckets) and against the number of tokens already generated, with two figures, their tables
(``tables/context_*.csv``) and a paragraph written from the numbers (``spectr_repro.analysis.context_length``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spectr_repro.analysis.context_length import (
    POSITION_BINS,
    acceptance_by_output_position,
    bucket_blocks,
    by_input_length,
    by_output_position,
    chunked_prefill_seconds,
    differences_by_input_length,
    gain_change,
)
from spectr_repro.analysis.figures import _new_figure, legend_outside, method_color, method_marker, save_figure
from spectr_repro.analysis.format import interval_text, relative
from spectr_repro.analysis.replay import GROUP_KEYS
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.verify import VERIFIERS, method_labels

TITLE = "## Context length and output position"


def _label(method: str, K: int) -> str:
    return f"{method_labels().get(method, method)} K={K}"


def _main_L(table: pd.DataFrame) -> int:
    """The longest L replayed: the block the reference drafts (L = 1 .. m only give per-position acceptance)."""
    return int(table["L"].max())


def input_length_markdown(table: pd.DataFrame, L: int) -> str:
    part = table[table["L"] == L].copy()
    part["rule"] = [_label(m, k) for m, k in zip(part["method"], part["K"])]
    part["cell"] = [interval_text(v, lo, hi) for v, lo, hi in zip(part["tokens_per_call"], part["ci_low"],
                                                                    part["ci_high"])]
    part["bucket"] = [f"{t // 1024}K ({int(n)} prompts)" for t, n in zip(part["input_tokens"], part["prompts"])]
    wide = part.pivot_table(index="rule", columns="bucket", values="cell", aggfunc="first", sort=False)
    order = list(dict.fromkeys(part.sort_values("input_tokens")["bucket"]))
    return wide[order].fillna("-").to_markdown()


def differences_markdown(diffs: pd.DataFrame, L: int) -> str:
    part = diffs[(diffs["L"] == L) & (diffs["method"] != diffs["comparator"])].copy()
    if part.empty:
        return "(no comparator replayed)"
    labels = method_labels()
    part["against"] = [f"vs {labels.get(c, c)} K={k}" for c, k in zip(part["comparator"], part["comparator_K"])]
    part["rule"] = [_label(m, k) for m, k in zip(part["method"], part["K"])]
    part["cell"] = [interval_text(v, lo, hi, signed=True) for v, lo, hi in zip(part["difference"], part["ci_low"],
                                                                              part["ci_high"])]
    part["column"] = [f"{t // 1024}K {a}" for t, a in zip(part["input_tokens"], part["against"])]
    order = list(dict.fromkeys(part.sort_values(["comparator", "input_tokens"])["column"]))
    wide = part.pivot_table(index="rule", columns="column", values="cell", aggfunc="first", sort=False)
    return wide[order].fillna("-").to_markdown()


def output_position_markdown(table: pd.DataFrame, L: int) -> str:
    part = table[table["L"] == L].copy()
    part["rule"] = [_label(m, k) for m, k in zip(part["method"], part["K"])]
    part["cell"] = [interval_text(v, lo, hi) for v, lo, hi in zip(part["tokens_per_call"], part["ci_low"],
                                                                    part["ci_high"])]
    blocks = part.groupby("position", sort=False)["blocks"].max()
    part["column"] = [f"{p} ({int(blocks[p])} blocks)" for p in part["position"]]
    order = list(dict.fromkeys(part["column"]))
    wide = part.pivot_table(index="rule", columns="column", values="cell", aggfunc="first", sort=False)
    return wide[order].fillna("-").to_markdown()


def acceptance_markdown(table: pd.DataFrame) -> str:
    part = table.copy()
    part.insert(0, "rule", [_label(m, k) for m, k in zip(part["method"], part["K"])])
    gains = [c for c in part.columns if c.startswith("position_")]
    part = part[["rule", "position", "blocks", *gains]].rename(
        columns={"position": "tokens generated", **{c: f"draft position {c.removeprefix('position_')}" for c in gains}})
    return part.to_markdown(index=False, floatfmt=".3f")


def _panels(table: pd.DataFrame, x: str, stem: Path, xlabel: str, title: str, log2: bool = False,
            ticks: list | None = None) -> Path | None:
    """One panel per K, one line per rule, error bars from the prompt-clustered intervals."""
    if table.empty or table[x].nunique() < 2:
        return None
    Ks = sorted(table["K"].unique())
    figure = _new_figure(1, len(Ks))
    axes = figure.subplots(1, len(Ks), squeeze=False)[0]
    for ax, K in zip(axes, Ks):
        for method, part in table[table["K"] == K].groupby("method", sort=False):
            part = part.sort_values(x)
            xs = part[x].to_numpy(dtype=float)
            y = part["tokens_per_call"].to_numpy()
            errors = [y - part["ci_low"].to_numpy(), part["ci_high"].to_numpy() - y]
            ax.errorbar(xs, y, yerr=errors, label=method_labels().get(method, method), color=method_color(method),
                        marker=method_marker(method), capsize=2, linewidth=1.2, markersize=4)
        ax.set_title(f"K={K}", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if log2:
            ax.set_xscale("log", base=2)
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), ticks)
    axes[0].set_ylabel("tokens per target call")
    legend_outside(figure, axes)
    figure.suptitle(title, fontsize=11)
    return save_figure(figure, stem)[0]


def _paragraph(table: pd.DataFrame, diffs: pd.DataFrame, blocks: pd.DataFrame, positions: pd.DataFrame,
               L: int) -> str:
    """What the measurements show, from the numbers: SD's and the best lossless multi-draft rule's tokens per
    call at the shortest and longest bucket, the change of that rule's gain over SD (paired by repository), and
    SD's tokens per call at the first and last bin of output position."""
    at_L = table[table["L"] == L]
    sd = at_L[(at_L["method"] == "sd") & (at_L["K"] == 1)].set_index("input_tokens")["tokens_per_call"]
    shortest, longest = int(at_L["input_tokens"].min()), int(at_L["input_tokens"].max())
    sentences = []
    if shortest in sd.index and longest in sd.index and shortest != longest:
        sentences.append(f"SD's tokens per call go from {sd[shortest]:.2f} at {shortest // 1024}K tokens of input to "
                         f"{sd[longest]:.2f} at {longest // 1024}K.")
    multi = at_L[[not VERIFIERS[m].single_draft and VERIFIERS[m].lossless for m in at_L["method"]]]
    if not multi.empty and len(sd) >= 2:
        best = multi[multi["input_tokens"] == longest].sort_values("tokens_per_call").iloc[-1]
        change = gain_change(blocks, str(best["method"]), int(best["K"]), L, "sd")
        if change is not None:
            verdict = ("grows" if change["ci_low"] > 0 else "shrinks" if change["ci_high"] < 0
                       else "neither grows nor shrinks measurably")
            sentences.append(
                f"The best lossless multi-draft rule at {longest // 1024}K, {_label(best['method'], int(best['K']))}, "
                f"gains {change['gain_shortest']:+.2f} tokens per call over SD at {shortest // 1024}K and "
                f"{change['gain_longest']:+.2f} at {longest // 1024}K: the gain {verdict} with context (change "
                f"{interval_text(change['change'], change['ci_low'], change['ci_high'], signed=True)}, paired over "
                f"the {change['prompts']} repositories replayed at both lengths).")
    first = positions[(positions["method"] == "sd") & (positions["K"] == 1) & (positions["L"] == L)]
    if len(first) >= 2:
        a, b = first.iloc[0], first.iloc[-1]
        early = interval_text(a["tokens_per_call"], a["ci_low"], a["ci_high"])
        late = interval_text(b["tokens_per_call"], b["ci_low"], b["ci_high"])
        sentences.append(f"Along the output, SD's tokens per call are {early} over generated tokens {a['position']} "
                         f"and {late} over {b['position']}.")
    return " ".join(sentences)


def _cost_lines(context: ReportContext, lengths: list[int]) -> list[str]:
    """Where the speed-ups of the buckets are predicted from measured contexts, and the prefill they cost."""
    speedup = context.speedup
    if speedup is None:
        return ["Speed-ups at these input lengths are not predicted here: no calibration of this pair beside the "
                "results (`python -m spectr_repro check experiment=context_qwen` measures the forwards at each "
                "bucket's context)."]
    costs = speedup.costs
    measured = sorted(set(costs.target.measured_contexts))
    largest = measured[-1]
    inside = [n for n in lengths if n <= largest]
    beyond = [n for n in lengths if n > largest]
    lines = [f"The costs behind the speed-up section's predictions ({costs.source}) were measured on "
             f"{', '.join(f'{c:,}' for c in measured)} cached tokens; each bucket's calls are priced at its own "
             "context (input plus half the new tokens), interpolated between measured contexts."]
    if beyond:
        lines.append(f"Beyond {largest:,} cached tokens ({', '.join(f'{n // 1024}K' for n in beyond)}) the cost is "
                     "extrapolated, not measured: those speed-ups are not predicted from measurements here.")
    prefill = [(n, chunked_prefill_seconds(costs.target, n, 256) + chunked_prefill_seconds(costs.draft, n, 256))
               for n in inside or lengths]
    lines.append("Prefill of target and draft per prompt (256-token chunks; an estimate from these costs): "
                 + ", ".join(f"{n // 1024}K {s:,.0f} s" for n, s in prefill) + ".")
    return [" ".join(lines)]


def context_length_section(context: ReportContext) -> str | None:
    replay = context.replay
    buckets = bucket_blocks(replay.blocks) if replay is not None else pd.DataFrame()
    if buckets.empty:
        return None
    groups = list(buckets.groupby(GROUP_KEYS, sort=False))
    lines, frames = [TITLE, ""], {}
    for (pair, temperature), part in groups:
        stem = "" if len(groups) == 1 else f"_{pair}_T{temperature:g}"
        if len(groups) > 1:
            lines += [f"### {pair}, T={temperature:g}", ""]
        group_lines, tables = _group_section(part, context, stem)
        lines += group_lines
        for name, frame in tables.items():
            frames.setdefault(name, []).append(frame)
    folder = context.out_dir / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name, parts in frames.items():
        pd.concat(parts, ignore_index=True).to_csv(folder / f"{name}.csv", index=False)
    return "\n".join(lines)


def _group_section(blocks: pd.DataFrame, context: ReportContext, stem: str) -> tuple[list[str], dict]:
    """The section's text for one (pair, temperature) and its tables by file name."""
    out_dir = context.out_dir
    table, diffs = by_input_length(blocks), differences_by_input_length(blocks)
    positions, acceptance = by_output_position(blocks), acceptance_by_output_position(blocks)
    L = _main_L(table)
    lengths = sorted(int(n) for n in table["input_tokens"].unique())
    lines = ["Every rule on the same draft blocks of long inputs: the first N tokens of a Python standard-library "
             "package or module (`dataset=longcode_<N>`, repository-scale code completion, docs/context.md), the "
             f"buckets {', '.join(f'{n // 1024}K' for n in lengths)} drawing the same repositories. Tokens per "
             f"target call at L={L}, 95 % intervals over prompts. Tables: `tables/context_*.csv`.", ""]
    paragraph = _paragraph(table, diffs, blocks, positions, L)
    lines += [paragraph, ""] if paragraph else []
    lines += ["#### Tokens per call by input length", "", input_length_markdown(table, L), ""]
    figure = _panels(table[table["L"] == L], "input_tokens", out_dir / "figures" / f"context_input_length{stem}",
                     "input tokens", f"tokens per call vs input length (L={L})", log2=True)
    lines += [f"![tokens per call vs input length]({relative(figure, out_dir)})", ""] if figure else []
    lines += ["#### Against the release and SD, by input length (paired on the same blocks)", "",
              differences_markdown(diffs, L), "",
              "#### Tokens per call by output position", "",
              "Blocks binned by the tokens the trajectory had generated before them (bins from "
              f"{', '.join(map(str, POSITION_BINS))} ...), every bucket together.", "",
              output_position_markdown(positions, L), ""]
    at_L = positions[positions["L"] == L].copy()
    labels = list(dict.fromkeys(at_L["position"]))
    at_L["bin"] = at_L["position"].map({p: i for i, p in enumerate(labels)})
    figure = _panels(at_L, "bin", out_dir / "figures" / f"context_output_position{stem}", "tokens already generated",
                     f"tokens per call vs output position (L={L})", ticks=labels)
    lines += [f"![acceptance vs output position]({relative(figure, out_dir)})", ""] if figure else []
    if not acceptance.empty:
        lines += ["Per-position acceptance by output position: the tokens draft position i adds, T(L=i) − T(L=i−1) "
                  "(for SD exactly P(the first i drafts are accepted)), mean over the bin's blocks.", "",
                  acceptance_markdown(acceptance), ""]
    lines += [*_cost_lines(context, lengths), ""]
    tables = {"context_input_length": table, "context_differences": diffs, "context_output_position": positions,
              "context_acceptance_position": acceptance}
    return lines, tables


__all__ = ["context_length_section"]
