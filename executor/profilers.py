"""Profile trace analysis that runs on the target: a trace stays where it was written, only this
summary comes back. Stdlib only, so the launcher can run this very file with the target's python:

    python3 profilers.py TRACE_DIR_OR_FILE OUT.json [SINCE_EPOCH_S]

Input: Chrome-trace JSON as the torch profiler writes it (vLLM / SGLang `/start_profile` ..
`/stop_profile`, files `*.json` or `*.json.gz`). Device time over the traced window is split into
    compute        union of device kernels that are not collectives
    communication  collective / copy kernels not hidden under compute (exposed communication)
    scheduling     device idle while the host was busy (scheduler, input preparation, launches)
    idle           device idle with nothing on the host either
per device, summed over devices and files; the four always add up to the window.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import sys
from typing import Any, Iterable

COMM = re.compile(r"nccl|hccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|all2all|alltoall|sendrecv|"
                  r"broadcast|memcpy|cross_device|custom_ar|kv_transfer", re.I)
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver", "python"}
Interval = tuple[float, float]


def _union(iv: Iterable[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(iv: list[Interval]) -> float:
    return sum(b - a for a, b in iv)


def _intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _minus(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """x without y (both unions)."""
    out = []
    for a, b in x:
        cur = a
        for c, d in y:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def summarize_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds per stage and the top kernels of one trace's events (timestamps in microseconds)."""
    devices: dict[Any, dict[str, list[Interval]]] = {}
    host: list[Interval] = []
    kernels: dict[str, float] = {}
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or "ts" not in e:
            continue
        a = float(e["ts"])
        iv = (a, a + float(e["dur"]))
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        if cat in DEVICE_CATS:
            kind = "comm" if (cat != "kernel" or COMM.search(name)) else "compute"
            devices.setdefault(e.get("pid"), {"comm": [], "compute": []})[kind].append(iv)
            kernels[name] = kernels.get(name, 0.0) + float(e["dur"])
        elif cat in HOST_CATS:
            host.append(iv)
    host_u = _union(host)
    sec = {"compute": 0.0, "communication": 0.0, "scheduling": 0.0, "idle": 0.0}
    window = 0.0
    for dev in devices.values():
        comp, comm = _union(dev["compute"]), _union(dev["comm"])
        busy = _union(comp + comm)
        if not busy:
            continue
        span = [(busy[0][0], busy[-1][1])]
        gaps = _minus(span, busy)
        sched = _length(_intersect(gaps, host_u))
        sec["compute"] += _length(comp)
        sec["communication"] += _length(_minus(comm, comp))
        sec["scheduling"] += sched
        sec["idle"] += _length(gaps) - sched
        window += span[0][1] - span[0][0]
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
    return {"devices": sum(1 for d in devices.values() if d["compute"] or d["comm"]),
            "window_s": window / 1e6, "seconds": {k: v / 1e6 for k, v in sec.items()},
            "top_kernels": [{"name": n[:160], "seconds": t / 1e6} for n, t in top]}


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum per-file summaries (one file per rank) and add each stage's share of device time."""
    sec = {k: sum(p["seconds"][k] for p in parts) for k in ("compute", "communication", "scheduling", "idle")}
    total = sum(sec.values())
    kernels: dict[str, float] = {}
    for p in parts:
        for k in p["top_kernels"]:
            kernels[k["name"]] = kernels.get(k["name"], 0.0) + k["seconds"]
    return {"files": len(parts), "devices": sum(p["devices"] for p in parts),
            "window_s": max((p["window_s"] for p in parts), default=0.0), "seconds": sec,
            "share": {k: (v / total if total else 0.0) for k, v in sec.items()},
            "top_kernels": [{"name": n, "seconds": t} for n, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:8]],
            "method": "device-time union per device; exposed communication; host-busy gaps = scheduling"}


def load_trace(path: str) -> list[dict[str, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else list(data)


def trace_files(where: str, since: float = 0.0) -> list[str]:
    """Trace files under `where` written at or after `since` (the window's start on the target's clock)."""
    if os.path.isfile(where):
        return [where]
    out = []
    for base, _, names in os.walk(where):
        out += [os.path.join(base, n) for n in names if n.endswith((".json", ".json.gz"))]
    return sorted(p for p in out if os.path.getmtime(p) >= since)


def analyse(where: str, since: float = 0.0) -> dict[str, Any]:
    files = trace_files(where, since)
    if not files:
        return {"files": 0, "error": f"no trace files (*.json, *.json.gz) under {where} since {since:.3f}"}
    return merge([summarize_events(load_trace(p)) for p in files])


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print("usage: profilers.py TRACE_DIR_OR_FILE OUT.json [SINCE_EPOCH_S]", file=sys.stderr)
        return 64
    summary = analyse(argv[1], float(argv[3]) if len(argv) == 4 else 0.0)
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, argv[2])
    return 0 if summary.get("files") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
