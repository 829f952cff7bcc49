"""The load generator's clock against a simulated server's own: how far a client's figures lie from the truth.

`tuneloop sim serve` runs in virtual time at a fixed number of virtual seconds per wall second and keeps its own
records (exact emission times). Two checks, each measured --repeats times in this one invocation, each try's
figures printed, then the median of each figure:

  * http: a load over HTTP (C=16, 4 req/s, 64 requests, 4 virtual s per wall s) against the virtual-time run of the
    same profile and scenario: the client's mean TPOT and whole-window output tok/s within 5 %;
  * native: a closed-loop load (C=32, 240 requests, 5 virtual s per wall s) against the server's own records: the
    whole and native windows' rates within 2 %, the native window's counts up to the events that really crossed a
    boundary in transit, the transit lag's 95th percentile within 2 % of the window.

These are wall-clock figures: a machine busy with other work (a real engine, a test suite) stretches them, which is
why they live here and not in the test suite (tests/test_sim_server.py holds what does not depend on the clock:
every request answered, every token counted, the server's records and the client's the same requests). A try whose
server names its own stall (its event loop's lag above the budget) is reported as the machine's; a try off with a
punctual server is the client's. Exit 1 when the median try is off.

    .venv/bin/python bench/client_accuracy.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core import records as rec  # noqa: E402
from core.metrics import end_time, inflight_steps, summarize, window  # noqa: E402
from core.records import RequestRecord  # noqa: E402
from executor.loadgen import LoadConfig, run  # noqa: E402

DATA = ROOT / "tests" / "data"
PROFILE = "llama70b-h100-p2d2"


def start_server(port: int, *args: str, time_scale: float = 4.0) -> tuple[subprocess.Popen, str]:
    """A `tuneloop sim serve` process on `port` (the caller's port helper picks it) and its URL, once healthy."""
    p = subprocess.Popen([sys.executable, str(ROOT / "tuneloop_cli.py"), "sim", "serve", "--profile", PROFILE,
                          "--scenario-free", "--port", str(port), "--time-scale", str(time_scale), *args], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # bounded: at most ~60 s for the process to import and bind
        if p.poll() is not None:
            raise RuntimeError(f"sim serve exited with {p.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return p, url
        except httpx.HTTPError:
            time.sleep(0.1)  # polling the port until it answers
    p.kill()
    raise RuntimeError("sim serve never answered /health")


def truth(url: str) -> list[RequestRecord]:
    """The server's own records of every request it served (virtual seconds)."""
    return [RequestRecord.model_validate_json(x) for x in httpx.get(url + "/sim/records").text.splitlines()]


def scaled(records, k):
    """Client wall seconds -> virtual seconds (the server runs k virtual seconds per wall second)."""
    return [r.model_copy(update={"t_sched": r.t_sched * k, "t_send": r.t_send * k if r.t_send is not None else None,
                                 "chunk_times": [t * k for t in r.chunk_times]}) for r in records]


def spread(xs: list[float]) -> tuple[float, float, float]:
    """(median, 95th percentile of the distances from it, their max)."""
    med = sorted(xs)[len(xs) // 2]
    d = sorted(abs(x - med) for x in xs)
    return med, d[int(0.95 * (len(d) - 1))], d[-1]


def tie_broken(server_recs, mine):
    """The server's records with its ties (events of one virtual instant, e.g. a decode step that ends
    several requests) broken in the order the client received them: the truth orders nothing within an
    instant, and a window boundary on such an instant must count it the way the client did."""
    got = {int(r.response_id.removeprefix("cmpl-sim")): r.chunk_times[-1] for r in mine}
    span = max(got.values()) + 1.0
    return [r.model_copy(update={"chunk_times": [t + 1e-6 * got.get(r.id, span) / span for t in r.chunk_times]})
            for r in server_recs]


def http_vs_virtual(tmp_path: Path, url: str) -> tuple[dict, str | None]:
    """(figures, None) when the client's mean TPOT and output tok/s over HTTP lie within 5 % of the virtual-time
    run's; (figures, why) when not."""
    from core import profiles
    from simulator import engine

    scale, c, r, n = 4.0, 16, 4.0, 64
    ref = engine.simulate(profiles.load(PROFILE), str(DATA / "sim64.yaml"), {"concurrency": c, "request_rate": r},
                          n=n, seed=0)
    want = summarize(ref.records, ref.info)
    out = tmp_path
    run(LoadConfig(endpoint=url, n=n, concurrency=c, request_rate=r * scale), str(DATA / "sim64.yaml"), out,
        cards=ref.cards)
    info, recs = rec.RunInfo.model_validate_json((out / rec.RUN_INFO).read_text()), \
        list(rec.read_jsonl(out / rec.REQUESTS, RequestRecord))
    got = summarize(scaled(recs, scale), info.model_copy(update={"request_rate": r}))
    if got.n_ok != n:
        return {}, f"client: {got.n_ok} of {n} requests answered"
    off = {"tpot_ms": got.tpot_ms.mean / want.tpot_ms.mean - 1,
           "output_tok_s": got.whole.output_tok_s / want.whole.output_tok_s - 1}
    figures = {k: round(v, 4) for k, v in off.items()}
    return figures, None if all(abs(v) <= 0.05 for v in off.values()) else f"off by more than 5 %: {figures}"


def whole_and_native(tmp_path: Path, port: int) -> tuple[dict, str | None]:
    """(figures, None) when the client's figures match the server's truth within 2 %; (figures, why) when not: why
    says whether the server's own event loop stalled past the budget (the machine, not the client, moved the
    boundary events) or the client is off."""
    tmp_path.mkdir()
    scale, c, n = 5.0, 32, 240  # 5 virtual s per wall s: fewer chunks per wall s, so fewer stalls
    p, url = start_server(port, time_scale=scale)
    try:
        run(LoadConfig(endpoint=url, n=n, concurrency=c), str(DATA / "native.yaml"), tmp_path, cards=8)
        info = rec.RunInfo.model_validate_json((tmp_path / rec.RUN_INFO).read_text())
        mine = scaled(list(rec.read_jsonl(tmp_path / rec.REQUESTS, RequestRecord)), scale)
        server_recs = truth(url)
        server_lag = httpx.get(url + "/sim/info").json()["emit_lag_ms"]
    finally:
        p.kill()
        p.wait()
    got = summarize(mine, info)
    if got.native is None:
        # a stall of the whole machine stretches every request on the server's own clock (CI once saw max E2E
        # 44.9 s where a quiet run has 12.2 s, and the window refused for it): measured again when the server
        # names the stall itself; a refusal with a punctual server is the client's and fails at once
        stall_ms = 0.02 * got.whole.duration / scale * 1e3
        if (server_lag["max"] or 0) > stall_ms:
            return {}, (f"machine: no native window ({got.native_reason}) while the server's own event loop stalled "
                        f"{server_lag['max']:.0f} ms > {stall_ms:.0f} ms (2 % of the run); load average "
                        f"{os.getloadavg()[0]:.1f}")
        return {}, f"client: no native window with a punctual server (lag {server_lag} wall ms): {got.native_reason}"
    want_whole = summarize(server_recs, info).whole
    by_id = {f"cmpl-sim{r.id}": r for r in tie_broken(server_recs, mine)}
    a, b = got.native.start, got.native.end
    # opened by a burst of sends (one per completion that freed a slot): the server reads a burst in any
    # order, so the window opens at the first of them it received; closed by the completion of one request
    a_s = min(by_id[r.response_id].t_send for r in mine if r.t_send >= a)
    closer = next(r for r in mine if r.chunk_times and r.chunk_times[-1] == b)
    b_s = by_id[closer.response_id].chunk_times[-1]
    truth_recs = list(by_id.values())
    want_native = window("native", truth_recs, inflight_steps(truth_recs), a_s, b_s, info.cards, None)
    # (achieved concurrency is not compared: the server sees fewer in flight by every client round trip)
    rates = ("output_tok_s", "output_tok_s_per_card", "duration")
    errors = {(g.kind, f): getattr(g, f) / getattr(w, f) - 1 for g, w, fields in (
        (got.whole, want_whole, rates + ("n_requests", "qps")), (got.native, want_native, rates)) for f in fields}
    # The native window's counts (requests sent, requests completed) are exact only up to the events that cross a
    # boundary in transit: each boundary is one event seen on both clocks, and an event whose own transit lag
    # (client time - server time) differs from the boundary's by more than its distance from the boundary lands
    # inside the window on one clock and outside it on the other. Those crossings are counted per event (its two
    # times against the two windows), so the counts must agree up to the events that really crossed, not up to
    # everything within the run's worst lag of a boundary.
    pairs = [(m, by_id[m.response_id]) for m in mine]

    def inside(t, lo, hi):
        return t is not None and lo <= t <= hi

    crossed_sent = sum(inside(m.t_send, a, b) != inside(s.t_send, a_s, b_s) for m, s in pairs)
    crossed_done = sum((m.ok and inside(end_time(m), a, b)) != (s.ok and inside(end_time(s), a_s, b_s))
                       for m, s in pairs)
    counts = {"n_requests": (got.native.n_requests, want_native.n_requests, crossed_sent),
              "qps": (round(got.native.qps * got.native.duration), round(want_native.qps * want_native.duration),
                      crossed_done)}
    # ... and transit itself must stay small, or a wrong client clock would pass as "crossings": the lag of the
    # bulk of the window's events (the 95th percentile of each kind's distance from its median) within 2 % of it;
    # the opening burst of C connects, before the window, is not among them.
    # The worst few are not held to it: on two shared cores one late connect of a burst took 310 ms wall where
    # the budget was 288, with every figure within 0.6 % (a stall of those few is counted above as crossings).
    send_lags = [m.t_send - s.t_send for m, s in pairs if inside(m.t_send, a, b)]
    end_lags = [end_time(m) - end_time(s) for m, s in pairs if m.ok and inside(end_time(m), a, b)]
    jit = {kind: spread(xs) for kind, xs in (("send", send_lags), ("done", end_lags))}
    jitter = max(v[1] for v in jit.values())
    budget = 0.02 * got.native.duration
    bad = {k: round(v, 4) for k, v in errors.items() if abs(v) > 0.02}
    bad.update({("native", k): f"{g} vs {w} (±{amb} at the boundaries)" for k, (g, w, amb) in counts.items()
                if abs(g - w) > amb})
    jit_ms = {k: [round(x / scale * 1e3, 1) for x in v[1:]] for k, v in jit.items()}
    figures = {"relative_errors": {f"{k[0]}.{k[1]}": round(v, 4) for k, v in errors.items()},
               "native_counts_client_truth_crossed": counts, "transit_lag_p95_max_wall_ms": jit_ms,
               "server_lag_wall_ms": server_lag}
    if bad or jitter > budget:
        # why: a stall of the server's event loop longer than 2 % of the window moves boundary events on the
        # server's side (late emissions, requests read out of order): the machine, not the client, moved them
        budget_ms = budget / scale * 1e3
        med_send, med_end = jit["send"][0], jit["done"][0]
        detail = (f"transit lag vs median at the boundaries (wall ms): opening send "
                  f"{((a - a_s) - med_send) / scale * 1e3:+.1f}, closing token {((b - b_s) - med_end) / scale * 1e3:+.1f}; "
                  f"transit lag p95, max from median {jit_ms} wall ms (budget {budget_ms:.0f} for p95); "
                  f"server scheduling lag (wall ms) {server_lag}; load average {os.getloadavg()[0]:.1f}")
        if (server_lag["max"] or 0) > budget_ms:
            return figures, (f"machine: the server's own event loop stalled {server_lag['max']:.0f} ms > "
                             f"{budget_ms:.0f} ms (2 % of the native window); off: {bad}; {detail}")
        return figures, f"client: figures off from the server's truth: {bad}; {detail}"
    if got.native.duration < 60 or got.native.n_requests < 128:
        return figures, f"client: a native window of {got.native.duration:.0f} s, {got.native.n_requests} requests"
    return figures, None


def main() -> None:
    from executor.ports import free_port

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats: at least 1")
    out: dict[str, list] = {"http": [], "native": []}
    with tempfile.TemporaryDirectory(prefix="client-accuracy-") as tmp:
        p, url = start_server(free_port(), time_scale=4.0)
        try:
            for i in range(args.repeats):
                out["http"].append(http_vs_virtual(Path(tmp) / f"http{i}", url))
        finally:
            p.kill()
            p.wait()
        for i in range(args.repeats):
            out["native"].append(whole_and_native(Path(tmp) / f"native{i}", free_port()))
    worst = 0
    for name, tries in out.items():
        for i, (figures, why) in enumerate(tries):
            print(f"{name} try {i}: {json.dumps(figures)}" + (f" -- {why}" if why else " -- within its limit"))
        off = sum(why is not None for _, why in tries)
        errs = [max(abs(v) for v in f.get("relative_errors", f).values()) for f, _ in tries if f]
        med = statistics.median(errs) if errs else None
        print(f"{name}: {len(tries) - off} of {len(tries)} tries within the limit; median of each try's largest "
              f"relative error {med if med is None else round(med, 4)}; load average {os.getloadavg()[0]:.1f}")
        worst = max(worst, int(off * 2 > len(tries)))
    sys.exit(worst)


if __name__ == "__main__":
    main()
