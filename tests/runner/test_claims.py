"""Claims: one runner per cell; a dead runner's claim is taken over, a live one is respected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from spectr_repro.launch.claims import CLAIM_FILE, ContentionWatch, Runner, process_start, read_holder


def _write_claim(directory, host, pid, runner="someone", pid_start=None, age_s=0.0):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CLAIM_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "runner": runner, "started_at": "then",
                                "pid_start": pid_start}))
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def sleeper():
    """A live process that is not this one (a runner on this machine that holds a claim)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


def test_only_one_of_two_runners_gets_a_cell(tmp_path):
    cell = tmp_path / "cells" / "c"
    first, second = Runner(), Runner()
    assert first.claim(cell).acquired
    refused = second.claim(cell)
    assert not refused.acquired and refused.holder.runner == first.id and refused.holder.pid == os.getpid()
    assert first.claim(cell).acquired  # its own claim: still its own
    second.release(cell)  # never removes another runner's claim
    assert read_holder(cell).runner == first.id
    first.release(cell)
    assert not cell.exists(), "an empty cell folder is not left behind"
    assert second.claim(cell).acquired


def test_claim_of_a_dead_process_on_this_machine_is_taken_over(tmp_path):
    runner = Runner()
    cell = tmp_path / "c"
    _write_claim(cell, runner.host, _dead_pid())
    result = runner.claim(cell)
    assert result.acquired and result.took_over is not None and result.took_over.runner == "someone"
    assert read_holder(cell).runner == runner.id


def test_claim_of_a_live_process_on_this_machine_is_respected(tmp_path, sleeper):
    runner = Runner()
    cell = tmp_path / "c"
    _write_claim(cell, runner.host, sleeper.pid, pid_start=process_start(sleeper.pid), age_s=10_000)
    result = runner.claim(cell)
    assert not result.acquired and result.holder.pid == sleeper.pid  # age does not matter on one machine


def test_a_reused_pid_is_not_the_claimant(tmp_path, sleeper):
    """The pid lives, but it is another process than the one that claimed (its start time differs)."""
    if process_start(sleeper.pid) is None:
        pytest.skip("no /proc on this system")
    runner = Runner()
    cell = tmp_path / "c"
    _write_claim(cell, runner.host, sleeper.pid, pid_start="1")
    assert runner.claim(cell).acquired


def test_claims_from_another_machine_expire_without_heartbeat(tmp_path):
    runner = Runner(stale_after_s=600)
    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    _write_claim(fresh, "node-17", 4242, age_s=30)
    _write_claim(stale, "node-17", 4242, age_s=601)
    assert not runner.claim(fresh).acquired
    taken = runner.claim(stale)
    assert taken.acquired and taken.took_over.host == "node-17"


def test_heartbeat_keeps_a_long_claim_fresh(tmp_path):
    runner = Runner(heartbeat_s=0.05)
    cell = tmp_path / "c"
    with runner:
        assert runner.claim(cell).acquired
        then = time.time() - 1000
        os.utime(cell / CLAIM_FILE, (then, then))
        time.sleep(0.5)
        assert read_holder(cell).age_s < 100
    assert not (cell / CLAIM_FILE).exists(), "leaving the runner releases its claims"


def test_two_runners_taking_over_the_same_dead_claim_cannot_both_win(tmp_path):
    """Both judged the old claim dead; the second must not remove the fresh claim of the first."""
    first, second = Runner(), Runner()
    cell = tmp_path / "c"
    _write_claim(cell, first.host, _dead_pid())
    dead = read_holder(cell)
    assert first._take_over(cell, dead)
    assert not second._take_over(cell, dead)
    assert read_holder(cell).runner == first.id
    # A takeover lock left behind by a runner that died mid-takeover blocks only for a while.
    (cell / "claim.json.takeover").touch()
    assert not second._take_over(cell, read_holder(cell))
    then = time.time() - 3600
    os.utime(cell / "claim.json.takeover", (then, then))
    assert not second._take_over(cell, read_holder(cell))  # clears the old lock, tries again later
    assert not (cell / "claim.json.takeover").exists()


def test_unreadable_claim_is_live_for_a_moment_then_stale(tmp_path):
    runner = Runner()
    cell = tmp_path / "c"
    cell.mkdir()
    (cell / CLAIM_FILE).write_text("")  # being written by its creator
    assert not runner.claim(cell).acquired
    then = time.time() - 3600
    os.utime(cell / CLAIM_FILE, (then, then))
    assert runner.claim(cell).acquired


def test_contention_sees_other_busy_runners_of_this_machine(sleeper, isolated_runner_registry):
    me, other = Runner(), Runner()
    with me, other:
        watch = ContentionWatch(me)
        watch.sample()
        assert watch.result()["other_runners"] == []  # idle runners are not contention
        other.set_state("computing", "cell-x")
        watch.sample()
        other.set_state("idle")
        watch.sample()
        result = watch.result()
        assert len(result["other_runners"]) == 1 and "computing cell-x" in result["other_runners"][0]
        assert result["cpu_count"] == os.cpu_count() and result["load_average_max"] >= 0
    # An entry of a runner that died without cleaning up is ignored and removed.
    ghost = isolated_runner_registry / "ghost.json"
    ghost.write_text(json.dumps({"host": me.host, "pid": _dead_pid(), "runner": "ghost", "state": "computing"}))
    assert me.others_busy() == [] and not ghost.exists()


def test_contention_sees_live_claims_of_other_runners_in_the_same_folder(tmp_path, sleeper):
    """A runner registered elsewhere (another cache folder) is still seen through its claim on a cell."""
    me = Runner()
    _write_claim(tmp_path / "cells" / "theirs", me.host, sleeper.pid, pid_start=process_start(sleeper.pid))
    _write_claim(tmp_path / "cells" / "dead", me.host, _dead_pid())
    watch = ContentionWatch(me, tmp_path / "cells")
    watch.sample()
    assert watch.result()["other_runners"] == [f"{me.host} pid {sleeper.pid}: claim on theirs"]


class _InterruptedOnce(Runner):
    """A runner whose first look at a claim's holder is interrupted, as a SIGTERM raised inside ``release``."""

    interrupted = False

    def holder(self, directory):
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return super().holder(directory)


def test_a_release_interrupted_by_a_signal_is_finished_on_the_way_out(tmp_path, isolated_runner_registry):
    """The race of a CI failure (test_sigterm_says_what_was_kept, 2026-12-04): the signal landed inside the cell's
    release. The claim stays held until its file is gone, so leaving the runner removes it. (Discarding it from the
    held claims before removing the file, as before, fails this test: nothing removes the file.)"""
    cell = tmp_path / "cells" / "c"
    with pytest.raises(KeyboardInterrupt):
        with _InterruptedOnce() as runner:
            assert runner.claim(cell).acquired
            runner.release(cell)
    assert runner.interrupted and not (cell / CLAIM_FILE).exists(), "the claim is released on the way out"
