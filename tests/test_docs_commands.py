"""Every command line the docs give is one the project has: each `tuneloop ...`, `make ...` and `python bench/...`
line of a fenced shell block in README.md and docs/*.md names a real sub-command of the `tuneloop` typer app (a
target of the Makefile, a script of bench/) and only options its --help lists, with no more arguments than it
takes and none of those it requires missing. The cheap ones run as written and
exit 0: `sim profiles`, `sim scenarios`, `sim derive --profile ...`, each documented command's --help screen, and
`tuneloop best`, `report`, `restore` and `exec unknown` on a goal a fixture ran in the folder the lines assume
(their placeholders filled with its goal id and station hash). A command named in running text or a table
(`tuneloop run --no-twin`, `bench/sim_calibrate.py [--engine ...]`) names a real sub-command, options and script. A
command a doc keeps after the CLI dropped it, or an option it renamed, fails here."""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.core import TyperArgument, TyperOption

ROOT = Path(__file__).resolve().parents[1]
TUNELOOP = str(ROOT / ".venv" / "bin" / "tuneloop")
SHELL_BLOCK = re.compile(r"^```(sh|bash|shell|console|)\n(.*?)^```", re.S | re.M)
OPERATORS = {"&", "&&", "||", "|", ";"}
PLACEHOLDER = re.compile(r"^<[^>]+>$|^\.\.\.$|^[A-Z][A-Z0-9_]*$")  # <goal-id>, ..., RUN, RUN1, P.yaml is a file


@dataclass(frozen=True)
class Line:
    doc: str
    lineno: int
    tokens: tuple[str, ...]  # the command's words, environment assignments and the shell's tail cut off
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.lineno}: {self.text}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def command_lines(text: str, doc: str = "x.md") -> list[Line]:
    """The `tuneloop` / `make` / `python bench/...` lines of the fenced shell blocks of one document."""
    out = []
    for block in SHELL_BLOCK.finditer(text):
        first = text[:block.start(2)].count("\n") + 1
        raw = block.group(2).split("\n")
        i = 0
        while i < len(raw):
            lineno, line = first + i, raw[i]
            while line.rstrip().endswith("\\") and i + 1 < len(raw):  # a continued line
                i += 1
                line = line.rstrip()[:-1] + " " + raw[i].strip()
            i += 1
            line = re.sub(r"^\s*\$ ", "", line)
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue  # not a command line of ours (prose inside a block)
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)  # TUNELOOP_TWIN=off make demo
            cut = next((k for k, w in enumerate(words) if w in OPERATORS or w.startswith((">", "2>"))), len(words))
            words = words[:cut]
            if not words:
                continue
            head = words[0]
            if head in ("tuneloop", ".venv/bin/tuneloop", "make") or (
                    Path(head).name in ("python", "python3") and len(words) > 1 and words[1].startswith("bench/")):
                out.append(Line(doc, lineno, tuple(words), line.split("  #")[0].strip()))
    return out


