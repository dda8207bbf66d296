"""The repository's layout: the test tree (pytest's default import mode, rootdir-relative "rootdir/basename",
refuses two test modules with one basename in folders without ``__init__.py``, and CI then fails at collection),
and the top-level ``conf/`` the specification promises beside ``spectr_repro/``: a link to the package's configs,
so that there is one copy and the wheel ships it."""
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

from spectr_repro.conf import CONF_ENV_VAR, PACKAGED_CONF
from spectr_repro.launch.config import Composer, conf_dir

TESTS = Path(__file__).parent
REPO = TESTS.parent


def test_test_module_basenames_are_unique_outside_packages():
    loose = [p for p in TESTS.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    counts = Counter(p.name for p in loose)
    clashes = {name: sorted(str(p.relative_to(TESTS)) for p in loose if p.name == name)
               for name, n in counts.items() if n > 1}
    assert not clashes, f"rename one of each: {clashes}"


def test_top_level_conf_is_a_relative_link_to_the_package_configs():
    link = REPO / "conf"
    assert link.is_symlink(), "conf/ must be a link to spectr_repro/conf, not a second copy"
    target = os.readlink(link)
    assert not os.path.isabs(target), f"conf -> {target}: an absolute link breaks in another clone"
    assert link.resolve() == PACKAGED_CONF
    # Committed as a link (mode 120000), so a clone gets the link and not a copy of the files.
    entry = subprocess.run(["git", "ls-files", "-s", "conf"], cwd=REPO, capture_output=True, text=True, check=True)
    assert entry.stdout.split()[:1] == ["120000"], entry.stdout


def test_hydra_composes_the_same_config_through_the_top_level_conf(monkeypatch):
    overrides = ["experiment=cpu_quick", "dataset=gsm8k"]
    with Composer() as composer:
        packaged = composer.compose(overrides)
    monkeypatch.setenv(CONF_ENV_VAR, str(REPO / "conf"))
    assert conf_dir() == REPO / "conf"
    with Composer() as composer:
        through_link = composer.compose(overrides)
    assert through_link == packaged and through_link.grid


def _tracked(*pathspec: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--", *pathspec], cwd=REPO, capture_output=True, text=True)
    return out.stdout.split()


def test_committed_results_are_sealed_small_and_packed():
    """results/ holds only what .gitignore re-includes for the committed runs (results/README.md): every group has
    its manifest and every file its manifest records is the one committed (seal --check), no plain blocks.jsonl,
    60 MB at most in all (issue 48)."""
    from spectr_repro.committed import check_group
    from spectr_repro.units import unit_state

    tracked = _tracked("results")
    assert "results/README.md" in tracked
    assert not [p for p in tracked if p.endswith("blocks.jsonl")]
    allowed = ("README.md", "replay.json", "manifest.json", "done.json", "blocks.jsonl.gz", "audit/audit.json",
               "audit/AUDIT.md", "speedup_batch/bench_batch.json",
               "speedup_batch/bench_batch.partial.json", "speedup_batch/bench_batch_short.json",
               "bias_qwen/bias/bias.csv")
    bias_context = re.compile(r"^results/bias_qwen/bias/contexts/[^/]+/(setting\.json|[^/]+/[a-z_]+\.json)$")
    assert [p for p in tracked if not p.endswith(allowed) and not bias_context.match(p)] == []
    # every committed bias context is finished: its done.json vouches for the files beside it
    contexts = sorted({(REPO / p).parent for p in tracked if bias_context.match(p) and p.endswith("/done.json")})
    assert [str(c) for c in contexts if unit_state(c).status != "finished"] == []
    assert sum((REPO / p).stat().st_size for p in tracked) <= 60 * 2**20
    groups = sorted({(REPO / p).parent for p in tracked if p.endswith("/replay.json")})
    for group in groups:
        checked, problems = check_group(group)
        # a prompt a running replay finished since the last seal is not committed yet: only committed ones count
        problems = [p for p in problems if "finished but not in" not in p
                    or str(Path(p.split(":")[0]).relative_to(REPO) / "done.json") in tracked]
        assert problems == [], group  # a group a stopped round only began may hold no prompt yet


def test_the_readme_results_block_is_the_committed_grids_table():
    """README.md's results table is regenerated from the committed grid (T=0.4), not from a run a reader lacks: after
    a round of the grid is committed, `python -m spectr_repro.analysis.readme results/replay_qwen_grid/replay
    --temperature 0.4` must be rerun. Negative control: a README whose table differs by one value is caught."""
    from spectr_repro.analysis import readme
    from spectr_repro.docblocks import read_block

    text = (REPO / "README.md").read_text()
    table = readme.render(REPO / "results" / "replay_qwen_grid" / "replay", REPO, temperature=0.4)
    assert read_block(text, readme.BLOCK, "README.md") == table
    value = re.search(r"\| SBV +\| +3 \| (\d\.\d\d)", text).group(1)
    altered = text.replace(f"| {value} [", f"| {float(value) + 0.01:.2f} [", 1)
    assert altered != text and read_block(altered, readme.BLOCK, "README.md") != table
