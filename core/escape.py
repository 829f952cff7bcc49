"""A person's text made inert for the medium it goes to: one function per medium, used by every place that writes
to it (the webhook and the chat apps' cards for Slack, the Feishu cards, the report's Markdown twin, the logs).

The text is always shown as the person wrote it, never followed as markup: a reason `no <!channel>` is the words
"no <!channel>" in Slack (no ping), `<at id=all></at>` is not an @all in Feishu, `<img src=x onerror=...>` is text
in a Markdown viewer that renders HTML, and a newline in a log line cannot forge the next record. HTML itself is
`html.escape` (the report's HTML twin and the dashboard escape through it).
"""
from __future__ import annotations

import re

_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# Feishu/Lark card markdown (JSON 2.0 rich text) reads HTML tags (<at>, <font>, <a>) and Markdown links; it
# shows HTML character references as the characters they name
_FEISHU = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;", "*": "&#42;",
                         "~": "&#126;", "`": "&#96;"})
# CommonMark: any ASCII punctuation after a backslash is that character, never markup; escaping these keeps raw
# HTML (<...>), entities (&...;), links and images ([..](..)), code spans and table cells (|) out of the
# rendering, while a name like max_num_seqs stays readable
_MD_SPECIAL = re.compile(r"([\\`<>&\[\]|])")
_LINE_BREAKS = re.compile(r"[\r\n\u0085\u2028\u2029]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def slack(text: str) -> str:
    """Slack mrkdwn: &, < and > as Slack asks (no <!channel>, <@user> or <url|label> from a person's text)."""
    return text.translate(_SLACK)


def feishu(text: str) -> str:
    """Feishu/Lark card markdown: HTML-like tags, links and emphasis marks as character references."""
    return text.translate(_FEISHU)


def markdown(text: str) -> str:
    """Markdown (report.md), inline: the punctuation that starts markup backslash-escaped and line breaks folded
    to a space (a person's text cannot open a heading, a list or a table row of its own)."""
    return _MD_SPECIAL.sub(r"\\\1", _LINE_BREAKS.sub(" ", text))


def log(text: str) -> str:
    """One log line: control characters (newlines included) as \\xNN, so a person's text cannot forge a record."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
