"""The test tree itself: pytest's default import mode (rootdir-relative "rootdir/basename") refuses two test
modules with one basename in folders without ``__init__.py``, and CI then fails at collection."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_module_basenames_are_unique_outside_packages():
    loose = [p for p in TESTS.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    counts = Counter(p.name for p in loose)
    clashes = {name: sorted(str(p.relative_to(TESTS)) for p in loose if p.name == name)
               for name, n in counts.items() if n > 1}
    assert not clashes, f"rename one of each: {clashes}"
