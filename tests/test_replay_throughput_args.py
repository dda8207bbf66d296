"""scripts/replay_throughput.py's arguments: two commits with ``--batch-prompts B_before,B_after`` give each commit its
own batch size (B = 1 passes no argument, so a commit from before ``replay.batch_prompts`` runs), and bad sizes are
one message, exit 2, before anything runs."""

from __future__ import annotations

import pytest

from tests.script_helpers import load_script


def _script():
    return load_script("replay_throughput")


def test_two_commits_each_at_their_own_batch_size():
    script = _script()
    before, after = script.variants_of(script.parse_arguments(["HEAD", "HEAD", "--batch-prompts", "1,4"]))
    assert (before.label, before.arguments) == ("before B=1", ())
    assert (after.label, after.arguments) == ("after B=4", ("replay.batch_prompts=4",))
    assert before.commit == after.commit and len(before.commit) == 40


@pytest.mark.parametrize("sizes", ["1,2,4", "4", "0,4", "a,b"])
def test_two_commits_refuse_anything_but_two_sizes(sizes, capsys):
    script = _script()
    with pytest.raises(SystemExit) as stop:
        script.variants_of(script.parse_arguments(["HEAD", "HEAD", "--batch-prompts", sizes]))
    assert stop.value.code == 2 and "--batch-prompts" in capsys.readouterr().err
