"""The typed edges (issue 46), held over the source: no `Any` for a planner, a goal, a store or the twin anywhere in
agent/ and api/ (a protocol or the type itself), as a parameter, an attribute or what a function named for one
returns."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGE = re.compile(r"(^|_)(planner|goal|store|twin|fitter)s?$")  # steering_store, goal, twin; not restore, goal_body


def _named(tree: ast.AST) -> list[tuple[str, ast.expr, int]]:
    """(name, annotation, line) of every annotated parameter, attribute and function return of a module."""
    out: list[tuple[str, ast.expr, int]] = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            out += [(x.arg, x.annotation, x.lineno) for x in a.posonlyargs + a.args + a.kwonlyargs
                    + [v for v in (a.vararg, a.kwarg) if v is not None] if x.annotation is not None]
            if n.returns is not None:
                out.append((n.name, n.returns, n.lineno))
        elif isinstance(n, ast.AnnAssign):
            t = n.target
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name is not None:
                out.append((name, n.annotation, n.lineno))
    return out


def any_edges(root: Path, packages: tuple[str, ...] = ("agent", "api")) -> list[str]:
    """Every planner, goal, store or twin annotated with `Any` (anywhere in its annotation)."""
    bad = []
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            for name, ann, line in _named(ast.parse(f.read_text(), filename=str(f))):
                names = {x.id for x in ast.walk(ann) if isinstance(x, ast.Name)} | \
                    {x.value for x in ast.walk(ann) if isinstance(x, ast.Constant) and isinstance(x.value, str)}
                if EDGE.search(name.lower().lstrip("_")) and any(re.search(r"\bAny\b", s) for s in names):
                    bad.append(f"{f.relative_to(root).as_posix()}:{line}: {name}: {ast.unparse(ann)}")
    return bad


def test_no_any_for_a_planner_a_goal_a_store_or_the_twin():
    assert any_edges(ROOT) == []


def test_the_check_sees_one(tmp_path: Path):
    (tmp_path / "agent").mkdir()
    (tmp_path / "api").mkdir()
    (tmp_path / "agent" / "a.py").write_text(
        "from typing import Any, Callable, Iterator\n"
        "class H:\n    _twin: Any = None\n    planner: 'Any'\n"
        "def f(store: Any, goal_body: Any, fitter: Callable[[int], Any] | None) -> Any: ...\n"
        "def steering_store() -> Iterator[Any]: ...\n"
        "def queue_restore(x: int) -> Any: ...\n")
    assert sorted(any_edges(tmp_path)) == ["agent/a.py:3: _twin: Any", "agent/a.py:4: planner: 'Any'",
                                   "agent/a.py:5: fitter: Callable[[int], Any] | None", "agent/a.py:5: store: Any",
                                   "agent/a.py:6: steering_store: Iterator[Any]"]


def test_the_explore_phase_context_is_the_explorers_not_the_shared_asking():
    """Asking carries what every proposer reads; why the rules ran out and how a screen is re-staged reach an
    explore-phase proposer through `explore` (asked(..., exploring)), and a proposer that ignores them is asked
    its `propose`."""
    import dataclasses

    from agent.planner.proposers import Asking, Exploring, Proposals, Proposer
    from agent.planner.proposers.guarded import asked

    assert not {"why_rules", "restage"} & {f.name for f in dataclasses.fields(Asking)}

    class Seen(Proposer):
        name, phase = "seen", "explore"

        def propose(self, asking: Asking) -> Proposals:
            return Proposals(yields="propose")

    class Reads(Seen):
        def explore(self, asking: Asking, exploring: Exploring) -> Proposals:
            return Proposals(yields=exploring.why_rules)

    ask = Asking(history=None, diag=None)  # type: ignore[arg-type]  (neither proposer reads the history)
    assert asked(Reads(), ask, Exploring("no rule move passes the checks")).yields == "no rule move passes the checks"
    assert asked(Seen(), ask, Exploring("no rule move passes the checks")).yields == "propose"
    assert asked(Reads(), ask).yields == "propose"
