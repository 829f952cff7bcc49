"""The user's own traffic read as requests: a prompt dataset or a trace with arrival times.

Four formats, each checked line by line (an error names the file as the scenario writes it, the line and the reason,
never the line's content: a data file may hold anything, and its errors reach API clients):

* `mooncake`: JSONL, one request a line: `timestamp` (ms from the trace's start), `input_length`, `output_length`,
  optional `hash_ids` (one id per 512-token block of the prompt; requests sharing leading ids share that prefix).
* `burstgpt`: CSV with BurstGPT's header (`Timestamp` in s, `Model`, `Request tokens`, `Response tokens`,
  `Total tokens`, `Log Type`); rows with 0 request or response tokens (the log's failed requests) are left out.
* `sharegpt`: a JSON array of `{"conversations": [{"from": ..., "value": ...}, ...]}`; the first turn is the prompt,
  the second the reply whose word count is the output length; entries with fewer than two turns are left out.
* `prompts-jsonl`: JSONL, one `{"prompt": "...", "output_len": N}` a line.

Lengths are counted as the scenarios count them: a trace's input length is that many words of generated text (the
simulator counts a word a token; a real engine tokenises the words its own way and the load generator records its
count), a dataset's prompt is sent as written and counted in words.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from core.datafiles import DataFileError, read_text

FORMATS = ("mooncake", "burstgpt", "sharegpt", "prompts-jsonl")
TIMED = ("mooncake", "burstgpt")  # formats with arrival times
MAX_BYTES = 64 << 20
MOONCAKE_BLOCK = 512  # tokens per hash id in a Mooncake trace
FILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,119}$"
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


@dataclass(frozen=True)
class Row:
    """One request of the file: its lengths, its arrival (s from the first request; None: a dataset), its text (a
    dataset's prompt) and its prefix blocks (a Mooncake trace's hash ids)."""

    n_in: int
    n_out: int
    t: float | None = None
    text: str | None = None
    blocks: tuple[int, ...] | None = None


def _bad(shown: str, line: int, reason: str) -> DataFileError:
    return DataFileError(f"{shown} line {line}: {reason}")


def _int(obj: dict, key: str, shown: str, line: int, minimum: int = 1) -> int:
    if key not in obj:
        raise _bad(shown, line, f"{key}: missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _bad(shown, line, f"{key}: must be an integer >= {minimum}")
    return v


def _stamp(v: Any, key: str, shown: str, line: int, last: float) -> float:
    """A non-negative, finite arrival time that does not go back."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _bad(shown, line, f"{key}: must be a number >= 0")
    if v < last:
        raise _bad(shown, line, f"{key}: goes back in time (the file must be in arrival order)")
    return float(v)


def _jsonl(text: str, shown: str) -> Iterator[tuple[int, dict]]:
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise _bad(shown, i, "not valid JSON") from None
        if not isinstance(obj, dict):
            raise _bad(shown, i, "not a JSON object")
        yield i, obj


def mooncake(text: str, shown: str) -> list[Row]:
    rows: list[Row] = []
    last = 0.0
    for i, obj in _jsonl(text, shown):
        if "timestamp" not in obj:
            raise _bad(shown, i, "timestamp: missing")
        last = _stamp(obj["timestamp"], "timestamp", shown, i, last)
        n_in, n_out = _int(obj, "input_length", shown, i), _int(obj, "output_length", shown, i)
        ids = obj.get("hash_ids")
        if ids is not None:
            if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in ids):
                raise _bad(shown, i, "hash_ids: must be a list of integers >= 0")
            if len(ids) > math.ceil(n_in / MOONCAKE_BLOCK):
                raise _bad(shown, i, f"hash_ids: {len(ids)} blocks of {MOONCAKE_BLOCK} tokens are more than "
                                     f"input_length holds")
        rows.append(Row(n_in=n_in, n_out=n_out, t=last / 1000.0, blocks=tuple(ids) if ids else None))
    return rows


def burstgpt(text: str, shown: str) -> list[Row]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in BURSTGPT_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise _bad(shown, 1, f"header: no column {missing} (BurstGPT's: Timestamp, Model, Request tokens, "
                             "Response tokens, Total tokens, Log Type)")
    rows: list[Row] = []
    last = 0.0
    for rec in reader:
        i = reader.line_num
        try:
            ts = float(rec["Timestamp"] or "")
        except ValueError:
            raise _bad(shown, i, "Timestamp: must be a number >= 0") from None
        last = _stamp(ts, "Timestamp", shown, i, last)
        n = {}
        for col in ("Request tokens", "Response tokens"):
            try:
                n[col] = int(rec[col] or "")
            except ValueError:
                n[col] = -1
            if n[col] < 0:
                raise _bad(shown, i, f"{col}: must be an integer >= 0")
        if n["Request tokens"] and n["Response tokens"]:  # 0: a failed request in the log, left out
            rows.append(Row(n_in=n["Request tokens"], n_out=n["Response tokens"], t=last))
    return rows


