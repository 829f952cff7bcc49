"""The words of the chat grammar: a message normalised and cut into tokens, and a cursor that takes them in order.

Normalisation is what people's keyboards vary in and nothing more: Unicode NFKC (full-width digits and letters,
"？" and "：" become ASCII), every apostrophe and quote folded to one (U+2019 from phones and macOS is "'"), case
(tokens compare case-folded; a reason keeps its case), white space, and final punctuation other than "?".
Tokenising is one pass of one regular expression with no backtracking across tokens, so it is linear in the
message; the grammar (api/chat.py) then takes at most a fixed number of tokens before the reason.
"""
from __future__ import annotations

import re
import unicodedata
from itertools import islice
from typing import NamedTuple

# two substitutions with a constant replacement (str.translate with a table costs a dictionary look-up a character)
_SINGLE = re.compile("[\u2018\u2019\u201a\u201b\u2032\u2035`\u00b4\u02bc\u02b9\uff07]")
# digits NFKC would turn into candidate numbers although nobody types them as such (superscripts, subscripts,
# circled and parenthesised digits, mathematical and segmented digits): they become U+FFFD, no number at all.
# Full-width digits (what a Chinese or Japanese keyboard types) are digits.
_ODD_DIGITS = re.compile("[\u00b2\u00b3\u00b9\u2070\u2074-\u2079\u2080-\u2089\u2460-\u249b\u24ea-\u24ff"
                         "\u3251-\u325f\u32b1-\u32bf\U0001d7ce-\U0001d7ff\U0001f100-\U0001f10a"
                         "\U0001fbf0-\U0001fbf9]")
_DOUBLE = re.compile("[\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb\u300c\u300d\u300e\u300f]")
_FINAL = " .!。,;~、"  # after NFKC: "！" is "!", "…" is "...", "，" is ","
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{16}(?![0-9A-Za-z])"  # a card hash
                    rf"|[{_HAN}]"  # one Chinese character: phrases are sequences of them
                    rf"|[^\W\d_{_HAN}]+(?:'[^\W\d_{_HAN}]+)*"  # a word, "don't" whole
                    r"|[0-9]+(?:\.[0-9]+)*"  # a number as typed: "5.7" is one token, never the candidate 5
                    r"|\S")  # anything else is a token of its own: punctuation, an emoji


class Tok(NamedTuple):
    text: str  # case-folded
    start: int  # where it starts in the normalised message
    end: int


def normalise(text: str) -> str:
    """NFKC (digits only as people type them), quotes folded, white space collapsed, final punctuation other
    than '?' dropped."""
    t = unicodedata.normalize("NFKC", _ODD_DIGITS.sub("\ufffd", text))
    t = " ".join(_DOUBLE.sub('"', _SINGLE.sub("'", t)).split())
    return t.rstrip(_FINAL)  # rstrip, not a regex anchored at $: linear on a long run of dots


def tokens(text: str, limit: int | None = None) -> list[Tok]:
    """The tokens of an already normalised message (the first `limit` of them: a sentence of the grammar is
    short before its reason, so a long message is never cut into tokens whole)."""
    return [Tok(m.group().casefold(), m.start(), m.end()) for m in islice(_TOKEN.finditer(text), limit)]


def phrase(words: str) -> tuple[str, ...]:
    """A grammar phrase as tokens ("go ahead with", "批准", "card-hours")."""
    return tuple(t.text for t in tokens(unicodedata.normalize("NFKC", words)))  # "no." keeps its dot


def phrases(*words: str) -> tuple[tuple[str, ...], ...]:
    """Alternatives, longest first (so "go back to" is tried before "go")."""
    return tuple(sorted({phrase(w) for w in words}, key=len, reverse=True))


class Cursor:
    """Tokens taken left to right; every take is O(phrase length), and a sentence takes a bounded number."""

    def __init__(self, text: str, toks: list[Tok], more: bool = False) -> None:
        self.text, self.toks, self.i, self.more = text, toks, 0, more  # more: tokens beyond those cut

    def done(self) -> bool:
        return self.i >= len(self.toks) and not self.more

    def peek(self, ahead: int = 0) -> str | None:
        j = self.i + ahead
        return self.toks[j].text if j < len(self.toks) else None

    def take(self, alternatives: tuple[tuple[str, ...], ...]) -> tuple[str, ...] | None:
        """The first alternative the next tokens spell out (consumed), else None."""
        for alt in alternatives:
            if tuple(t.text for t in self.toks[self.i:self.i + len(alt)]) == alt:
                self.i += len(alt)
                return alt
        return None

    def number(self, digits: int = 9) -> int | None:
        """A whole number of at most `digits` digits (consumed), else None."""
        t = self.peek()
        if t is not None and t.isdigit() and len(t) <= digits:
            self.i += 1
            return int(t)
        return None

    def decimal(self) -> float | None:
        """A plain decimal such as 7 or 7.5 (consumed), else None."""
        t = self.peek()
        if t is not None and re.fullmatch(r"[0-9]{1,7}(?:\.[0-9]{1,6})?", t):
            self.i += 1
            return float(t)
        return None

    def rest(self) -> str:
        """The message from the next token on, as typed (case kept); consumes it all."""
        start = self.toks[self.i].start if self.i < len(self.toks) else len(self.text)
        self.i, self.more = len(self.toks), False
        return self.text[start:].strip()
