"""Predicted speed-up over AR at batch B on an accelerator (a model, issue 50 item 3)."""

from __future__ import annotations

import argparse
from pathlib import Path

from spectr_repro.cost.batch_speedup import LABEL, assumed_tokens_per_call, batch_speedups
from spectr_repro.cost.roofline import accelerator
from spectr_repro.cost.shapes import pair_shapes


def _table(pair: str = "qwen25coder_1.5b_0.5b", device: str = "H100"):
    target, draft = pair_shapes(pair)
    return batch_speedups(target, draft, accelerator(device).rates(), assumed_tokens_per_call, 512), target


def test_the_speedup_falls_with_B_once_the_verify_forward_is_compute_bound():
    table, target = _table()
    ridge = accelerator("H100").rates().ridge_tokens(target)
    assert 100 < ridge < 1000  # H100: ~300 tokens per forward before the matmuls outlast the weight reads
    assert set(table["model"]) == {LABEL}
    for (method, K, L), rows in table[table["method"] != "ar"].groupby(["method", "K", "L"]):
        rows = rows.sort_values("B")
        bound = rows[rows["verify_tokens"] > ridge]
        assert len(bound) >= 2, (method, K, L)
        assert (bound["speedup"].diff().dropna() < 0).all(), (method, K, L)
        assert bound["speedup"].iloc[-1] < rows["speedup"].iloc[0]
    ar = table[table["method"] == "ar"]
    assert (ar["speedup"] == 1.0).all()  # negative control: AR against itself does not move


def test_multi_draft_loses_its_edge_before_sd_does():
    table, _ = _table("deepseek_33b_1.3b")
    speedup = table.set_index(["method", "K", "L", "B"])["speedup"]
    batches = sorted(table["B"].unique())
    for L in (4, 6):
        assert speedup[("spectr", 3, L, 1)] > speedup[("sd", 1, L, 1)]  # at B = 1 multi-draft leads
        lead = [speedup[("spectr", 3, L, b)] > speedup[("sd", 1, L, b)] for b in batches]
        lost = lead.index(False)  # the first B where SD is ahead
        assert all(not x for x in lead[lost:])
        # multi-draft falls below AR (loses every edge) at a smaller B than SD does
        below = {m: next(b for b in batches if speedup[(m, k, L, b)] < 1) for m, k in (("spectr", 3), ("sd", 1))}
        assert below["spectr"] < below["sd"], below