def documented() -> list[Line]:
    return [c for f in doc_files() for c in command_lines(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]


@functools.cache
def cli():
    sys.path.insert(0, str(ROOT))
    import tuneloop_cli

    return typer.main.get_command(tuneloop_cli.build_app())


def is_group(cmd) -> bool:
    return hasattr(cmd, "list_commands")  # typer's own click (typer._click) or click's: a group lists commands


def ctx(cmd):
    return cmd.context_class(cmd)


def unbracket(words: tuple[str, ...] | list[str]) -> list[str]:
    """`[--frontier]`, `[--clear sim --who bob]`: the optional parts the docs show, as words."""
    return [w.strip("[]") for w in words if w.strip("[]")]


def resolve(words: list[str]):
    """(the sub-command's path, the command, the words after it, what is wrong with the path)."""
    cmd = cli()
    path: list[str] = []
    rest = list(words)
    while is_group(cmd):
        if not rest or rest[0].startswith("-"):
            if rest[:1] == ["--help"]:
                return path, cmd, rest, None
            return path, None, rest, f"'tuneloop {' '.join(path)}' needs a sub-command"
        sub = cmd.get_command(ctx(cmd), rest[0])
        if sub is None:
            known = ", ".join(sorted(cmd.list_commands(ctx(cmd))))
            return path, None, rest, f"'tuneloop {' '.join(path + [rest[0]])}' is no command (known: {known})"
        path.append(rest.pop(0))
        cmd = sub
    return path, cmd, rest, None


def check_tuneloop(words: tuple[str, ...], names_only: bool = False) -> list[str]:
    """What is wrong with a `tuneloop ...` line; `names_only`: only its sub-command and option names (a command
    named in prose, `tuneloop run --no-twin`, gives no arguments)."""
    path, cmd, rest, wrong = resolve(unbracket(words[1:]))
    if names_only and cmd is None and not rest and path:
        return []  # a group named in prose (`tuneloop budget`)
    if wrong or cmd is None:
        return [wrong or "no command"]
    if is_group(cmd):
        return []
    problems = []
    options = {o: p for p in cmd.params if isinstance(p, TyperOption) for o in (*p.opts, *p.secondary_opts)}
    arguments = [p for p in cmd.params if isinstance(p, TyperArgument)]
    name = "tuneloop " + " ".join(path)
    positional: list[str] = []
    k = 0
    while k < len(rest):
        w = rest[k]
        k += 1
        if w == "--help":
            continue
        if w.startswith("-") and len(w) > 1 and not re.match(r"^-\d", w):
            opt, _, inline = w.partition("=")
            p = options.get(opt)
            if p is None:
                problems.append(f"'{name}' has no option {opt} (its --help lists {', '.join(sorted(options))})")
                continue
            if p.is_flag or p.count or names_only:
                continue
            value = inline if inline else (rest[k] if k < len(rest) else None)
            if not inline:
                k += 1
            if value is None:
                problems.append(f"'{name} {opt}' takes a value and the line gives none")
            continue
        if w != "...":
            positional.append(w)
    if names_only:
        return problems
    unbounded = any(a.nargs == -1 for a in arguments)
    takes = sum(max(a.nargs, 0) for a in arguments)
    if not unbounded and len(positional) > takes:
        problems.append(f"'{name}' takes {takes} argument(s), the line gives {positional}")
    needed = sum(1 for a in arguments if a.required and a.nargs != -1)
    if "--help" not in rest and len(positional) < needed:
        problems.append(f"'{name}' needs {needed} argument(s), the line gives {positional}")
    return problems


def check_make(words: tuple[str, ...]) -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", makefile, re.M))
    problems = []
    for w in words[1:]:
        if "=" in w:
            var = w.split("=")[0]
            if not re.search(rf"\$\({var}\)|^{var}\s*[?:]?=", makefile, re.M):
                problems.append(f"the Makefile reads no variable {var}")
        elif not w.startswith("-") and w not in targets:
            problems.append(f"the Makefile has no target {w} (its targets: {', '.join(sorted(targets))})")
    return problems


@functools.cache
def bench_help(script: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def check_bench(words: tuple[str, ...]) -> list[str]:
    script = words[1]
    if not (ROOT / script).is_file():
        return [f"no script {script}"]
    rc, text = bench_help(script)
    if rc != 0:
        return [f"{script} --help exits {rc}: {text[-300:]}"]
    known = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))
    return [f"{script} has no option {w.split('=')[0]} (its --help: {', '.join(sorted(known))})"
            for w in unbracket(words[2:]) if w.startswith("-") and w.split("=")[0] not in known]


def check(line: Line, names_only: bool = False) -> list[str]:
    head = line.tokens[0]
    if head == "make":
        return check_make(line.tokens)
    if head in ("tuneloop", ".venv/bin/tuneloop"):
        return check_tuneloop(line.tokens, names_only)
    return check_bench(line.tokens)


INLINE = re.compile(r"(?<!`)`((?:tuneloop|make|\.venv/bin/tuneloop) [^`]+|bench/\w+\.py(?: [^`]*)?)`(?!`)")


def inline_commands(text: str, doc: str = "x.md") -> list[Line]:
    """The commands a document names in running text and tables (`tuneloop run --no-twin`, `bench/sim_speed.py`,
    `tuneloop load summarize|export`, a table's `[--engine sim\\|vllm]`), outside its code blocks: one line per
    alternative of a sub-command word."""
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    out = []
    for m in INLINE.finditer(prose):
        span = " ".join(m.group(1).replace("\\|", "|").replace("\u2026", "...").split())
        lineno = prose[:m.start()].count("\n") + 1
        words = span.split(" ")
        k = next((i for i, w in enumerate(words) if w.startswith(("-", "[", "<")) or w == "..."), len(words))
        alternatives = [words[:k]]
        for i, w in enumerate(words[:k]):
            if "|" in w and i > 0:
                alternatives = [a[:i] + [alt] + a[i + 1:] for a in alternatives for alt in w.split("|")]
        for alt in alternatives:
            line = " ".join(["python"] if alt[0].startswith("bench/") else []) + " " + " ".join(alt + words[k:])
            out += [Line(doc, lineno, c.tokens, span) for c in command_lines("```sh\n" + line.strip() + "\n```\n", doc)]
    return out


