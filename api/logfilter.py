"""No secret in any log: a logging filter on every handler of the service (uvicorn's access log included).

It masks every configured secret value (tokens, webhook URLs and secrets, the LLM key) wherever it appears
in a record, and drops the query string from access-log lines: a client that puts a token into a URL
(`?token=...`, or any other parameter) must not find it in a log file. A record's string arguments (a path, a
name, anything a client sent) are written with their control characters escaped (core/escape.py `log`): a
newline in them cannot forge a record of its own. `serve` hands uvicorn a logging
config with this filter (`uvicorn_log_config`) and adds it to the root handlers.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Iterable

from core import escape

MASK = "[redacted]"


def _strip_query(path: str) -> str:
    head, sep, _ = path.partition("?")
    return f"{head}?{MASK}" if sep else head


class SecretFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def _clean(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        access = record.name == "uvicorn.access"
        if isinstance(record.args, tuple) and record.args:
            args = list(record.args)
            if access and len(args) >= 3 and isinstance(args[2], str):  # (client, method, full_path, version, status)
                args[2] = _strip_query(args[2])
            record.args = tuple(self._clean(escape.log(a)) if isinstance(a, str) else a for a in args)
        elif isinstance(record.args, dict):
            record.args = {k: self._clean(escape.log(v)) if isinstance(v, str) else v for k, v in record.args.items()}
        if isinstance(record.msg, str):
            record.msg = self._clean(record.msg)
        if record.exc_info and not record.exc_text:  # a traceback's text may quote a secret too
            record.exc_text = self._clean(logging.Formatter().formatException(record.exc_info))
        return True


def uvicorn_log_config(secrets: Iterable[str]) -> dict[str, Any]:
    """uvicorn's own logging config with the filter on each of its handlers."""
    from uvicorn.config import LOGGING_CONFIG  # deferred: uvicorn, only when the server starts

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg.setdefault("filters", {})["secrets"] = {"()": SecretFilter, "secrets": list(secrets)}
    for h in cfg["handlers"].values():
        h.setdefault("filters", []).append("secrets")
    return cfg


def install(secrets: Iterable[str]) -> SecretFilter:
    """Add the filter to every handler of the root logger (those of `logging.basicConfig`)."""
    f = SecretFilter(secrets)
    for h in logging.getLogger().handlers:
        h.addFilter(f)
    return f
