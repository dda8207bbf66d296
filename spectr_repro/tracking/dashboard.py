"""``python -m spectr_repro dashboard <results folder>``: the W&B workspace a reviewer opens, built from code.

    python -m spectr_repro dashboard results/cpu_quick                        # offline: writes the definition
    WANDB_MODE=online python -m spectr_repro dashboard results/cpu_quick      # saves the workspace (wandb login)

The sections follow REPORT.md (docs/running.md, "W&B dashboard"): verdicts (the report's verdict table, the
audit's exact TVs, the theory's claims), Table 1 from the replay, tokens per call against K and L, speed-up against
L predicted and measured, bias per rule, the machine (check, bench), the report's figures; the runs table is
grouped by method, K, L, T and dataset. Which panels exist, and the metrics they plot, come from the folder's
result files through ``tracking.names``, the same functions the commands' loggers call; the offline runs of the
folder (and of ``check``, ``theory``, ``audit``, ``bench`` beside it, where the report finds them too) are read back
and every panel's metrics are checked against them: a panel naming a metric no run holds is reported.

Offline (the default, or WANDB_MODE=offline) it writes ``<folder>/wandb_dashboard.json`` (the panels, and the
workspace view W&B's library builds from them) and prints the two commands that publish the runs and the workspace
later. Online it saves the workspace (project and entity: WANDB_PROJECT / WANDB_ENTITY, else the logger config,
else the default project and your default entity) and prints its URL. Exit 2, with one message, for a folder that
does not exist or holds no offline W&B run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spectr_repro.tracking import names
from spectr_repro.tracking.conventions import add_logger_option, destination, logger_config, mode
from spectr_repro.tracking.offline import OfflineRun, read_runs, run_files

DEFINITION_FILE = "wandb_dashboard.json"
SIBLINGS = ("check", "theory", "audit", "bench")  # beside the results folder, as `make reproduce` writes them
RUNS_GROUPED_BY = ("method.name", "K", "L", "temperature", "dataset.name")  # the cells' config keys


@dataclass
class Panel:
    """One panel: ``kind`` line (y against x, history), bar (summary metrics), scalar, table (a logged W&B table),
    media (logged images) or scatter (config ``x`` against summary ``y`` over runs)."""

    kind: str
    title: str
    metrics: list[str] = field(default_factory=list)  # y (line, bar, scalar), table or image keys
    x: str | None = None  # line: a history metric; scatter: a config key

    def plotted(self) -> list[tuple[str, str]]:
        """(where, name) of everything it plots, where W&B's panel reads it: ``history`` (line plots, media),
        ``summary`` (bars, scalars, tables, a scatter's y) or ``config`` (a scatter's x)."""
        where = "history" if self.kind in ("line", "media") else "summary"
        wanted = [(where, m) for m in self.metrics]
        if self.x is not None:
            wanted.append(("config" if self.kind == "scatter" else "history", self.x))
        return wanted


@dataclass
class Section:
    name: str
    panels: list[Panel]
    source: str  # the REPORT.md section it mirrors


# --------------------------------------------------------------------------------------------------
# The sections, from the folder's result files


def _csv(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verdicts_section(folder: Path) -> Section:
    panels = []
    if (folder / "tables" / "verdicts.csv").is_file():
        panels.append(Panel("table", "The paper's claims against this run (REPORT.md)", ["report/verdicts"]))
        panels += [Panel("scalar", f"claims: {v}", [names.verdict_count(v)]) for v in names.VERDICTS]
    audit = _json(folder.parent / "audit" / "audit.json")
    if audit is not None and audit.get("rows"):
        panels.append(Panel("bar", "Exact TV to the target's law, per rule (audit)",
                            [names.audit_tv(r) for r in audit["rows"] if names.finite(r.get("exact_tv"))]))
        panels.append(Panel("table", "Losslessness audit", ["audit/rows"]))
    if (folder.parent / "theory" / "claims.csv").is_file():
        panels.append(Panel("table", "The paper's properties on toys (theory)", ["theory/claims"]))
    return Section("Verdicts", panels, "Verdicts; Losslessness audit; Theory")


def table1_section(folder: Path) -> Section:
    panels = []
    if (folder / "replay" / "replay_summary.csv").is_file():
        panels.append(Panel("table", "Table 1, replayed: tokens per call of every rule, K and L", ["replay/summary"]))
    if (folder / "replay" / "replay_differences.csv").is_file():
        panels.append(Panel("table", "Paired differences (vs the release and SD)", ["replay/differences"]))
    return Section("Table 1 (replay)", panels, "Table 1 — replayed; Which replayed differences are real")


def tokens_section(folder: Path) -> Section:
    table = _csv(folder / "replay" / "replay_summary.csv")
    panels = []
    if table is not None:
        derived = names.replay_metrics({"summary": table}, {})
        for x_key, fixed, axis in ((names.REPLAY_K, "L", "K"), (names.REPLAY_L, "K", "L")):
            for (dataset, temperature, value), part in table.groupby(["dataset", "temperature", fixed], sort=True):
                name = names.replay_vs_K if axis == "K" else names.replay_vs_L
                y = [name(dataset, temperature, value, m) for m in dict.fromkeys(part["method"])]
                y = [m for m in y if any(m in row for row in derived.history)]
                if y:
                    panels.append(Panel("line", f"Tokens per call vs {axis}: {dataset}, T={temperature:g}, "
                                                f"{fixed}={value}", y, x_key))
    return Section("Tokens per call against K and L", panels, "Tokens per call vs K / vs L (replay)")


def speedup_section(folder: Path, runs: Sequence[OfflineRun]) -> Section:
    points = names.speedup_points(_csv(folder / "tables" / "speedup_predictions.csv"),
                                  _csv(folder / "tables" / "speedup_agreement.csv"))
    panels = []
    for (dataset, temperature, K), part in points.groupby(["dataset", "temperature", "K"], sort=True):
        y = [names.speedup_vs_L(dataset, temperature, K, r["method"], r["which"])
             for _, r in part.drop_duplicates(["method", "which"]).iterrows()]
        panels.append(Panel("line", f"Speed-up vs L, predicted and measured: {dataset}, T={temperature:g}, K={K}",
                            y, names.SPEEDUP_L))
    if (folder / "tables" / "speedup_agreement.csv").is_file():
        panels.append(Panel("table", "Timed cells: measured against predicted", ["report/speedup_agreement"]))
    if (folder / "cells").is_dir() and any("speedup" in run.summary for run in runs):
        panels.append(Panel("scatter", "Timed cells: measured speed-up vs L", ["speedup"], "L"))
        panels.append(Panel("scatter", "Timed cells: block efficiency vs K", ["block_efficiency"], "K"))
    return Section("Speed-up against L: predicted and measured", panels,
                   "Speed-up, predicted from shared blocks and measured costs; Checked against timed cells")


def bias_section(folder: Path) -> Section:
    rows = _csv(folder / "bias" / "bias.csv")
    panels = []
    if rows is not None and not rows.empty:
        for key, part in rows.groupby(rows.apply(names.bias_setting, axis=1), sort=True):
            tvs = [names.bias_value(r, "tv_estimate") for _, r in part.iterrows() if names.finite(r["tv_estimate"])]
            if tvs:
                panels.append(Panel("bar", f"TV of the first token's law to the target's, per rule: {key}", tvs))
        panels.append(Panel("table", "Bias tests, every row of bias.csv", ["bias/rows"]))
    return Section("Bias per rule", panels, "Bias on real models")


def machine_section(folder: Path) -> Section:
    panels = []
    if (folder.parent / "check" / "check.json").is_file():
        panels += [Panel("scalar", "check: every correctness item passed (1)", ["check/passed"]),
                   Panel("table", "check: environment, correctness, calibration items", ["check/items"])]
    bench = _json(folder.parent / "bench" / "bench.json")
    if bench is not None:
        derived = names.bench_metrics({}, bench)
        if derived.summary:
            panels.append(Panel("bar", "bench: the benchmark's numbers", sorted(derived.summary)))
    return Section("Machine: check and bench", panels, "Environment; docs/speed.md (bench)")


def batch_section(folder: Path) -> Section:
    """The batch bench (``bench --preset batch_qwen``): its own folder, or ``speedup_batch`` beside the results."""
    bench = _json(folder / "bench_batch.json") or _json(folder.parent / "speedup_batch" / "bench_batch.json")
    cells = ((bench or {}).get("batches") or {}).get("cells") or []
    panels = []
    if cells:
        y = sorted({name for row in names.batch_curves(cells) for name in row if name != names.BATCH_B})
        panels += [Panel("line", "Speed-up over AR at the same batch, measured and predicted", y, names.BATCH_B),
                   Panel("table", "Timed batch groups: every cell", ["bench/batches/cells"])]
    return Section("Speed-up against batch size", panels, "Speed-up against batch size (measured)")


def figures_section(folder: Path) -> Section:
    figures = sorted((folder / "figures").glob("*.png"))
    panels = [Panel("media", "REPORT.md's figures", [f"report/figures/{f.stem}" for f in figures])] if figures else []
    return Section("Figures", panels, "every figure of REPORT.md")


def sections(folder: Path, runs: Sequence[OfflineRun]) -> list[Section]:
    built = [verdicts_section(folder), table1_section(folder), tokens_section(folder), speedup_section(folder, runs),
             bias_section(folder), machine_section(folder), batch_section(folder), figures_section(folder)]
    return [s for s in built if s.panels]


# --------------------------------------------------------------------------------------------------
# Checks


def unplotted(built: Sequence[Section], runs: Sequence[OfflineRun]) -> list[str]:
    """Every ``section: panel: metric (where)`` that no run holds where the panel reads it."""
    held = {"history": set().union(set(), *(run.history_keys for run in runs)),
            "summary": set().union(set(), *(run.summary for run in runs))}
    missing = []
    for section in built:
        for panel in section.panels:
            if panel.kind == "scatter":  # one run must hold both: its x in the config, its y in the summary
                x, y = panel.x, panel.metrics[0]
                if not any(x in run.config and y in run.summary for run in runs):
                    missing.append(f"{section.name}: {panel.title}: {x} (config) with {y} (summary)")
                continue
            missing += [f"{section.name}: {panel.title}: {name} ({where})" for where, name in panel.plotted()
                        if name not in held[where]]
    return missing


def run_folders(folder: Path) -> list[Path]:
    """The folder and the command folders beside it that hold offline runs."""
    return [f for f in [folder, *(folder.parent / s for s in SIBLINGS)] if run_files(f)]


# --------------------------------------------------------------------------------------------------
# W&B's workspace


def workspace(built: Sequence[Section], project: str, entity: str, title: str, groups: Sequence[str]):
    """The ``wandb_workspaces`` Workspace of the sections (built offline; ``.save()`` publishes it)."""
    import wandb_workspaces.reports.v2 as wr  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it
    import wandb_workspaces.workspaces as ws  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it
    from wandb_workspaces import expr  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it

    def panel(p: Panel):
        if p.kind == "line":
            return wr.LinePlot(title=p.title, x=p.x, y=list(p.metrics))
        if p.kind == "bar":
            return wr.BarPlot(title=p.title, metrics=list(p.metrics), orientation="h")
        if p.kind == "scalar":
            return wr.ScalarChart(title=p.title, metric=p.metrics[0])
        if p.kind == "table":
            return wr.WeavePanelSummaryTable(table_name=p.metrics[0])
        if p.kind == "media":
            return wr.MediaBrowser(title=p.title, media_keys=list(p.metrics))
        if p.kind == "scatter":
            return wr.ScatterPlot(title=p.title, x=wr.Config(p.x), y=wr.SummaryMetric(p.metrics[0]))
        raise ValueError(f"unknown panel kind {p.kind!r}")

    return ws.Workspace(
        entity=entity, project=project, name=title,
        sections=[ws.Section(name=s.name, panels=[panel(p) for p in s.panels], is_open=True) for s in built],
        runset_settings=ws.RunsetSettings(filters=[expr.Metric("Group").isin(list(groups))],
                                          groupby=[expr.Config(key) for key in RUNS_GROUPED_BY]),
    )


def definition(built: Sequence[Section], view) -> dict[str, Any]:
    return {"sections": [asdict(s) for s in built],
            "runs_grouped_by": list(RUNS_GROUPED_BY),
            "view": view._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectr_repro dashboard", description=__doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", help="a results folder (results/<experiment>) holding offline W&B runs")
    parser.add_argument("--name", default=None, help="the workspace's name (default: spectr_repro <experiment>)")
    add_logger_option(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    folder = Path(args.results_dir)
    if not folder.is_dir():
        print(f"dashboard: error: {folder} is not a folder (a results folder: results/<experiment>)", file=sys.stderr)
        return 2
    folders = run_folders(folder)
    if not folders:
        print(f"dashboard: error: no offline W&B run under {folder / 'wandb'} nor beside it ({', '.join(SIBLINGS)}): "
              f"run the commands with logging on (logger=wandb_offline, the default)", file=sys.stderr)
        return 2
    runs = read_runs(folders)
    built = sections(folder, runs)
    missing = unplotted(built, runs)
    for line in missing:
        print(f"dashboard: warning: no run holds {line} (run that command again with logging on)", file=sys.stderr)
    logger = logger_config(args.logger)
    project, entity = destination(logger)
    online = mode(logger) == "online"
    if online and entity is None:
        import wandb  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it

        entity = wandb.Api().default_entity
    groups = sorted({run.group for run in runs})
    view = workspace(built, project, entity or "", args.name or f"spectr_repro {folder.resolve().name}", groups)
    print(f"dashboard: {len(built)} sections, {sum(len(s.panels) for s in built)} panels over {len(runs)} runs "
          f"({', '.join(f'{n} {j}' for j, n in pd.Series([r.job_type for r in runs]).value_counts().items())})")
    if online:
        view.save()
        print(f"dashboard: saved {view.url}")
        return 0
    path = folder / DEFINITION_FILE
    path.write_text(json.dumps(definition(built, view), indent=1) + "\n", encoding="utf-8")
    sync = " ".join(shlex.quote(str(f / "wandb")) + "/offline-run-*" for f in folders)
    print(f"dashboard: wrote {path}\npublish later (after `wandb login`):\n  wandb sync {sync}\n"
          f"  WANDB_MODE=online python -m spectr_repro dashboard {shlex.quote(str(folder))} --logger wandb_online")
    return 0


__all__ = ["DEFINITION_FILE", "Panel", "Section", "definition", "main", "run_folders", "sections", "unplotted",
           "workspace"]
