"""The one store for units of work (spectr_repro.units): state, records then done file, set aside, claims; and the
budget a long command stops by (launch.signals.Budget)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import spectr_repro.units as units
from spectr_repro.launch.claims import Runner
from spectr_repro.launch.signals import Budget
from spectr_repro.units import claim_unit, set_aside, unit_state, write_last, write_unit

LINES = "".join(json.dumps({"block": i, "tokens": i + 1}) + "\n" for i in range(4))


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def finished_unit(tmp_path: Path, name: str = "0000") -> Path:
    directory = tmp_path / "prompts" / name
    write_unit(directory, {"blocks.jsonl": LINES}, {"index": 0})
    return directory


def test_a_unit_is_its_records_then_a_done_file_that_vouches_for_them(tmp_path):
    directory = finished_unit(tmp_path)
    done = json.loads((directory / "done.json").read_text())
    assert done["index"] == 0 and done["records"]["blocks.jsonl"]["lines"] == 4
    state = unit_state(directory)
    assert state.status == "finished" and state.finished and state.problem is None and state.done == done
    assert unit_state(tmp_path / "nothing").status == "absent"


def test_a_truncated_file_is_damaged_naming_the_file_and_line(tmp_path):
    directory = finished_unit(tmp_path)
    path = directory / "blocks.jsonl"
    path.write_text(LINES[: LINES.index("\n") + 10])  # cut mid-line in line 2
    state = unit_state(directory)
    assert state.status == "damaged" and not state.finished
    assert f"{path}:2: not valid JSON" in state.problem and "1 line(s) where done.json records 4" in state.problem


def test_an_edited_line_is_damaged_by_its_sha256(tmp_path):
    directory = finished_unit(tmp_path)
    path = directory / "blocks.jsonl"
    path.write_text(LINES.replace('"tokens": 2', '"tokens": 9'))  # same lines, still JSON: only the hash sees it
    state = unit_state(directory)
    assert state.status == "damaged" and str(path) in state.problem and "sha256 differs" in state.problem


@pytest.mark.parametrize("text, words", [('{"records": ', "cannot be read"), ("[1, 2]", "not a done file"),
                                         (b"\xff\xfe", "cannot be read"), ('{"records": {"blocks.jsonl": 3}}',
                                                                           "not name -> sha256")])
def test_an_unreadable_done_file_is_damaged_never_raising(tmp_path, text, words):
    directory = finished_unit(tmp_path)
    done = directory / "done.json"
    done.write_bytes(text if isinstance(text, bytes) else text.encode())
    state = unit_state(directory)
    assert state.status == "damaged" and str(done) in state.problem and words in state.problem


def test_a_listed_file_gone_is_damaged(tmp_path):
    directory = finished_unit(tmp_path)
    (directory / "blocks.jsonl").unlink()
    assert "missing (done.json lists it)" in unit_state(directory).problem


def test_a_done_file_from_before_the_hashes_is_unverified_beside_its_legacy_files(tmp_path):
    directory = finished_unit(tmp_path)
    (directory / "done.json").write_text(json.dumps({"index": 0}))
    assert unit_state(directory, legacy=("blocks.jsonl",)).status == "unverified"
    assert unit_state(directory, legacy=("blocks.jsonl",)).finished
    assert unit_state(directory).status == "damaged"  # no legacy files named: a done file must list its records
    (directory / "blocks.jsonl").unlink()
    state = unit_state(directory, legacy=("blocks.jsonl",))
    assert state.status == "damaged" and f"{directory / 'blocks.jsonl'}: missing" in state.problem


def test_a_kill_between_the_records_and_the_done_file_leaves_a_partial_unit(tmp_path, monkeypatch):
    real = units.atomic_write_text

    def killed_before_done(path, text):
        if path.name == "done.json":
            raise KeyboardInterrupt  # the process ends here: records written, done file never
        real(path, text)

    monkeypatch.setattr(units, "atomic_write_text", killed_before_done)
    directory = tmp_path / "prompts" / "0001"
    with pytest.raises(KeyboardInterrupt):
        write_unit(directory, {"blocks.jsonl": LINES}, {"index": 1})
    state = unit_state(directory)
    assert state.status == "partial" and not state.finished
    assert f"{directory / 'blocks.jsonl'}: written without its done.json" in state.problem
    assert f"{directory}: no done.json" in state.problem


def test_a_rewrite_removes_the_old_done_file_first(tmp_path, monkeypatch):
    """A forced rerun killed before its done file must not leave the new records vouched for by the old one."""
    directory = finished_unit(tmp_path)
    real = units.atomic_write_text

    def killed_after_the_records(path, text):
        real(path, text)
        if path.name == "blocks.jsonl":
            raise KeyboardInterrupt

    monkeypatch.setattr(units, "atomic_write_text", killed_after_the_records)
    with pytest.raises(KeyboardInterrupt):
        write_unit(directory, {"blocks.jsonl": LINES * 2}, {"index": 0})
    assert unit_state(directory).status == "partial"
    with pytest.raises(KeyboardInterrupt):
        write_last(directory, {"blocks.jsonl": LINES}, "summary.json", "{}")  # a cell: same order, its summary
    assert not (directory / "summary.json").exists()


def test_extend_adds_files_to_a_finished_unit(tmp_path):
    directory = tmp_path / "context"
    write_unit(directory, {"a.json": "{}"}, extend=True)
    write_unit(directory, {"b.json": "[]"}, extend=True)
    state = unit_state(directory)
    assert state.status == "finished" and sorted(state.done["records"]) == ["a.json", "b.json"]


def test_set_aside_moves_the_files_never_the_claim_and_deletes_nothing(tmp_path):
    directory = finished_unit(tmp_path)
    (directory / "blocks.jsonl").write_text("damaged\n")
    (directory / "claim.json").write_text("{}")
    aside = set_aside(directory, tmp_path / "set_aside")
    assert aside.parent == tmp_path / "set_aside" and aside.name.startswith("0000-")
    assert sorted(p.name for p in aside.iterdir()) == ["blocks.jsonl", "done.json"]
    assert (aside / "blocks.jsonl").read_text() == "damaged\n"
    assert sorted(p.name for p in directory.iterdir()) == ["claim.json"]
    assert unit_state(directory).status == "absent"
    (directory / "claim.json").unlink()
    write_unit(directory, {"blocks.jsonl": "x\n"})
    second = set_aside(directory, tmp_path / "set_aside")  # an unclaimed unit's folder goes with its files
    assert second != aside and not directory.exists() and aside.exists()


def test_two_runners_on_one_unit_only_one_claims(tmp_path):
    directory = tmp_path / "prompts" / "0002"
    first, second = Runner(), Runner()
    assert claim_unit(first, directory, tmp_path / "set_aside").status == "claimed"
    busy = claim_unit(second, directory, tmp_path / "set_aside")
    assert busy.status == "busy" and busy.holder.runner == first.id
    write_unit(directory, {"blocks.jsonl": LINES})
    first.release(directory)
    finished = claim_unit(second, directory, tmp_path / "set_aside")  # finished meanwhile: nothing to do
    assert finished.status == "finished" and not (directory / "claim.json").exists()
    forced = claim_unit(second, directory, tmp_path / "set_aside", force=True)
    assert forced.status == "claimed" and forced.moved is None and unit_state(directory).finished
    second.release(directory)


def test_a_dead_runners_claim_is_taken_over_and_its_partial_files_set_aside(tmp_path):
    directory = tmp_path / "prompts" / "0003"
    directory.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # that process has exited: its claim is stale
    holder = Runner()
    (directory / "claim.json").write_text(json.dumps({"host": holder.host, "pid": pid, "runner": "dead0000",
                                                      "started_at": "2026-12-05T00:00:00+00:00", "pid_start": "1"}))
    (directory / "blocks.jsonl").write_text(LINES)  # it was killed between its records and its done file
    claimed = claim_unit(holder, directory, tmp_path / "set_aside")
    assert claimed.status == "claimed" and claimed.state.status == "partial"
    assert (claimed.moved / "blocks.jsonl").read_text() == LINES
    assert json.loads((directory / "claim.json").read_text())["runner"] == holder.id
    holder.release(directory)
    assert not directory.exists()


def test_the_budget_stops_before_a_unit_that_would_not_fit():
    assert not Budget().spent()  # no budget
    budget = Budget(minutes=1.0)
    assert not budget.spent()  # nothing done yet: nothing to estimate from, a run always does one unit
    budget.started -= 30
    budget.record(20.0)
    assert not budget.spent() and not budget.stopped  # 30 s + 20 s <= 60 s
    budget.record(5.0)  # the estimate is the longest unit, not the last
    budget.started -= 15
    assert budget.spent() and budget.stopped  # 45 s + 20 s > 60 s
    message = budget.message(2, 1, 3, "prompt", "replay", ["model_pair=tiny_random", "K=1,2"])
    assert message == ("budget of 1 min reached: kept 2 prompt(s) this run, 1 finished before, 3 left; continue "
                       "with: python -m spectr_repro replay model_pair=tiny_random K=1,2")


def test_the_budget_prices_a_kind_it_has_not_timed_from_what_that_kind_took_before():
    """The grid's case: T = 0.1 batches of 4 min, then a T = 0.7 folder whose batches took 10 min before. Priced at
    the longest unit of this run (4.4 min) it would start at 54 min of a 60-min budget and end past it; priced at
    its recorded 10 min, scaled by how much slower this run is than its own records (4.4 / 4 min), it does not."""
    budget = Budget(minutes=60.0)
    budget.expect(240.0, kind="T0.1")
    budget.expect(600.0, kind="T0.7")
    budget.expect(None, kind="T0.4")  # nothing recorded: no expectation
    budget.record(264.0, kind="T0.1")
    budget.started -= 54 * 60
    assert budget.estimate("T0.7") == 600.0 * 264.0 / 240.0
    assert budget.spent("T0.7") and budget.stopped
    assert budget.estimate("T0.4") == 264.0  # no record of it: the longest unit of any kind
    assert not budget.spent("T0.1")  # its own kind, timed this run: 54 min + 4.4 min < 60 min
    budget.record(300.0, kind="T0.7")
    assert budget.estimate("T0.7") == 300.0  # timed this run: its own longest, not the records
    # negative control: one kind (the estimate before kinds), the T = 0.7 batch would have started
    assert not Budget(minutes=60.0, started=budget.started, longest_s={None: 264.0}).spent()
