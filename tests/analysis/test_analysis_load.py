import json

import pytest

from spectr_repro.analysis.load import load_results


def test_loads_every_cell_and_record(synthetic):
    results = load_results(synthetic.root)
    summaries = list(synthetic.root.glob("cells/*/summary.json"))
    assert len(results.cells) == len(summaries) > 0
    assert len(results.records) == 3 * len(summaries)
    # records carry their cell's identity so they can be grouped like cells
    assert set(results.records["model_pair"]) == set(results.cells["model_pair"])
    assert results.records["dataset"].notna().all()
    assert {"time_total_s", "time_draft_s"} <= set(results.cells.columns)
    one = json.loads(summaries[0].read_text())
    row = results.cells[results.cells["cell_id"] == one["cell_id"]].iloc[0]
    assert row["block_efficiency"] == pytest.approx(one["block_efficiency"])


def test_parent_folder_holding_several_experiments_is_read(synthetic):
    assert len(load_results(synthetic.root.parent).cells) == len(load_results(synthetic.root).cells)


def test_missing_or_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_results(tmp_path / "nope")
    with pytest.raises(ValueError, match="no cells found"):
        load_results(tmp_path)


def test_malformed_summary_names_the_file(tmp_path):
    cell = tmp_path / "cells" / "broken"
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken"):
        load_results(tmp_path)
    (cell / "summary.json").write_text(json.dumps({"method": "sd"}))
    with pytest.raises(ValueError, match="lacks required keys"):
        load_results(tmp_path)


def test_one_rule_run_with_two_option_sets_gives_two_methods(synthetic, tmp_path):
    import shutil

    from spectr_repro.analysis.tables import build_table1, table1
    from spectr_repro.paper import load_paper_numbers

    root = tmp_path / "variants"
    shutil.copytree(synthetic.root, root)
    cell = next(p for p in root.glob("cells/qwen25coder*__humaneval__gbv__K1_L6_T0.4"))
    twin = cell.parent / (cell.name + "_no_carry")
    shutil.copytree(cell, twin)
    for folder, carry_over, be in ((cell, True, None), (twin, False, 1.5)):
        summary = json.loads((folder / "summary.json").read_text())
        summary.update(cell_id=folder.name, method_options={"carry_over": carry_over})
        if be is not None:
            summary["block_efficiency"] = be
        (folder / "summary.json").write_text(json.dumps(summary))
    results = load_results(root)
    assert set(results.cells["rule"]) >= {"gbv"}
    table = table1(results.cells, "qwen25coder_1.5b_0.5b", "block_efficiency")
    # not averaged together: one row per option set, the variant without options keeps the rule's name
    assert table.loc["gbv[carry_over=False]", "humaneval"] == 1.5
    assert table.loc["gbv[carry_over=True]", "humaneval"] > 3
    assert "gbv" in table.index  # gsm8k cell (no options recorded)
    assert set(results.records.loc[results.records["cell_id"] == twin.name, "method"]) == {
        "gbv[carry_over=False]"
    }
    tex = build_table1(results.cells, load_paper_numbers(), "qwen25coder_1.5b_0.5b", tmp_path / "t").paths[
        "tex"
    ]
    assert r"GBV[carry\_over=False]" in tex.read_text()  # underscores escaped for LaTeX
