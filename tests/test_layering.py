"""Data flows one way (docs/development.md): config -> models + prompts -> engine -> records -> tables.

The import graph of ``spectr_repro`` is read from the source (every ``import`` and ``from ... import`` of a
``spectr_repro`` module, lazy ones inside functions included) and checked three ways:

- the edges the layering forbids: the rules are pure, the engine knows no runner, the analysis reads records
  only, the runner and the scoring of quality do not depend on the analysis, the cost model sits below the
  commands;
- no cycle between packages, and no command borrows from another: what the commands (runner, replay, bias, bench,
  check, plan) share sits below them in ``launch`` (configs at the door, the pair cache, the memory fit, budgets
  and signals, stop strings, claims), which imports no command; only ``plan``, which prices the sweep's cells and
  the replays, reads ``runner``'s and ``replay``'s plans;
- no cycle between modules, inside a package too (a package's ``__init__`` is a module like the others).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx

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
    "files": set(),
    "units": {"errors", "files", "records"},  # the one store for units of work: below every command
    "theory": {"models", "sampling", "tracking", "verify"},  # tracking: its commands log their results to W&B
    "quality": {"data", "verify", "errors", "records", "tracking"},  # tracking: quality.csv logged to W&B
    # the one cost model: below every command that prices or predicts (plan, replay, check, bench)
    "cost": {"data", "engine", "errors", "files", "models", "paper", "settings", "verify"},
}
# packages the analysis may not import: it reads records and files, never models, engines or runners
ANALYSIS_FORBIDDEN = {"engine", "models", "runner", "replay", "bias", "bench", "check", "theory", "quality"}
RUNNER_FORBIDDEN = {"analysis"}
COMMANDS = {"runner", "replay", "bias", "bench", "check", "plan"}
# launch is below every command; a command may use another command's package only where named here
COMMAND_USES = {"plan": {"runner", "replay"}}  # plan prices the sweep's cells and the replays with their own plans


def module_name(path: Path, root: Path) -> str:
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path):
    """(line, module, member) of every import in ``path`` (member None for ``import a.b``), relative ones resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield from ((node.lineno, base, alias.name) for alias in node.names)


def module_imports(root: Path = PACKAGE) -> nx.DiGraph:
    """module -> the ``spectr_repro`` modules it imports (edge attribute ``where``: file and line)."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph = nx.DiGraph()
    graph.add_nodes_from(paths)
    for source, path in paths.items():
        for line, base, member in imported_names(path, root):
            targets = [base]  # `from a import b` runs a's module (a package's __init__) even when b is a module
            if member and f"{base}.{member}" in paths:
                targets.append(f"{base}.{member}")
            for named in targets:
                target = named
                while target and target not in paths:  # a name inside a module: that module
                    target = target.rpartition(".")[0]
                target = target if "." in target else named  # not in the tree: the name as written
                if target != source and target.split(".")[0] == root.name and "." in target:
                    graph.add_edge(source, target, where=f"{path.relative_to(root)}:{line}")
    return graph


def package_imports(root: Path = PACKAGE) -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the files importing it (``spectr_repro.<pkg>``; a module is its own package)."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for source, target, where in module_imports(root).edges(data="where"):
        source_package, target_package = (_package(source), _package(target))
        if source_package and target_package and source_package != target_package:
            graph[source_package][target_package].add(where.rpartition(":")[0])
    return graph


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def violations(graph) -> list[str]:
    found = []
    for source, targets in graph.items():
        for target, files in targets.items():
            forbidden = (source in ALLOWED and target not in ALLOWED[source]) or \
                        (source == "analysis" and target in ANALYSIS_FORBIDDEN) or \
                        (source == "runner" and target in RUNNER_FORBIDDEN) or \
                        (source == "launch" and target in COMMANDS | {"analysis"}) or \
                        (source in COMMANDS and target in COMMANDS and target != source
                         and target not in COMMAND_USES.get(source, set()))
            if forbidden:
                found.append(f"{source} -> {target} ({', '.join(sorted(files))})")
    return sorted(found)


def cycles(edges) -> list[tuple[str, ...]]:
    """Every group of nodes that import each other (directly or around a loop), sorted."""
    graph = nx.DiGraph()
    graph.add_edges_from(edges)
    return sorted(tuple(sorted(group)) for group in nx.strongly_connected_components(graph) if len(group) > 1)


def package_cycles(root: Path = PACKAGE) -> list[tuple[str, ...]]:
    return cycles((source, target) for source, targets in package_imports(root).items() for target in targets)


def module_cycles(root: Path = PACKAGE) -> list[tuple[str, ...]]:
    return cycles(module_imports(root).edges)


def test_the_packages_import_one_way():
    assert violations(package_imports()) == []


def test_no_two_packages_import_each_other():
    assert package_cycles() == []


def test_no_two_modules_import_each_other():
    assert module_cycles() == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "spectr_repro"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_check_sees_a_forbidden_import(tmp_path):
    """Negative control: a rule that imports the engine, a lazy import of the runner inside an analysis function,
    the shared library importing a command and one command borrowing from another are reported; allowed edges
    (engine -> verify, plan -> runner) are not."""
    root = _tree(tmp_path, {"verify/rule.py": "from spectr_repro.engine.loop import generate\n",
                            "analysis/rule.py": "def f():\n    import spectr_repro.runner.cli\n",
                            "engine/rule.py": "from spectr_repro.verify import VERIFIERS\n",
                            "launch/pairs.py": "from spectr_repro.replay.core import block_estimates\n",
                            "replay/driver.py": "from spectr_repro.runner.store import cell_id\n",
                            "plan/cli.py": "from spectr_repro.runner.plan import build_plan\n"})
    assert violations(package_imports(root)) == ["analysis -> runner (analysis/rule.py)",
                                                 "launch -> replay (launch/pairs.py)",
                                                 "replay -> runner (replay/driver.py)",
                                                 "verify -> engine (verify/rule.py)"]


def test_the_check_sees_cycles_of_packages_and_of_modules(tmp_path):
    """Negative control: two command packages that use each other (one of them lazily, inside a function),
    two modules of one package that import each other (one relatively), and a package ``__init__`` that
    imports a module importing it back are reported; a chain without a loop (plan -> runner -> cost) is not."""
    root = _tree(tmp_path, {
        "runner/__init__.py": "",
        "runner/plan.py": "from spectr_repro.runner.replay_plan import format_replay\n"
                          "from spectr_repro.cost import seconds\n",
        "runner/replay_plan.py": "def f():\n    from .plan import duration\n",
        "runner/cli.py": "def main():\n    import spectr_repro.check.run\n",
        "check/__init__.py": "",
        "check/run.py": "from spectr_repro.runner import store\n",
        "models/__init__.py": "from spectr_repro.models.devices import device\n",
        "models/devices.py": "from spectr_repro.models import hub, DEFAULT\n",
        "models/hub.py": "",
        "cost/__init__.py": "",
        "plan/cli.py": "from spectr_repro.runner.plan import build_plan\n"})
    (root / "runner" / "store.py").write_text("")
    assert package_cycles(root) == [("check", "runner")]
    assert module_cycles(root) == [("spectr_repro.models", "spectr_repro.models.devices"),
                                   ("spectr_repro.runner.plan", "spectr_repro.runner.replay_plan")]
