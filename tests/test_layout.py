"""The package's floors, read from its own imports (ast, every import statement, also those inside
functions): no circles, and imports point down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dpverify"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(module: str) -> dict[str, set[str]]:
    """``{"ours": dpverify modules it imports, "outside": top-level names of everything else}``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # ``from a import b`` imports the module a.b when there is one, else names of a.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "dpverify" or target.startswith("dpverify."):
                if target != module and target != "dpverify":
                    ours.add(target)
            else:
                outside.add(target.split(".")[0])
    return {"ours": ours, "outside": outside}


IMPORTS = {module: _imports(module) for module in MODULES}


def test_the_walk_sees_the_imports_it_judges():
    assert "dpverify.audits.verdict" in IMPORTS["dpverify.audits.classification"]["ours"]
    assert "dpverify.stats.scoring" in IMPORTS["dpverify.audits.verdict"]["ours"]
    assert "pytest" in IMPORTS["dpverify.pytest.plugin"]["outside"]


def test_no_import_circle_inside_dpverify():
    graph = {module: imports["ours"] for module, imports in IMPORTS.items()}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                circle = path[path.index(target) :] + [target] if target in path else [module, target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def _floor_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


@pytest.mark.parametrize(
    "floor, allowed",
    [
        ("stats", {"_validation", "stats"}),
        ("canaries", {"_validation", "stats", "contract", "datasets", "canaries"}),
    ],
)
def test_the_bottom_floors_import_nothing_above_them(floor, allowed):
    for module, imports in IMPORTS.items():
        if _floor_of(module) == floor:
            above = sorted(target for target in imports["ours"] if _floor_of(target) not in allowed)
            assert not above, f"{module} imports {above}, above the {floor} floor"


def test_audits_know_neither_pytest_nor_the_cli():
    for module, imports in IMPORTS.items():
        if _floor_of(module) == "audits":
            assert "pytest" not in imports["outside"], module
            assert not {t for t in imports["ours"] if _floor_of(t) in ("pytest", "cli")}, module


def test_only_the_pytest_face_imports_pytest():
    importers = {module for module, imports in IMPORTS.items() if "pytest" in imports["outside"]}
    assert importers and all(_floor_of(module) == "pytest" for module in importers), sorted(importers)


def test_the_core_imports_no_deep_learning_framework_at_module_level():
    for module, path in MODULES.items():
        if module == "dpverify.torch":
            continue
        top_level = [node for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = {alias.name.split(".")[0] for node in top_level for alias in node.names if isinstance(node, ast.Import)}
        names |= {(node.module or "").split(".")[0] for node in top_level if isinstance(node, ast.ImportFrom)}
        assert not names & {"torch", "tensorflow", "opacus", "tensorflow_privacy"}, module
