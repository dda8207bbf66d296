"""Where a number was measured: device, library versions, threads, host, and the code's git commit.

One helper for the runner (each cell's summary), the report and the benchmark.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

import torch

from spectr_repro.commit import git_commit


@functools.cache
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def environment(device: str = "cpu") -> dict[str, Any]:
    """The environment of a measurement on ``device`` (a JSON-ready dict)."""
    import transformers  # transformers (~1 s): refusals and light commands exit before any model loads

    return {
        "device": str(device),
        "device_name": device_name(str(device)),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "num_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
    }


__all__ = ["cpu_name", "device_name", "environment", "git_commit"]
