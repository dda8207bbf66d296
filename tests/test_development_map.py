"""docs/development.md's layout table is the map a newcomer reads first: every package of ``spectr_repro`` is in
it, and every ``spectr_repro/...`` path it names exists (issue 51: it named ``tracking.py`` after tracking had become a
package of five modules, and ``verify/__init__`` as the registry)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "spectr_repro"


def _layout_table() -> str:
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    start = text.index("| path | concern |")
    return text[start:text.index("\n\n", start)]


def _named_paths(table: str) -> set[str]:
    first_cells = [line.split("|")[1] for line in table.splitlines()[2:]]
    names = set()
    for cell in first_cells:
        for path in re.findall(r"`([^`]+)`", cell):
            names.add(path if path.startswith(("spectr_repro/", "scripts/")) else f"spectr_repro/{path}")
    return {name for name in names if "/" in name.removeprefix("spectr_repro/") or name.endswith((".py", "/"))}


def test_every_named_path_exists():
    missing = sorted(p for p in _named_paths(_layout_table()) if not (REPO / p.rstrip("/")).exists())
    assert missing == [], f"docs/development.md names paths that do not exist: {missing}"


def test_every_package_is_in_the_map():
    named = {p.rstrip("/") for p in _named_paths(_layout_table())}
    packages = sorted(f"spectr_repro/{d.name}" for d in PACKAGE.iterdir()
                      if d.is_dir() and (d / "__init__.py").exists() and d.name != "conf")
    assert [p for p in packages if p not in named] == []


def test_the_map_would_catch_a_stale_entry():
    """Negative control: a table naming a module that is gone (the old ``tracking.py``) is caught."""
    stale = "| path | concern |\n|---|---|\n| `spectr_repro/tracking.py` | W&B |"
    assert [p for p in _named_paths(stale) if not (REPO / p).exists()] == ["spectr_repro/tracking.py"]
