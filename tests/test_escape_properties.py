"""Property tests of core/escape.py, one per medium: whatever a person writes, the medium shows those characters and
follows none of them as markup. Markdown is rendered by a real CommonMark renderer (markdown-it-py, which rich
installs); Slack, Feishu and the logs are checked against what their readers decode."""
from __future__ import annotations

import html
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from core import escape

# text that leans on every medium's markup: tags, entities, links, mentions, emphasis, code, tables, line breaks
MARKUP = st.sampled_from(["<", ">", "&", "[", "]", "(", ")", "*", "_", "~", "`", "|", "#", "!", "\\", "\n", "\r",
                          "\u2028", "<!channel>", "<at user_id=\"all\"></at>", "&lt;", "&amp;", "](https://x.example)",
                          "<img src=x onerror=alert(1)>", "<https://evil.example|Approve>", "- ", "1. ", "> "])
TEXT = st.lists(st.one_of(MARKUP, st.text(max_size=8)), max_size=30).map("".join)
MD = MarkdownIt("commonmark")
BREAKS = re.compile(r"[\r\n\u0085\u2028\u2029]+")


@settings(max_examples=2000, deadline=None)
@given(TEXT)
def test_markdown_renders_as_the_text_itself(text):
    out = MD.render(escape.markdown(text))
    body = re.fullmatch(r"(?s)<p>(.*)</p>\n", out)
    shown = BREAKS.sub(" ", text).replace("\x00", "\ufffd").strip()  # CommonMark shows NUL as U+FFFD
    if not shown:
        assert out == "" or body is not None
        return
    # one paragraph and no other element: no heading, list, quote, link, image, code or raw HTML of the person's
    assert body is not None, (text, out)
    inner = body.group(1)
    assert "<" not in inner.replace("&lt;", "").replace("<br />", ""), (text, out)  # no tag but a hard break
    # what a reader sees is what the person wrote (line breaks folded to a space; CommonMark's hard break on
    # two trailing spaces before one is the only place white space shows otherwise)
    seen = html.unescape(inner.replace("<br />\n", " "))
    assert " ".join(seen.split()) == " ".join(shown.split()), (text, out)


@settings(max_examples=2000, deadline=None)
@given(TEXT)
def test_slack_shows_the_characters_and_parses_no_control_sequence(text):
    out = escape.slack(text)
    assert "<" not in out and ">" not in out  # no <!channel>, <@U..>, <url|label>
    # Slack decodes exactly these three entities: the reader sees the person's text
    assert out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == text


@settings(max_examples=2000, deadline=None)
@given(TEXT)
def test_feishu_card_markdown_holds_no_tag_link_or_emphasis(text):
    out = escape.feishu(text)
    assert not set(out) & set("<>[]*~`")
    assert html.unescape(out) == text  # Feishu shows character references as the characters they name


@settings(max_examples=2000, deadline=None)
@given(TEXT)
def test_feishu_plain_text_is_text_tags_only(text):
    post = escape.feishu_post(text)
    paras = post["zh_cn"]["content"]
    assert all(e == {"tag": "text", "text": e["text"]} for para in paras for e in para)  # never at, a, img
    assert escape.feishu_post_text(post) == re.sub(r"\r\n|[\r\n\u0085\u2028\u2029]", "\n", text)


@settings(max_examples=2000, deadline=None)
@given(TEXT)
def test_log_line_holds_no_control_character(text):
    out = escape.log(text)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", out) and len(out.splitlines()) <= 1
    back = re.sub(r"\\x([0-9a-f]{2})|\\u(202[89])", lambda m: chr(int(m.group(1) or m.group(2), 16)), out)
    assert back == text or "\\" in text  # reversible unless the person wrote a literal \xNN themselves
