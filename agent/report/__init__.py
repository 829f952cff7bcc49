"""Reports a serving engineer reads (issue 8): a self-contained HTML file and its Markdown twin, written
from the store. `render_report(store, goal_id, out_dir)` is the one call (CLI, loop and API use it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from agent.report.blocks import to_html, to_markdown
from agent.report.build import Report, build_report
from agent.report.document import document
from core.records import write_atomic

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

__all__ = ["Report", "ReportPaths", "build_report", "default_dir", "render", "render_report", "write_report"]


@dataclass(frozen=True)
class ReportPaths:
    dir: Path
    html: Path  # self-contained: styles inline, plots as base64 PNG, no network
    markdown: Path  # the twin; its images are PNG files under images/
    images: dict[str, Path] = field(default_factory=dict)


def render_report(store: Store, goal_id: str, out_dir: str | Path, *, base: str | Path | None = None) -> ReportPaths:
    """Write report.html, report.md and images/*.png for one goal under out_dir (atomically per file).
    `base`: the folder relative run directories in the store are relative to (default: cwd)."""
    return render(build_report(store, goal_id, base), out_dir)


def render(rep: Report, out_dir: str | Path) -> ReportPaths:
    """Write an already built report (its plots are exactly the images written)."""

    goal_id = rep.content.goal.id
    blocks = document(rep)
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    images = {}
    for name, p in rep.plots.items():
        path = out / "images" / f"{name}.png"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(p.png)
        tmp.replace(path)
        images[name] = path
    html, md = out / "report.html", out / "report.md"
    write_atomic(html, to_html(f"tuneloop report — {goal_id}", blocks))
    write_atomic(md, to_markdown(blocks, "images"))
    return ReportPaths(dir=out, html=html, markdown=md, images=images)


def default_dir(store_url: str, goal_id: str) -> Path:
    """Beside a SQLite store (<db dir>/reports/<goal>), else .tuneloop/reports/<goal>."""

    u = make_url(store_url)
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
        return Path(u.database).parent / "reports" / goal_id
    return Path(".tuneloop") / "reports" / goal_id


def write_report(store: Store, goal_id: str, out_dir: str | Path | None = None) -> Path:
    """The loop's hook: write the report to its default place; the HTML path."""
    return render_report(store, goal_id, out_dir or default_dir(store.url, goal_id)).html
