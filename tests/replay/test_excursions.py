"""``python -m spectr_repro excursions`` (also ``python -m spectr_repro.replay.excursions``): where the release's h
leaves [0, 1], counted on real-model blocks."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from spectr_repro import __main__ as cli
from spectr_repro import tracking
from spectr_repro.launch import pairs
from spectr_repro.replay.excursions import ExcursionCount, block_excursions, count_rows, main
from spectr_repro.tracking import names
from spectr_repro.verify.spectr_gbv import SpecTrGBV

BASE = ["model_pair=tiny_random", "dataset=humaneval", "temperature=0.7", "logger=disabled", "K=3,7", "L=6,12",
        "num_prompts=2", "max_new_tokens=16"]


def _counts(tmp_path, arithmetic: str, monkeypatch, capsys) -> pd.DataFrame:
    """Run the command through ``python -m spectr_repro``; check what it hands W&B's logger and its progress bar."""
    logged = []
    monkeypatch.setattr(tracking, "log_command", lambda command, *args, **kwargs: logged.append((command, kwargs)))
    out = tmp_path / f"{arithmetic}.csv"
    assert cli.main(["excursions", *BASE, f"output_dir={tmp_path}", "--arithmetic", arithmetic, "--out", str(out)]) == 0
    counts = pd.read_csv(out)
    [(command, kwargs)] = logged
    assert command == "excursions" and kwargs["config"]["arithmetic"] == arithmetic
    pd.testing.assert_frame_equal(kwargs["tables"]["counts"].reset_index(drop=True), counts, check_dtype=False)
    assert "2/2" in capsys.readouterr().err  # the bar over the trajectories: 2 prompts at one temperature
    return counts


def test_counts_every_slot_and_finds_the_release_arithmetic_excursions(tmp_path, monkeypatch, capsys):
    """On tiny_random's blocks (seeded: the same trajectories for both arithmetics) the release's bfloat16 rows
    put h outside [0, 1] in some slots; the float64 replica on the same blocks in none (h is in [0, 1] in exact
    arithmetic wherever it is defined, docs/theory.md): the negative control that the count can read 0."""
    release = _counts(tmp_path, "release_bf16", monkeypatch, capsys)
    replica = _counts(tmp_path, "float64", monkeypatch, capsys)
    assert list(zip(release.K, release.L)) == [(3, 6), (3, 12), (7, 6), (7, 12)]
    assert (release.slots == release.K * release.L * release.blocks).all() and (release.blocks > 0).all()
    assert release.blocks.tolist() == replica.blocks.tolist()  # the same blocks
    assert release.slots_outside.sum() > 0 and (release.slots_outside <= release.slots).all()
    assert replica.slots_outside.sum() == 0 and replica.blocks_outside.sum() == 0
    assert (release.blocks_outside <= release.blocks).all()


def test_block_excursions_take_the_sub_block():
    """A (K, L) sub-block is the first K drafts and L positions: a slot of draft 2 is not seen at K = 2."""
    K, L, V = 3, 2, 4
    generator = torch.Generator().manual_seed(0)
    draft_probs = torch.rand(K, L, V, generator=generator, dtype=torch.float64)
    target_probs = torch.rand(K, L + 1, V, generator=generator, dtype=torch.float64)
    draft_probs, target_probs = draft_probs / draft_probs.sum(-1, keepdim=True), target_probs / target_probs.sum(-1,
                                                                                                            keepdim=True)
    tokens = torch.randint(V, (K, L), generator=generator)
    calls = []

    class Recording(SpecTrGBV):
        def h_excursions(self, draft_tokens, draft_probs, target_probs, state=None, undefined=False, tolerance=1e-9):
            calls.append((tuple(draft_tokens.shape), tuple(draft_probs.shape), tuple(target_probs.shape)))
            return []

    assert block_excursions(Recording(), tokens, draft_probs, target_probs, 2, 1) == ([], [])
    assert calls == [((2, 1), (2, 1, V), (2, 2, V))] * 2


def test_count_rows_sum_over_prompts_of_a_temperature():
    class Stub:
        def __init__(self, count):
            self.counts = {(3, 6): count}

    first, second = ExcursionCount(), ExcursionCount()
    first.add(3, 6, [(0, 1, 2.5)], [(0, 1, 2.5), (1, 2, -7.0)])
    second.add(3, 6, [], [])
    row = count_rows([(0.4, Stub(first)), (0.4, Stub(second))]).iloc[0]
    assert (row.blocks, row.slots, row.blocks_outside, row.slots_outside, row.slots_undefined) == (2, 36, 1, 1, 1)
    assert (row.h_min, row.h_max) == (0.0, 2.5)


def test_excursions_is_a_command_of_python_m_spectr_repro(capsys):
    assert cli.COMMANDS["excursions"][:2] == ("spectr_repro.replay.excursions", "main")
    assert cli.main(["--help"]) == 0
    assert "  excursions " in capsys.readouterr().out
    assert cli.main(["excursions", "--help"]) == 0
    assert "python -m spectr_repro excursions" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--arithmetic", "fp8"], ["--seconds", "0"], ["--seconds", "soon"], ["K=0"],
                                 ["--colour"], ["--out"]])
def test_bad_input_exits_2_before_loading(bad, tmp_path, capsys, monkeypatch):
    """One message, exit 2, nothing written and no model loaded (the pair cache would raise)."""
    from spectr_repro.launch import pairs

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pairs.PairCache, "pair", no_loading)
    out = tmp_path / "counts.csv"
    assert cli.main(["excursions", *BASE, f"output_dir={tmp_path / 'results'}", "--out", str(out), *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "results").exists()


def test_out_must_be_a_writable_file(tmp_path, capsys, monkeypatch):
    assert main([*BASE, "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pairs.PairCache, "pair", no_loading)
    # Found 2026-12-04: /proc passes os.access for root but takes no new file; it loaded the models, then failed.
    assert main([*BASE, "--out", "/proc/spectr_repro_counts.csv"]) == 2
    assert "--out /proc/spectr_repro_counts.csv cannot be written" in capsys.readouterr().err
    # negative control: a writable file passes the door, and the probe leaves nothing behind
    from spectr_repro.launch.config import check_file_writable

    assert check_file_writable(tmp_path / "counts.csv", "--out") == tmp_path / "counts.csv"
    assert not (tmp_path / "counts.csv").exists()


def test_logged_shares_of_slots_and_blocks_outside():
    """What W&B's run summary holds: per (T, K, L) the share of test slots and of blocks with h outside [0, 1]."""
    counts = pd.DataFrame([{"K": 3, "L": 6, "T": 0.4, "blocks": 10, "slots": 180, "blocks_outside": 8,
                            "slots_outside": 51}, {"K": 7, "L": 6, "T": 0.7, "blocks": 0, "slots": 0,
                                                   "blocks_outside": 0, "slots_outside": 0}])
    summary = names.derive("excursions", {"counts": counts}).summary
    assert summary == {"excursions/slots_outside/T0_4/K3_L6": pytest.approx(51 / 180),
                       "excursions/blocks_outside/T0_4/K3_L6": pytest.approx(0.8)}  # no share of 0 blocks
