"""The repository carries its own docs: every relative link in README.md and docs/ resolves inside the
repository, and no file points at design notes that live outside it."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|\b(?:REFERENCE|DESIGN|STYLE|ENGINES)\.md\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(r"`((?:[\w.-]+/)+[\w.*-]*)`")  # a backticked repository path: `executor/runner.py`, `docs/`


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return [ROOT / f for f in out if (ROOT / f).is_file()]


def outside_refs(files: list[Path]) -> dict[str, list[str]]:
    hits: dict[str, list[str]] = {}
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found = OUTSIDE.findall(text)
        if found:
            hits[f.name if ROOT not in f.parents else str(f.relative_to(ROOT))] = sorted(set(found))
    return hits


def broken_links(md: Path) -> list[str]:
    bad = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        resolved = (md.parent / target).resolve()
        if not resolved.exists() or ROOT not in resolved.parents and resolved != ROOT:
            bad.append(target)
    return bad


def stale_paths(md: Path) -> list[str]:
    """Backticked repository paths in a document that name no file or folder of the repository."""
    out = []
    for p in PATH.findall(md.read_text(encoding="utf-8")):
        if p.startswith(("/", "~", ".tuneloop", "http")) or "<" in p or not (ROOT / p.split("/")[0]).exists():
            continue  # not a path inside the repository (a folder of a data directory, a user's file)
        if not any(ROOT.glob(p.rstrip("/"))):
            out.append(p)
    return out


def test_paths_named_in_the_docs_exist():
    mds = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert {str(m.relative_to(ROOT)): stale_paths(m) for m in mds if stale_paths(m)} == {}


def test_the_path_check_sees_a_stale_path(tmp_path: Path):
    md = tmp_path / "x.md"
    md.write_text("the runner (`executor/runner.py`) and the old one (`executor/no_such_module.py`)\n")
    assert stale_paths(md) == ["executor/no_such_module.py"]


def test_no_file_points_outside_the_repository():
    me = Path(__file__).resolve()
    assert outside_refs([f for f in tracked() if f.resolve() != me]) == {}


def test_the_check_sees_an_outside_reference(tmp_path: Path):
    f = tmp_path / "m.py"
    outside = ".." + "/shared/" + "DESIGN" + ".md"  # built from parts: no file of the repository names it
    f.write_text(f'"""Formulas of {"REFERENCE" + ".md"} §1, see {outside}."""\n')
    assert outside_refs([f]) != {}


def test_docs_exist_and_links_resolve():
    docs = sorted((ROOT / "docs").glob("*.md"))
    names = {d.name for d in docs}
    assert {"architecture.md", "glossary.md", "metrics.md", "protocol.md"} <= names
    mds = [ROOT / "README.md", *docs]
    assert {str(m.relative_to(ROOT)): broken_links(m) for m in mds if broken_links(m)} == {}


def test_the_link_check_sees_a_broken_link(tmp_path: Path):
    md = tmp_path / "x.md"
    md.write_text("see [the metrics](metrics-that-do-not-exist.md)\n")
    assert broken_links(md) == ["metrics-that-do-not-exist.md"]


def test_no_tracked_file_holds_merge_conflict_markers():
    """A merge left half-resolved (a `<<<<<<<` / `>>>>>>>` line) breaks a Makefile or README silently."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    marked = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".png", ".gguf", ".safetensors"}:
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        marked += [f"{name}:{i}" for i, line in enumerate(lines, 1) if line.startswith(("<<<<<<< ", ">>>>>>> "))]
    assert not marked, marked


def test_the_readme_is_short_and_points_at_every_doc():
    """The README holds the two commands, the quick start, an overview and a table of contents; everything else
    lives in docs/ by topic, each doc linked from the README's table of contents."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"^```\w*\n(.*?)^```", readme, re.S | re.M)  # the README's first block: the two commands
    assert first and [line.split()[:2] for line in first.group(1).splitlines()] == [["make", "demo"], ["make", "test"]]
    assert readme.index(first.group(0)) < readme.index("\n## ")  # before any section
    toc = readme[readme.index("\n## Documentation by topic\n"):]
    linked = {Path(t).name for t in LINK.findall(toc) if t.startswith("docs/")}
    docs = {d.name for d in (ROOT / "docs").glob("*.md")}
    assert docs - linked == set(), f"docs not in the README's table of contents: {sorted(docs - linked)}"
    assert len(readme.encode()) < 12_000, f"the README is {len(readme.encode())} bytes: move the detail into docs/"
