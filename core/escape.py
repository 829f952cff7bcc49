"""A person's text made inert for the medium it goes to: one function per medium, used by every place that writes
to it (the webhook and the chat apps' cards for Slack, the Feishu cards and messages, the report's Markdown twin, the
logs).

The text is always shown as the person wrote it, never followed as markup: a reason `no <!channel>` is the words
"no <!channel>" in Slack (no ping), `<at id=all></at>` is not an @all in Feishu, `<img src=x onerror=...>` is text
in a Markdown viewer that renders HTML, and a newline in a log line cannot forge the next record. HTML itself is
`html.escape` (the report's HTML twin and the dashboard escape through it).
"""
from __future__ import annotations

import re
from typing import Any

_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# Feishu/Lark card markdown (JSON 2.0 rich text) reads HTML tags (<at>, <font>, <a>) and Markdown links; it
# shows HTML character references as the characters they name
_FEISHU = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;", "*": "&#42;",
                         "~": "&#126;", "`": "&#96;"})
# CommonMark: any ASCII punctuation after a backslash is that character, never markup; escaping these keeps raw
# HTML (<...>), entities (&...;), links and images ([..](..)), code spans, emphasis and strike-through (* ~ and a
# _ that is not inside a word), headings (#) and table cells (|) out of the rendering, while a name like
# max_num_seqs stays readable; a list marker (-, +, 1. or 1) and a space) is escaped where it would open the text
_MD_SPECIAL = re.compile(r"[\\`*<>&\[\]|~#]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_MD_LIST = re.compile(r"^([-+]|\d{1,9}(?=[.)]))(?=[.)]?(\s|$))")
_LINE_BREAKS = re.compile(r"[\r\n\u0085\u2028\u2029]+")
_LINE_SPLIT = re.compile(r"\r\n|[\r\n\u0085\u2028\u2029]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1 and the Unicode line separators


def slack(text: str) -> str:
    """Slack mrkdwn: &, < and > as Slack asks (no <!channel>, <@user> or <url|label> from a person's text)."""
    return text.translate(_SLACK)


def feishu(text: str) -> str:
    """Feishu/Lark card markdown: HTML-like tags, links and emphasis marks as character references."""
    return text.translate(_FEISHU)


def feishu_post(text: str) -> dict[str, Any]:
    """Feishu/Lark plain text (a chat reply, a question, the webhook's line) as a rich-text post whose every element
    is a `text` tag, one paragraph a line. Feishu shows a text tag's characters as they are (un_escape false): a
    person's `<at user_id="all"></at>` is those characters, never an @all, where the `text` message type reads it
    as a mention (and its links and emphasis as markup). The im.v1 content (the webhook wraps it in "post")."""
    lines = _LINE_SPLIT.split(text) or [""]
    return {"zh_cn": {"title": "", "content": [[{"tag": "text", "text": line}] for line in lines]}}


def feishu_post_text(content: dict[str, Any]) -> str:
    """The text a feishu_post carries, its lines joined by newlines (what a reader of the post sees)."""
    return "\n".join("".join(e.get("text", "") for e in para) for para in content["zh_cn"]["content"])


def markdown(text: str) -> str:
    """Markdown (report.md), inline: line breaks folded to a space, the text's ends stripped (four leading spaces
    would open a code block), and the punctuation that starts markup backslash-escaped: a person's text renders as
    its own characters in one paragraph, never a heading, list, quote, link, code or a table row of its own."""
    out = _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _LINE_BREAKS.sub(" ", text).strip())
    m = _MD_LIST.match(out)
    if m:  # "- x", "+ x": the marker itself; "1. x": the dot (or parenthesis) after the number
        out = "\\" + out if out[0] in "-+" else out[:m.end()] + "\\" + out[m.end():]
    return out


def log(text: str) -> str:
    """One log line: control characters (newlines included) as \\xNN and the Unicode line and paragraph separators
    as \\u2028 / \\u2029, so a person's text cannot forge a record."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text)
