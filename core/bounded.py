"""Parsing JSON and YAML that a person or a client sent, with bounds checked before the parser builds anything.

A body nested a thousand levels deep makes Python's JSON decoder and PyYAML's composer recurse past the
interpreter's limit (RecursionError: a 500, and the connection dropped); a 1.7 KB YAML alias bomb (each level an
anchor referenced nine times by the next) expands to millions of nodes, and a validation error that repeats the
value becomes tens of megabytes. So: the nesting depth is counted on the raw text (JSON: the brackets outside
strings; YAML: the parser's events, which PyYAML produces without recursing), the YAML size is counted as it
would expand (an alias counts the nodes of its anchor), and a refusal names the limit. `excerpt` bounds how
much of a value any error message repeats.

A key repeated in one mapping, at any depth, is refused naming the key and its line: JSON and YAML parsers keep
the last value silently, so `hot: ask` then `hot: auto` would run `auto` while a reviewer reading top-down sees
`ask`. (JSON: an object_pairs_hook; YAML: a SafeLoader whose mappings check their keys as they are built.)
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


class RepeatedKey(BoundsError):
    """A mapping that names one key twice; the message names the key and the line of its second use."""


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
    """JSON within the depth bound, each object's keys once (RepeatedKey naming the key and its line)."""
    check_json(raw.encode() if isinstance(raw, str) else raw, max_depth)
    try:
        return json.loads(raw, object_pairs_hook=_unique_pairs)
    except _Repeat as e:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line, first = _json_key_lines(text, e.key)
        raise RepeatedKey(f"key {excerpt(e.key)!r} is repeated at line {line} (first at line {first}); each key "
                          "once") from None


class _Repeat(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Repeat(k)
        out[k] = v
    return out


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')


def _json_key_lines(text: str, key: str) -> tuple[int, int]:
    """(line of the repeat, line of the first use) of `key` in one object: a linear scan of strings and brackets
    (only after the decoder found the repeat, so the text is valid JSON)."""
    stack: list[tuple[bool, dict[str, int]]] = []  # (an object, its keys -> line)
    expect_key = False
    for m in _JSON_TOKEN.finditer(text):
        tok = m.group()
        if tok in ("{", "["):
            stack.append((tok == "{", {}))
            expect_key = tok == "{"
        elif tok in ("}", "]"):
            stack.pop()
            expect_key = False
        elif tok == ",":
            expect_key = bool(stack) and stack[-1][0]
        elif expect_key:
            expect_key = False
            line = text.count("\n", 0, m.start()) + 1
            keys = stack[-1][1]
            if json.loads(tok) == key and key in keys:
                return line, keys[key]
            keys.setdefault(json.loads(tok), line)
    return 0, 0


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a mapping naming a key twice is refused. The merge key `<<` is a key like any
    other: two of them in one mapping would let the last merge silently win (merge several with `<<: [*a, *b]`);
    a key given beside a merge overrides the merged one, as YAML says."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                merge = key_node.tag == "tag:yaml.org,2002:merge"
                key = "<<" if merge else self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the constructor refuses it with its own words
                if first is not None:
                    raise RepeatedKey(f"key {excerpt(str(key))!r} is repeated at line {line} (first at line {first}); "
                                      "each key once")
                seen[key] = line
        return super().construct_mapping(node, deep)


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
    return yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader subclass)


def excerpt(value: Any, limit: int = EXCERPT) -> str:
    """At most `limit` characters of a value's text, saying how long the whole was when cut."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
