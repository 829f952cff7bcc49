"""Server-sent events from an OpenAI-compatible stream, parsed robustly.

Bytes arrive in arbitrary pieces: a UTF-8 character or an event can be split across reads, so the
parser decodes incrementally, buffers, and yields an event only at a blank line (`\n\n` or `\r\n\r\n`).
"""
from __future__ import annotations

import codecs

DONE = "[DONE]"


class SSEParser:
    """Feed raw bytes, get back the `data` payload of every complete event (multi-line data joined)."""

    __slots__ = ("_dec", "_buf")

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""

    def feed(self, data: bytes) -> list[str]:
        buf = self._buf + self._dec.decode(data)
        if "\r" in buf:  # normalise CRLF / CR; a trailing CR waits for a possible LF in the next read
            cr = buf.endswith("\r")
            buf = (buf[:-1] if cr else buf).replace("\r\n", "\n").replace("\r", "\n") + ("\r" if cr else "")
        if "\n\n" not in buf:
            self._buf = buf
            return []
        *events, self._buf = buf.split("\n\n")
        out = []
        for ev in events:
            payload = _data_of(ev)
            if payload is not None:
                out.append(payload)
        return out

    def close(self) -> list[str]:
        """Flush a final event the server did not terminate with a blank line."""
        rest = self._buf + self._dec.decode(b"", final=True)
        self._buf = ""
        payload = _data_of(rest.replace("\r\n", "\n")) if rest.strip() else None
        return [payload] if payload is not None else []


def _data_of(event: str) -> str | None:
    if event.startswith("data: ") and "\n" not in event:  # the common case, fast
        return event[6:]
    lines = []
    for line in event.split("\n"):
        if line.startswith("data:"):
            lines.append(line[6:] if line.startswith("data: ") else line[5:])
    return "\n".join(lines) if lines else None
