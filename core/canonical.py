"""The one canonical JSON form of the project's records (stations, cards, goal specs, store rows) and its hash.

JSON-safe: non-finite floats become the strings 'inf' / '-inf' / 'nan' (an infinite request rate is a real
setting, and PostgreSQL's json refuses Infinity), tuples become lists, keys become strings, datetimes ISO text;
keys are sorted. `digest` hashes that form. The planner's knobs digest keeps the spaced JSON layout it was
first written with (`compact=False`), so the run ids derived from it in existing stores stay the same.
"""
from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from typing import Any


def canon(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): canon(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canon(v) for v in obj]
    if isinstance(obj, datetime):
        return obj.isoformat()
    return obj


def dumps(obj: Any, *, compact: bool = True) -> str:
    return json.dumps(canon(obj), sort_keys=True, separators=(",", ":") if compact else None, allow_nan=False)


def digest(obj: Any, length: int = 16, *, compact: bool = True) -> str:
    return hashlib.sha256(dumps(obj, compact=compact).encode()).hexdigest()[:length]