def test_the_script_writes_a_csv_marked_as_a_model(tmp_path):
    import pandas as pd

    from tests.script_helpers import load_script

    script = load_script("gpu_speedups")
    out = tmp_path / "speedups.csv"
    assert script.main(["--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert set(table["model"]) == {LABEL}
    assert {"H100", "H200", "A100-80GB"} <= set(table["accelerator"])
    assert set(table["B"]) == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert {"ar", "sd", "spectr", "spectr_gbv", "sbvf"} == set(table["method"])


def test_the_script_takes_tokens_per_call_from_a_batch_bench(tmp_path):
    """--batch-bench: the rules the bench timed, each at its tokens over its target calls pooled over every group
    (not a mean of ratios); AR at 1. A file that is not a batch bench, or both sources at once: exit 2, no CSV."""
    import json

    import pandas as pd

    from tests.script_helpers import load_script

    def row(method, K, L, tokens, calls):
        return {"method": method, "K": K, "L": L, "tokens": tokens, "calls": calls}

    groups = [row("ar", 1, 1, 64, [32, 32]), row("sd", 1, 4, 64, [10, 6]), row("sd", 1, 4, 32, [8]),
              row("spectr", 3, 6, 64, [4, 4])]
    bench = tmp_path / "bench_batch.json"
    bench.write_text(json.dumps({"batches": {"groups": groups}}))
    script = load_script("gpu_speedups")
    out = tmp_path / "speedups.csv"
    assert script.main(["--batch-bench", str(bench), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    tau = table.groupby(["method", "K", "L"])["tokens_per_call"].first().to_dict()
    assert tau == {("ar", 1, 1): 1.0, ("sd", 1, 4): 96 / 24, ("spectr", 3, 6): 8.0}
    assert set(table["tokens_source"]) == {f"batch bench {bench}"}
    (tmp_path / "other.json").write_text(json.dumps({"cells": []}))
    out.unlink()
    assert script.main(["--batch-bench", str(tmp_path / "other.json"), "--out", str(out)]) == 2
    assert script.main(["--batch-bench", str(bench), "--replay-summary", "x.csv", "--out", str(out)]) == 2
    assert not out.exists()


def test_docs_gpu_table_is_what_the_script_writes_from_the_committed_batch_bench(tmp_path, monkeypatch):
    """docs/speed.md's gpu-batch-tables block is the script's output for the committed batch bench, run as the block
    names it: a new bench file or a model change that moves a number fails here until the block is regenerated.
    Negative control: the rules' calls 10 % more numerous give another block."""
    import json
    import shutil

    from spectr_repro.docblocks import read_block
    from tests.script_helpers import load_script

    repo = Path(__file__).resolve().parents[2]
    bench = repo / "results" / "speedup_batch" / "bench_batch.json"
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "speedup_batch").mkdir(parents=True)
    shutil.copy(repo / "docs" / "speed.md", tmp_path / "docs" / "speed.md")
    shutil.copy(bench, tmp_path / "results" / "speedup_batch" / "bench_batch.json")
    monkeypatch.chdir(tmp_path)
    script = load_script("gpu_speedups")
    args = ["--batch-bench", "results/speedup_batch/bench_batch.json", "--docs", "docs/speed.md", "--out", "x.csv"]
    committed = read_block((repo / "docs" / "speed.md").read_text(), "gpu-batch-tables")
    assert script.main(args) == 0
    assert read_block((tmp_path / "docs" / "speed.md").read_text(), "gpu-batch-tables") == committed, \
        "docs/speed.md is stale: python scripts/gpu_speedups.py --batch-bench ... --docs docs/speed.md"
    data = json.loads(bench.read_text())
    for row in data["batches"]["groups"]:
        row["calls"] = [round(1.1 * c) for c in row["calls"]] if row["method"] != "ar" else row["calls"]
    (tmp_path / "results" / "speedup_batch" / "bench_batch.json").write_text(json.dumps(data))
    assert script.main(args) == 0
    assert read_block((tmp_path / "docs" / "speed.md").read_text(), "gpu-batch-tables") != committed


def test_docs_assumed_table_is_what_the_script_writes_and_merges_only_alike_rules(tmp_path, monkeypatch, capsys):
    """docs/speed.md's gpu-batch-assumed block is the script's output under the stated assumption; there the K = 3
    rules accept alike, so they share a row, while the batch bench's block keeps one row per rule even where two
    print the same numbers (SpecTr and SpecTr-GBV at K=3 L=6). Negative control: another acceptance gives another
    block. An accelerator the catalogue lacks is one message, exit 2, nothing written."""
    import shutil

    from spectr_repro.docblocks import read_block
    from tests.script_helpers import load_script

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "docs").mkdir()
    shutil.copy(repo / "docs" / "speed.md", tmp_path / "docs" / "speed.md")
    monkeypatch.chdir(tmp_path)
    script = load_script("gpu_speedups")
    committed = read_block((repo / "docs" / "speed.md").read_text(), "gpu-batch-assumed")
    assert script.main(["--docs", "docs/speed.md", "--out", "x.csv"]) == 0
    written = read_block((tmp_path / "docs" / "speed.md").read_text(), "gpu-batch-assumed")
    assert written == committed, "docs/speed.md is stale: python scripts/gpu_speedups.py --docs docs/speed.md"
    assert "| qwen25coder_1.5b_0.5b: SpecTr, SpecTr-GBV, SBV-F K=3 L=4 |" in written
    bench_block = read_block((repo / "docs" / "speed.md").read_text(), "gpu-batch-tables")
    assert "SpecTr K=3 L=6 |" in bench_block and "SpecTr-GBV K=3 L=6 |" in bench_block

    assert script.main(["--acceptance", "0.7", "--docs", "docs/speed.md", "--out", "x.csv"]) == 0
    other = read_block((tmp_path / "docs" / "speed.md").read_text(), "gpu-batch-assumed")
    assert other != committed and "--acceptance 0.7" in other

    (tmp_path / "x.csv").unlink()
    assert script.main(["--doc-accelerator", "Z9000", "--docs", "docs/speed.md", "--out", "x.csv"]) == 2
    assert "--doc-accelerator Z9000" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()


def test_the_docs_command_names_the_options_that_chose_the_numbers_and_leaves_defaults_out():
    from tests.script_helpers import load_script

    script = load_script("gpu_speedups")

    def command(*words):
        args = argparse.Namespace(batch_bench=None, replay_summary=None, temperature=None, acceptance=0.8,
                                  doc_accelerator="H100", docs="docs/speed.md")
        for key, value in zip(words[::2], words[1::2]):
            setattr(args, key, value)
        return script.docs_command(args, "batch bench" if args.batch_bench else "replay" if args.replay_summary
                                   else "assumed")

    assert command() == "python scripts/gpu_speedups.py --docs docs/speed.md"
    assert command("acceptance", 0.7, "doc_accelerator", "H200") == (
        "python scripts/gpu_speedups.py --acceptance 0.7 --doc-accelerator H200 --docs docs/speed.md")
    # the acceptance shapes only the assumed block: a bench's block does not name it
    assert command("batch_bench", "b.json", "acceptance", 0.7) == (
        "python scripts/gpu_speedups.py --batch-bench b.json --docs docs/speed.md")
    assert command("replay_summary", "s.csv", "temperature", 0.4) == (
        "python scripts/gpu_speedups.py --replay-summary s.csv --temperature 0.4 --docs docs/speed.md")
