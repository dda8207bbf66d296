"""scripts/kv_peak_memory.py: the engine's measured peak on a cached context is at least the KV caches of its K
rows (what ``launch.fit`` counts as the least a long bucket needs); bad arguments exit 2."""

from __future__ import annotations

import re

import pytest

from tests.script_helpers import load_script

PRINTED = re.compile(r"peak (\d+) MiB above the built models; KV caches of K rows (\d+) MiB, of K \+ 1 rows (\d+) MiB")


def test_the_measured_peak_holds_the_caches_of_k_rows(capsys):
    """K = 2 rows of 1,200 positions: 77 MiB of caches, far above the allocator's noise of a few MiB."""
    assert load_script("kv_peak_memory").main(["--K", "2", "--positions", "1200"]) == 0
    peak, k_rows, k_plus_one = map(int, PRINTED.search(capsys.readouterr().out).groups())
    assert k_rows > 64 and k_plus_one > k_rows
    assert peak >= k_rows


@pytest.mark.parametrize("bad", [["--K", "0"], ["--positions", "4"], ["--prompts", "0"]])
def test_bad_arguments_exit_2(bad):
    with pytest.raises(SystemExit) as exit_:
        load_script("kv_peak_memory").main(bad)
    assert exit_.value.code == 2
