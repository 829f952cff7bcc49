"""Imports flow one way (docs/architecture.md): api -> agent -> executor; the executor stays free of LLM and graph code."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "executor": {"openai", "langgraph", "agent", "api"},
    "agent": {"asyncssh", "api"},
    "state": {"agent", "api", "openai", "langgraph", "asyncssh"},
    "simulator": {"agent", "api", "state", "openai", "langgraph"},
}


def imported_tops(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    tops: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return tops


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package: str):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    bad = {str(f.relative_to(ROOT)): sorted(imported_tops(f) & FORBIDDEN[package]) for f in files}
    assert {f: mods for f, mods in bad.items() if mods} == {}


def test_the_checker_sees_a_forbidden_import(tmp_path: Path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from langgraph.graph import StateGraph\n    import openai.types\n")
    assert imported_tops(f) == {"langgraph", "openai"}
