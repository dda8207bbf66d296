"""What the tests of the long-running commands (replay, bias) share: the command in a process of its own, and a
stop by signal once it has finished something (fixtures stay in conftest.py; helpers are imported from here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def command_process(module: str, output: Path, arguments: Sequence[str], prelude: str = "") -> subprocess.Popen:
    """``module.main(arguments + output_dir=output)`` in its own process; ``prelude``: Python run first, with the
    module imported as ``driver`` (e.g. to inject a fault)."""
    code = f"import sys\nimport {module} as driver\n{prelude}\nsys.exit(driver.main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *arguments, f"output_dir={output}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def stop_once_written(process: subprocess.Popen, folder: Path, pattern: str, sent: signal.Signals, status: int,
                      wait_s: float = 300) -> str:
    """Wait until ``folder.glob(pattern)`` finds a file (the process still running), send ``sent``; the process must
    then exit with ``status`` without a traceback. Returns the last line of its stderr: the stop message."""
    deadline = time.monotonic() + wait_s
    while not list(folder.glob(pattern)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    process.send_signal(sent)
    _, err = process.communicate(timeout=120)
    assert process.returncode == status, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]