def test_the_docs_give_commands_of_every_kind():
    lines = documented()
    heads = {ln.tokens[0] for ln in lines}
    assert {"make", "tuneloop"} <= heads, heads
    paths = {tuple(resolve(unbracket(ln.tokens[1:]))[0]) for ln in lines if ln.tokens[0] == "tuneloop"}
    for need in [("run",), ("serve",), ("best",), ("restore",), ("sim", "profiles"), ("sim", "scenarios")]:
        assert need in paths, f"no doc gives a 'tuneloop {' '.join(need)}' line"


def test_every_documented_command_and_option_exists():
    problems = [f"{ln.where}\n    {p}" for ln in documented() for p in check(ln)]
    assert not problems, "\n".join(problems)


def test_every_command_named_in_the_prose_exists():
    """A command named in running text or a table (`tuneloop run --no-twin`, `tuneloop llamacpp prepare --server`,
    `bench/sim_calibrate.py [--engine ...]`) names a real sub-command, real options, a real script."""
    lines = [ln for f in doc_files() for ln in inline_commands(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert len({ln.tokens[0] for ln in lines}) >= 2 and any(ln.tokens[0] == "python" for ln in lines)
    problems = [f"{ln.where}\n    {p}" for ln in lines for p in check(ln, names_only=True)]
    assert not problems, "\n".join(problems)


def test_the_check_refuses_a_gone_command_named_in_the_prose():
    doc = ("Run `tuneloop run --no-twin` or `tuneloop load summarize|export RUN`; `tuneloop sim nosuch` is gone,\n"
           "`tuneloop best --fronteir` misspelt, `make demo-rel` no target, `bench/no_such_bench.py` no script.\n"
           "| `bench/sim_speed.py [--no-such-option N]` | a table row |\n")
    found = {ln.text if ln.tokens[0] != "tuneloop" else " ".join(ln.tokens[1:3]): check(ln, names_only=True)
             for ln in inline_commands(doc)}
    assert found["run --no-twin"] == [] and found["load summarize"] == [] and found["load export"] == []
    assert "is no command" in found["sim nosuch"][0]
    assert "no option --fronteir" in found["best --fronteir"][0]
    assert "no target demo-rel" in found["make demo-rel"][0]
    assert "no script bench/no_such_bench.py" in found["bench/no_such_bench.py"][0]
    assert "has no option --no-such-option" in found["bench/sim_speed.py [--no-such-option N]"][0]


def test_the_check_refuses_what_the_cli_does_not_have():
    doc = "\n".join([
        "```sh",
        "tuneloop sim profiles                         # fine",
        "tuneloop sim nosuch --n 3                     # a command that is gone",
        "tuneloop best G --db sqlite:///x.db --fronteir  # a misspelt option",
        "tuneloop restore                              # its station missing",
        "make demo-rel                                 # no such target",
        "tuneloop run a.yaml \\",
        "    --no-such-flag                            # continued",
        "```",
    ])
    lines = command_lines(doc)
    found = {ln.tokens[1] if ln.tokens[0] == "make" else " ".join(ln.tokens[1:3]): check(ln) for ln in lines}
    assert found["sim profiles"] == []
    assert "is no command" in found["sim nosuch"][0]
    assert "no option --fronteir" in found["best G"][0]
    assert "restore" in found["restore"][0] and "needs 1 argument" in found["restore"][0]
    assert "no target demo-rel" in found["demo-rel"][0]
    assert "no option --no-such-flag" in found["run a.yaml"][0]


def test_every_documented_help_screen_renders():
    """Each documented command's own --help screen, as the CLI prints it, names every option the docs give it."""
    seen: dict[tuple[str, ...], set[str]] = {}
    for ln in documented():
        if ln.tokens[0] != "tuneloop":
            continue
        path, cmd, rest, wrong = resolve(unbracket(ln.tokens[1:]))
        if cmd is not None and not wrong:
            seen.setdefault(tuple(path), set()).update(w.split("=")[0] for w in rest if w.startswith("--"))
    assert seen
    for path, opts in seen.items():
        with pytest.raises(SystemExit) as done, _capture() as out:
            cli().main(args=[*path, "--help"], prog_name="tuneloop", standalone_mode=True)
        assert done.value.code == 0, path
        screen = out.getvalue()
        assert f"tuneloop {' '.join(path)}" in screen, screen[:500]
        for o in opts - {"--help"}:
            assert o in screen, f"'tuneloop {' '.join(path)} --help' does not show {o}"


class _capture:
    """sys.stdout into a buffer for one help screen (rich writes there)."""

    def __enter__(self):
        import io

        self.old, self.buf = sys.stdout, io.StringIO()
        sys.stdout = self.buf
        os.environ["COLUMNS"] = "200"
        return self.buf

    def __exit__(self, *exc):
        sys.stdout = self.old
        os.environ.pop("COLUMNS", None)
        return False


def run(words: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")} | {
        "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", "TUNELOOP_TWIN_CACHE": "off"}
    return subprocess.run([TUNELOOP, *words[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


CHEAP = {("sim", "profiles"), ("sim", "scenarios"), ("sim", "derive")}


def test_the_cheap_documented_commands_run_as_written():
    lines = [ln for ln in documented() if ln.tokens[0] == "tuneloop"
             and tuple(resolve(unbracket(ln.tokens[1:]))[0]) in CHEAP
             and not any(PLACEHOLDER.match(w.strip("[]")) or w.startswith("[") for w in ln.tokens)]
    assert {tuple(ln.tokens[1:3]) for ln in lines} >= {("sim", "profiles"), ("sim", "scenarios"), ("sim", "derive")}
    for ln in lines:
        p = run(list(ln.tokens), ROOT)
        assert p.returncode == 0, f"{ln.where}\n{p.stdout[-1500:]}{p.stderr[-1500:]}"
        assert p.stdout.strip(), ln.where
        if ln.tokens[1:3] == ("sim", "profiles"):  # every profile the library holds, by name
            names = {f.stem for f in (ROOT / "core" / "profiles").glob("*.yaml")}
            assert names <= set(re.findall(r"^(\S+)", p.stdout, re.M)), p.stdout


ON_A_GOAL = {("best",), ("report",), ("restore",), ("exec", "unknown")}


@pytest.fixture(scope="module")
def ran_goal(tmp_path_factory) -> tuple[Path, str, str]:
    """The quick start's goal run to its stop in a fresh folder with the store the usage lines name (tl.db)."""
    here = tmp_path_factory.mktemp("docs-goal")
    (here / "examples").symlink_to(ROOT / "examples")
    p = run(["tuneloop", "run", "examples/goal-quickstart.yaml", "--auto-approve", "--db", "sqlite:///tl.db"], here)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    goal = re.search(r"goal (my-first-goal-\w+): (?:done|stopped)", p.stdout + p.stderr)
    assert goal, p.stdout[-2000:]
    best = run(["tuneloop", "best", goal.group(1), "--db", "sqlite:///tl.db", "--json"], here)
    assert best.returncode == 0, best.stdout[-2000:] + best.stderr[-2000:]
    station = json.loads(best.stdout)["stations"][0]["station"]
    return here, goal.group(1), station


def filled(words: tuple[str, ...], goal: str, station: str, optional: bool) -> list[str]:
    """The line with its placeholders given the fixture's values, its optional parts kept or left out."""
    out, inside = [], False
    for w in words:
        opens, closes = w.startswith("["), w.endswith("]")
        inside = inside or opens
        if not inside or optional:
            w = w.strip("[]")
            out.append({"<goal-id|goal.yaml>": goal, "<goal-id>": goal, "<station-hash>": station}.get(w, w))
        if closes:
            inside = False
    return out


def test_documented_commands_on_a_goal_run_as_written(ran_goal):
    here, goal, station = ran_goal
    lines = [ln for ln in documented() if ln.tokens[0] == "tuneloop"
             and tuple(resolve(unbracket(ln.tokens[1:]))[0]) in ON_A_GOAL]
    assert {tuple(resolve(unbracket(ln.tokens[1:]))[0]) for ln in lines} == ON_A_GOAL
    for ln in lines:
        forms = [False] if ln.tokens[1:3] == ("exec", "unknown") else [False, True]  # --clear changes the store
        for words in {tuple(filled(ln.tokens, goal, station, optional)): None for optional in forms}:
            words = list(words)
            p = run(words, here)
            said = p.stdout + p.stderr
            assert p.returncode == 0, f"{ln.where}\n{' '.join(words)}\n{said[-2000:]}"
            if words[1] == "best":
                assert station[:12] in said and "tuneloop restore" in said, said[-2000:]
            if words[1] == "report":
                assert (here / "reports" / goal / "report.md").is_file() or "report" in said, said[-2000:]
            if words[1] == "restore":
                assert '"identical": true' in said, said[-2000:]