def _json_entries(text: str, shown: str) -> Iterator[tuple[int, Any]]:
    """The elements of a top-level JSON array with the line each starts on."""
    dec = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())

    def fail(at: int, reason: str) -> DataFileError:
        return _bad(shown, text.count("\n", 0, at) + 1, reason)

    if not text.startswith("[", pos):
        raise fail(pos, "not a JSON array of conversations")
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise fail(pos, "the array is not closed")
        if text[pos] == "]":
            return
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise fail(e.pos, "not valid JSON") from None
        yield text.count("\n", 0, pos) + 1, obj
        pos = end


def sharegpt(text: str, shown: str) -> list[Row]:
    rows: list[Row] = []
    for i, entry in _json_entries(text, shown):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise _bad(shown, i, "conversations: missing or not a list")
        if len(turns) < 2:
            continue  # no reply to take a length from: left out, as vllm bench serve does
        words = []
        for turn in turns[:2]:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise _bad(shown, i, "conversations: a turn without a text 'value'")
            words.append(turn["value"].split())
        if words[0] and words[1]:
            rows.append(Row(n_in=len(words[0]), n_out=len(words[1]), text=turns[0]["value"]))
    return rows


def prompts_jsonl(text: str, shown: str) -> list[Row]:
    rows: list[Row] = []
    for i, obj in _jsonl(text, shown):
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.split():
            raise _bad(shown, i, "prompt: missing, not a string or empty")
        rows.append(Row(n_in=len(prompt.split()), n_out=_int(obj, "output_len", shown, i), text=prompt))
    return rows


PARSERS: dict[str, Callable[[str, str], list[Row]]] = {
    "mooncake": mooncake, "burstgpt": burstgpt, "sharegpt": sharegpt, "prompts-jsonl": prompts_jsonl}


def beside(folder: Path, name: str, shown: str) -> Path:
    """The file `name` in `folder` (the scenario's own), never outside it (symlinks followed)."""
    if not re.match(FILE_NAME, name):
        raise DataFileError(f"{shown}: source.file must be a file name beside the scenario (no path)")
    root = folder.resolve()
    p = (root / name).resolve()
    if p.parent != root or not p.is_file():
        raise DataFileError(f"{shown}: source.file {name!r}: no such file beside the scenario")
    return p


def read(path: Path, fmt: str, shown: str) -> tuple[tuple[Row, ...], str]:
    """The file's requests and the sha256 of its text; refused when it has none."""
    text = read_text(path, shown, MAX_BYTES).removeprefix("\ufeff")  # a byte-order mark some exporters write
    rows = PARSERS[fmt](text, shown)
    if not rows:
        raise DataFileError(f"{shown}: no request to replay")
    return tuple(rows), hashlib.sha256(text.encode()).hexdigest()


def picks(rows: tuple[Row, ...], n: int, warmup: int) -> list[tuple[int, int]]:
    """(row, pass) of each request: the formal ones (ids warmup...) replay the file from its first row, wrapping
    round past its end; the warm-up ones (ids 0...) are the rows after the formal ones."""
    m = len(rows)
    formal = [(j % m, j // m) for j in range(n)]
    warm = [((n + i) % m, (n + i) // m) for i in range(warmup)]
    return warm + formal


def offsets(rows: tuple[Row, ...], n: int, speed: float = 1.0, rate: float | None = None) -> list[float]:
    """Send times (s) of the n formal requests from the first: the file's own gaps divided by `speed`, or, with a
    `rate`, stretched so that the n requests arrive at that mean rate (inf: all at once). Past the file's end it
    starts again one mean gap after its last request."""
    m = len(rows)
    t0 = rows[0].t or 0.0
    span = (rows[-1].t or 0.0) - t0
    period = span + (span / (m - 1) if m > 1 else 0.0)
    out = [(rows[j % m].t or 0.0) - t0 + (j // m) * period for j in range(n)]
    if rate is None:
        return [t / speed for t in out]
    if math.isinf(rate):
        return [0.0] * n
    if out[-1] <= 0:  # the requests arrive together: nothing to stretch
        return out
    scale = (n - 1) / rate / out[-1]
    return [t * scale for t in out]
