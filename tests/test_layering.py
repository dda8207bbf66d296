"""Data flows one way (docs/development.md): config -> models + prompts -> engine -> records -> tables.

The package graph of ``spectr_repro`` is read from the source (every ``import`` and ``from ... import`` of a
``spectr_repro`` module, lazy ones inside functions included) and checked against the edges the layering
forbids: the rules are pure, the engine knows no runner, the analysis reads records only, the runner and the
scoring of quality do not depend on the analysis. The commands on top (runner, replay, bias, bench, check) may
use each other; the layers below them may not reach up.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spectr_repro"

# package -> the spectr_repro packages (or top-level modules) it may import; everything else is forbidden
ALLOWED = {
    "verify": {"sampling"},
    "sampling": set(),
    "engine": {"sampling", "verify"},
    "models": {"conf", "errors"},
    "data": {"errors"},
    "records": {"errors"},
    "paper": set(),
    "theory": {"models", "sampling", "verify"},
    "quality": {"data", "verify", "errors", "records"},
}
# packages the analysis may not import: it reads records and files, never models, engines or runners
ANALYSIS_FORBIDDEN = {"engine", "models", "runner", "replay", "bias", "bench", "check", "theory"}
RUNNER_FORBIDDEN = {"analysis"}


def package_imports(root: Path = PACKAGE) -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the files importing it (``spectr_repro.<pkg>``; a module is its own package)."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(root.rglob("*.py")):
        source = path.relative_to(root).with_suffix("").parts[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == root.name and len(parts) > 1 and parts[1] != source:
                    graph[source][parts[1]].add(str(path.relative_to(root)))
    return graph


def violations(graph) -> list[str]:
    found = []
    for source, targets in graph.items():
        for target, files in targets.items():
            forbidden = (source in ALLOWED and target not in ALLOWED[source]) or \
                        (source == "analysis" and target in ANALYSIS_FORBIDDEN) or \
                        (source == "runner" and target in RUNNER_FORBIDDEN)
            if forbidden:
                found.append(f"{source} -> {target} ({', '.join(sorted(files))})")
    return sorted(found)


def test_the_packages_import_one_way():
    assert violations(package_imports()) == []


def test_the_check_sees_a_forbidden_import(tmp_path):
    """Negative control: a rule that imports the engine, and a lazy import of the runner inside an analysis
    function, are both reported; an allowed edge (engine -> verify) is not."""
    root = tmp_path / "spectr_repro"
    for folder, text in {"verify": "from spectr_repro.engine.loop import generate\n",
                         "analysis": "def f():\n    import spectr_repro.runner.cli\n",
                         "engine": "from spectr_repro.verify import VERIFIERS\n"}.items():
        (root / folder).mkdir(parents=True)
        (root / folder / "rule.py").write_text(text)
    assert violations(package_imports(root)) == ["analysis -> runner (analysis/rule.py)",
                                                 "verify -> engine (verify/rule.py)"]
