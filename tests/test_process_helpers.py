"""The helpers of the stop-by-signal tests (tests/process_helpers.py) on a command that loads nothing: they wait for
its first record, stop it and return its last line, and refuse a wrong exit status (the slow tests rely on it)."""

from __future__ import annotations

import signal

import pytest

from tests.process_helpers import command_process, stop_once_written

# A stand-in command: writes its first record, then waits to be stopped, and says so on stderr as the commands do.
STAND_IN = """
import pathlib, signal, sys, time

def main(argv):
    out = pathlib.Path(argv[-1].split("=", 1)[1])

    def stop(number, frame):
        print("a progress line\\nstopped by SIGTERM: kept 1", file=sys.stderr)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    (out / "first.done").write_text("")
    time.sleep(60)
    return 0
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "stand_in_command.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return command_process("stand_in_command", tmp_path, [])


def test_stop_once_written_returns_the_stop_message(stand_in, tmp_path):
    message = stop_once_written(stand_in, tmp_path, "*.done", signal.SIGTERM, 143, wait_s=60)
    assert message == "stopped by SIGTERM: kept 1"


def test_stop_once_written_refuses_another_exit_status(stand_in, tmp_path):
    with pytest.raises(AssertionError):
        stop_once_written(stand_in, tmp_path, "*.done", signal.SIGTERM, 130, wait_s=60)
