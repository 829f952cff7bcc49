"""Parsing JSON and YAML that a person or a client sent, with bounds checked before the parser builds anything.

A body nested a thousand levels deep makes Python's JSON decoder and PyYAML's composer recurse past the
interpreter's limit (RecursionError: a 500, and the connection dropped); a 1.7 KB YAML alias bomb (each level an
anchor referenced nine times by the next) expands to millions of nodes, and a validation error that repeats the
value becomes tens of megabytes. So: the nesting depth is counted on the raw text (JSON: the brackets outside
strings; YAML: the parser's events, which PyYAML produces without recursing), the YAML size is counted as it
would expand (an alias counts the nodes of its anchor), and a refusal names the limit. `excerpt` bounds how
much of a value any error message repeats.
"""
from __future__ import annotations

import json
import re
from typing import Any

import yaml

MAX_DEPTH = 32  # a goal spec nests 4 levels; a chat or decision body 2
MAX_NODES = 20_000  # a goal spec is ~100 nodes; the search space of a large one a few thousand values
EXCERPT = 120  # characters of a value an error message repeats


class BoundsError(ValueError):
    """A document beyond a parsing bound; the message names the bound."""


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")


def json_depth(raw: bytes) -> int:
    """The deepest bracket nesting of a JSON text, strings left out (a linear scan; malformed text is the
    decoder's to refuse)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


def check_json(raw: bytes, max_depth: int = MAX_DEPTH) -> None:
    if (d := json_depth(raw)) > max_depth:
        raise BoundsError(f"nested {d} levels deep; at most {max_depth} are accepted")


def load_json(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    check_json(raw.encode() if isinstance(raw, str) else raw, max_depth)
    return json.loads(raw)


def check_yaml(text: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Refuse YAML deeper than `max_depth` or larger than `max_nodes` once its aliases are expanded."""
    sizes: dict[str, int] = {}  # anchor -> the nodes it expands to
    open_: list[tuple[str | None, int]] = []  # collections being read: (anchor, nodes counted before it)
    nodes = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, yaml.AliasEvent):
            nodes += sizes.get(ev.anchor, 1)
        elif isinstance(ev, yaml.ScalarEvent):
            nodes += 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_.append((ev.anchor, nodes))
            nodes += 1
            if len(open_) > max_depth:
                raise BoundsError(f"nested more than {max_depth} levels deep; at most {max_depth} are accepted")
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, before = open_.pop()
            if anchor:
                sizes[anchor] = nodes - before
        if nodes > max_nodes:
            raise BoundsError(f"more than {max_nodes} values once its aliases are expanded; at most {max_nodes} "
                              "are accepted")


def load_yaml(text: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    check_yaml(text, max_depth, max_nodes)
    return yaml.safe_load(text)


def excerpt(value: Any, limit: int = EXCERPT) -> str:
    """At most `limit` characters of a value's text, saying how long the whole was when cut."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
