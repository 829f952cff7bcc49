"""A report as a list of neutral blocks, rendered once to HTML and once to Markdown, so the two twins
always say the same thing. Cells carry a class name that the tests (and CSS) can address.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Union

from core.escape import markdown as _md


@dataclass(frozen=True)
class Cell:
    text: str
    cls: str = ""


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Para:
    text: str
    cls: str = ""


@dataclass(frozen=True)
class Code:
    text: str
    cls: str = ""


@dataclass(frozen=True)
class Items:
    items: tuple[str, ...]
    cls: str = ""


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    cls: str = ""
    row_keys: tuple[str, ...] = ()  # data-key per row (a run id, a knob name)


@dataclass(frozen=True)
class Image:
    name: str
    title: str
    caption: str
    png: bytes = field(repr=False)


Block = Union[Heading, Para, Code, Items, Table, Image]


def cell(v: object, cls: str = "") -> Cell:
    return v if isinstance(v, Cell) else Cell("" if v is None else str(v), cls)


def kv(pairs: list[tuple[str, object]], cls: str = "kv") -> Table:
    return Table(("field", "value"), tuple((Cell(k, "key"), cell(v, "value")) for k, v in pairs), cls,
                 tuple(k for k, _ in pairs))


# -- HTML ------------------------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;
line-height:1.4;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em}th,td{border:1px solid #ccc;padding:.25em .5em;
vertical-align:top;text-align:left}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.native:empty{background:repeating-linear-gradient(45deg,#fafafa,#fafafa 4px,#eee 4px,#eee 8px)}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto}figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.85em;color:#555}.muted{color:#666}.warn{color:#a00}section.experiment{border-left:3px solid #ccc;
padding-left:1em;margin:1.2em 0}
"""


def _h_cell(c: Cell, tag: str = "td") -> str:
    cls = f' class="{html.escape(c.cls)}"' if c.cls else ""
    return f"<{tag}{cls}>{html.escape(c.text)}</{tag}>"


def to_html(title: str, blocks: list[Block]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            anchor = f' id="{html.escape(b.anchor)}"' if b.anchor else ""
            out.append(f"<h{b.level}{anchor}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            cls = f' class="{html.escape(b.cls)}"' if b.cls else ""
            out.append(f"<p{cls}>{html.escape(b.text)}</p>")
        elif isinstance(b, Code):
            out.append(f'<pre class="{html.escape(b.cls)}"><code>{html.escape(b.text)}</code></pre>')
        elif isinstance(b, Items):
            out.append(f'<ul class="{html.escape(b.cls)}">' + "".join(f"<li>{html.escape(i)}</li>" for i in b.items)
                       + "</ul>")
        elif isinstance(b, Table):
            head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b.headers) + "</tr>"
            rows = []
            for i, r in enumerate(b.rows):
                key = f' data-key="{html.escape(b.row_keys[i])}"' if i < len(b.row_keys) else ""
                rows.append(f"<tr{key}>" + "".join(_h_cell(c) for c in r) + "</tr>")
            out.append(f'<table class="{html.escape(b.cls)}"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode()
            out.append(f'<figure class="plot" data-plot="{html.escape(b.name)}"><img alt="{html.escape(b.title)}" '
                       f'src="data:image/png;base64,{data}"><figcaption>{html.escape(b.caption)}</figcaption></figure>')
    out.append("</body></html>")
    return "\n".join(out)


# -- Markdown --------------------------------------------------------------------------------------------
def to_markdown(blocks: list[Block], image_dir: str = "img") -> str:
    """Markdown with the same content; images are files beside it (`image_dir/<name>.png`). Every text is plain
    text (a person's reason as much as a figure): escaped as Markdown (core/escape.py), so it is never markup."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + _md(b.text), ""]
        elif isinstance(b, Para):
            out += [_md(b.text), ""]
        elif isinstance(b, Code):
            out += ["```", b.text, "```", ""]
        elif isinstance(b, Items):
            out += [f"* {_md(i)}" for i in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md(h) for h in b.headers) + " |")
            out.append("|" + "---|" * len(b.headers))
            out += ["| " + " | ".join(_md(c.text) for c in r) + " |" for r in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{_md(b.title)}]({image_dir}/{b.name}.png)", "", f"*{_md(b.caption)}*", ""]
    return "\n".join(out)
