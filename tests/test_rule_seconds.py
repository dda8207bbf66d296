"""scripts/rule_seconds.py: each rule timed alone on real drafted blocks (tiny pair here), blocks saved and timed
again without a model, and the values checked bitwise (negative control: one edited value is named, exit 1); bad
arguments are one message, exit 2, before any model loads."""

from __future__ import annotations

import json

import pytest

from tests.script_helpers import load_script

GRID = ["--model-pair", "tiny_random", "--datasets", "humaneval", "--temperatures", "0.7", "--blocks", "2",
        "--K", "1,2", "--L", "2,3", "--draws", "2", "--rules", "sd,bv,sbv,spectr_gbv"]


def test_blocks_saved_timed_again_and_values_checked_bitwise(tmp_path, capsys):
    script = load_script("rule_seconds")
    blocks, values = tmp_path / "blocks.pt", tmp_path / "values.json"
    assert script.main([*GRID, "--save", str(blocks), "--values", str(values)]) == 0
    printed = capsys.readouterr().out
    assert "| dataset | T | support | sd | bv | sbv | spectr_gbv | all |" in printed
    assert printed.count("| humaneval | 0.7 |") == 2 and "| mean | 0.7 |" in printed
    recorded = json.loads(values.read_text())
    # sd and bv at K = 1 only, sbv and the release at K = 1, 2; L = 2, 3; two blocks
    assert len(recorded) == 2 * (2 + 2 + 4 + 4)
    assert {v[5] for v in recorded if v[1] == "spectr_gbv"} == {"monte_carlo"}  # sampled, as in the grid

    assert script.main([*GRID, "--load", str(blocks), "--check-values", str(values)]) == 0
    assert f"{len(recorded)} values compared with {values}: 0 differ" in capsys.readouterr().out

    edited = [list(v) for v in recorded]
    edited[3][4] = (float.fromhex(edited[3][4]) + 2 ** -40).hex()  # one value moved in its last bits
    values.write_text(json.dumps(edited))
    assert script.main([*GRID, "--load", str(blocks), "--check-values", str(values)]) == 1
    out = capsys.readouterr().out
    assert ": 1 differ" in out and f"block {edited[3][0]} {edited[3][1]} K={edited[3][2]} L={edited[3][3]}" in out


@pytest.mark.parametrize("bad", [["--K", "0"], ["--rules", "nope"], ["--load", "missing.pt"], ["--blocks", "0"],
                                 ["--sampled", "nope"]])
def test_bad_arguments_exit_2_before_any_model_loads(bad, capsys, monkeypatch):
    script = load_script("rule_seconds")
    monkeypatch.setattr(script, "draft_blocks", lambda args: pytest.fail("a model would load"))
    with pytest.raises(SystemExit) as stop:
        script.main([*GRID, *bad])
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err
