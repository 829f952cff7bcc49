"""Every number in the planner is a named constant with a one-line reason (issue 37): no number in the logic of any
module under agent/planner/ (the rules, the proposers and the planner's own modules: function bodies, defaults,
lambdas, class bodies, the moves' MoveRule / Rule arguments) but the structural ones, and every numeric module
constant says on its line what it was measured or derived from, or that it is a judgement."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# structural numbers: zero, one, halving / doubling, percent, ms per s, s per h, MiB, divide-by-zero guards
STRUCTURAL = {0, 1, -1, 2, 100, 1000, 3600, 2 ** 20, 1e-6, 1e-9}
CALLS = {"MoveRule", "Rule"}


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def unexplained(path: Path) -> list[str]:
    src = path.read_text()
    tree, lines = ast.parse(src), src.splitlines()
    parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}

    def in_logic(node: ast.AST) -> bool:
        while node in parent:
            node = parent[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
                return True
        return False

    out = []
    for node in ast.walk(tree):
        if not _number(node):
            continue
        p = parent.get(node)
        neg = isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.USub)
        v = -node.value if neg else node.value
        up = parent.get(p) if neg else p
        if v in STRUCTURAL or not in_logic(node):
            continue
        if isinstance(up, ast.BinOp) and isinstance(up.op, ast.Pow):  # 2 ** 20
            continue
        if isinstance(node.value, int) and isinstance(up, ast.Subscript):  # a position: acc[-2]
            continue
        out.append(f"{path.name}:{node.lineno}: {v!r} in `{lines[node.lineno - 1].strip()}`")
    for st in tree.body:  # numeric UPPER_CASE constants carry their reason on their last line
        if not isinstance(st, (ast.Assign, ast.AnnAssign)) or st.value is None or isinstance(st.value, ast.Call):
            continue
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        numeric = any(_number(n) for n in ast.walk(st.value))
        if numeric and names and all(re.fullmatch(r"[A-Z][A-Z0-9_]*", n) for n in names) \
                and "#" not in lines[st.end_lineno - 1].split("=", 1)[-1]:
            out.append(f"{path.name}:{st.lineno}: {', '.join(names)} has no reason")
    return out


def test_every_number_in_the_planner_tree_is_a_named_constant_with_its_reason():
    found = [x for f in sorted((ROOT / "agent" / "planner").rglob("*.py")) for x in unexplained(f)]
    assert found == []


def test_the_scan_sees_an_inline_threshold_and_a_constant_without_its_reason(tmp_path: Path):
    (tmp_path / "rule.py").write_text(
        "GOOD = 0.3  # a judgement: open from here\nBARE = 0.6\n\n\n"
        "def score(x):\n    return x >= 0.95 or x[-2] > 2 ** 20 or x * 100 > 1\n\n\n"
        "RULE = Rule(name='r', moves={('batch_cap', 'up'): MoveRule(gain=0.2)})\n")
    assert unexplained(tmp_path / "rule.py") == [
        "rule.py:6: 0.95 in `return x >= 0.95 or x[-2] > 2 ** 20 or x * 100 > 1`",
        "rule.py:9: 0.2 in `RULE = Rule(name='r', moves={('batch_cap', 'up'): MoveRule(gain=0.2)})`",
        "rule.py:2: BARE has no reason"]
