"""Result files keep the user's umask (issue 26): mkstemp's 0600 made cells unreadable to a team sharing a
results folder."""

from __future__ import annotations

import os
import stat

import pytest

from spectr_repro.runner.store import write_cell


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_cell_files_get_the_mode_of_a_plain_open(tmp_path, umask, expected):
    previous = os.umask(umask)
    try:
        write_cell(tmp_path / "cell", [{"prompt_id": "a"}], {"method": "sd"}, config=None)
        plain = tmp_path / "plain.txt"
        plain.write_text("x")  # what open(path, "w") gives under this umask: the reference
    finally:
        os.umask(previous)
    assert stat.S_IMODE(plain.stat().st_mode) == expected
    for name in ("records.jsonl", "summary.json"):
        assert stat.S_IMODE((tmp_path / "cell" / name).stat().st_mode) == expected, name
