"""Against a real `tuneloop sim serve` process: the openai client streams; the load generator's figures
agree with the virtual-time run and with the server's own ground truth; faults map to verdicts;
a load killed halfway leaves a summarisable raw file."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from ports_support import free_port

from core import records as rec
from core.metrics import end_time, inflight_steps, summarize, window
from core.records import RequestRecord
from executor.collect import STATS_FAULT, CollectionError, collect, summarize_run
from executor.loadgen import LoadConfig, run
from tests.test_loadgen import kill_when_written

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
PROFILE = "llama70b-h100-p2d2"


def start_server(*args, time_scale=4.0):
    port = free_port()
    p = subprocess.Popen([sys.executable, str(ROOT / "tuneloop_cli.py"), "sim", "serve", "--profile", PROFILE,
                          "--scenario-free", "--port", str(port), "--time-scale", str(time_scale), *args], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # bounded: at most ~60 s for the process to import and bind
        if p.poll() is not None:
            raise AssertionError(f"sim serve exited with {p.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return p, url
        except httpx.HTTPError:
            time.sleep(0.1)  # polling the port until it answers
    p.kill()
    raise AssertionError("sim serve never answered /health")


@pytest.fixture(scope="module")
def server():
    p, url = start_server(time_scale=4.0)
    yield url
    p.kill()
    p.wait()


def truth(url) -> list[RequestRecord]:
    return [RequestRecord.model_validate_json(x) for x in httpx.get(url + "/sim/records").text.splitlines()]


def scaled(records, k):
    """Client wall seconds -> virtual seconds (the server runs k virtual seconds per wall second)."""
    return [r.model_copy(update={"t_sched": r.t_sched * k, "t_send": r.t_send * k if r.t_send is not None else None,
                                 "chunk_times": [t * k for t in r.chunk_times]}) for r in records]


def test_openai_client_streams_completions_and_chat(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    chunks, usage = [], None
    for ev in client.completions.create(model=PROFILE, prompt="one two three " * 50, max_tokens=12, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True, "min_tokens": 12}):
        if ev.choices and ev.choices[0].text:
            chunks.append(ev.choices[0].text)
        usage = ev.usage or usage
    assert "".join(chunks).split() == ["tok"] * 12
    assert usage.completion_tokens == 12 and usage.prompt_tokens == 150
    assert usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model=PROFILE, prompt="one two three " * 50, max_tokens=4, stream=False)
    assert again.usage.prompt_tokens_details.cached_tokens == 128  # two 64-word blocks, the rest recomputed
    chat = list(client.chat.completions.create(model=PROFILE, messages=[{"role": "user", "content": "hi there"}],
                                               max_tokens=5, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices).split() == ["tok"] * 5
    assert chat[-1].choices[0].finish_reason == "length"
    assert httpx.post(server + "/tokenize", json={"prompt": "a b c"}).json()["count"] == 3
    assert "tuneloop_sim_requests_total 3" in httpx.get(server + "/metrics").text
    bad = httpx.post(server + "/v1/completions", json={"prompt": "a", "max_tokens": 0})
    assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]


@pytest.mark.quiet  # wall-clock agreement: run alone by `make test`, never beside an engine
def test_http_run_agrees_with_virtual_time_run(server, tmp_path):
    """The client's figures over HTTP agree with the virtual-time run within 5 %. At 4 virtual s per wall s a token
    is 5.5 wall ms apart, so a machine busy with a real engine on the other worker can stretch one run (CI once
    measured TPOT +6 %, 23.1 vs 21.8 ms): the run is measured again, up to 3 times; a client error (a wrong clock,
    a lost chunk) is systematic and fails all three."""
    from core import profiles
    from simulator import engine

    scale, c, r, n = 4.0, 16, 4.0, 64
    ref = engine.simulate(profiles.load(PROFILE), str(DATA / "sim64.yaml"), {"concurrency": c, "request_rate": r},
                          n=n, seed=0)
    want = summarize(ref.records, ref.info)
    tries = []
    for attempt in range(3):
        out = tmp_path / f"try{attempt}"
        run(LoadConfig(endpoint=server, n=n, concurrency=c, request_rate=r * scale), str(DATA / "sim64.yaml"), out,
            cards=ref.cards)
        info, recs = rec.RunInfo.model_validate_json((out / rec.RUN_INFO).read_text()), \
            list(rec.read_jsonl(out / rec.REQUESTS, RequestRecord))
        got = summarize(scaled(recs, scale), info.model_copy(update={"request_rate": r}))
        assert got.n_ok == n  # every request answered, on any machine
        off = {"tpot_ms": got.tpot_ms.mean / want.tpot_ms.mean - 1,
               "output_tok_s": got.whole.output_tok_s / want.whole.output_tok_s - 1}
        if all(abs(v) <= 0.05 for v in off.values()):
            return
        tries.append(f"{ {k: round(v, 4) for k, v in off.items()} } (load average {os.getloadavg()[0]:.1f})")
    pytest.fail("client figures off from the virtual-time run by more than 5 % in 3 runs: " + " | ".join(tries))


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


@pytest.mark.quiet  # wall-clock agreement: run alone by `make test`, never beside an engine
def test_whole_and_native_match_server_ground_truth(tmp_path):
    """The server's own records (virtual seconds, exact emission times) are the ground truth. The whole
    window is the server's own; the native window is the client's, mapped onto the server's clock by the
    events that bound it (the burst of sends that opens it, the completion that closes it), so the truth
    measures the same window in the server's time. A machine stall that lands on a boundary event is
    named in the failure, with the server's own scheduling lag, instead of passing for a client error."""
    busy = []
    for _attempt in range(3):  # a stall of the machine is measured again (other workers share the cores)
        why = _whole_and_native_against_truth(tmp_path / f"try{_attempt}")
        if why is None:
            return
        busy.append(why)
    pytest.fail("machine too busy for a 2 % check in 3 tries: " + " | ".join(busy))


def _whole_and_native_against_truth(tmp_path) -> str | None:
    """None when the client's figures match the server's truth within 2 %; why, when the server's own event loop
    stalled past the budget (the machine, not the client, moved the boundary events); fails on a client error."""
    tmp_path.mkdir()
    scale, c, n = 5.0, 32, 240  # 5 virtual s per wall s: fewer chunks per wall s, so fewer stalls
    p, url = start_server(time_scale=scale)
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
            return (f"no native window ({got.native_reason}) while the server's own event loop stalled "
                    f"{server_lag['max']:.0f} ms > {stall_ms:.0f} ms (2 % of the run); load average "
                    f"{os.getloadavg()[0]:.1f}")
        pytest.fail(f"no native window with a punctual server (lag {server_lag} wall ms): {got.native_reason}")
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
    print("relative errors", {k: round(v, 4) for k, v in errors.items()}, "native counts (client, truth, crossed)",
          counts, "transit lag from median p95, max (wall ms)", jit_ms, "server lag (wall ms)", server_lag)  # pytest -s
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
            return (f"the server's own event loop stalled {server_lag['max']:.0f} ms > {budget_ms:.0f} ms "
                    f"(2 % of the native window); off: {bad}; {detail}")
        pytest.fail(f"client figures off from the server's truth: {bad}; {detail}")
    assert got.native.duration >= 60 and got.native.n_requests >= 128
    return None


def test_truncate_fault_is_a_contract_violation_naming_the_requests(tmp_path):
    p, url = start_server("--fault", "truncate=0.25", time_scale=20.0)
    try:
        run(LoadConfig(endpoint=url, n=24, concurrency=1), str(DATA / "tiny.yaml"), tmp_path)
        cut = sorted(r.id for r in truth(url) if r.finish_reason == "stop")
    finally:
        p.kill()
        p.wait()
    summary, verdict = summarize_run(tmp_path)
    assert cut and verdict.kind == "contract_violation"
    short = next(r for r in verdict.reasons if r.code == "short_output")
    assert short.request_ids == cut and short.count == len(cut)  # C=1: server ids follow the client ids
    assert all(str(i) in short.message for i in cut[:3])


def test_stats_failure_is_a_collection_fault_fixed_by_resummarising(tmp_path):
    from core import profiles
    from simulator import engine
    from simulator.faults import Faults

    sim = engine.simulate(profiles.load(PROFILE), str(DATA / "tiny.yaml"), {"concurrency": 4, "request_rate": 8.0},
                          n=16, seed=1, faults=Faults.parse(["stats_failure"]))
    engine.write_run_dir(sim, tmp_path)
    assert (tmp_path / STATS_FAULT).exists()
    summary, verdict = collect(tmp_path)
    assert summary is None and verdict.kind == "collection_fault" and verdict.reasons[0].code == "statistics_failed"
    summary, verdict = summarize_run(tmp_path)
    assert verdict.valid and summary.n_ok == 16


def test_load_killed_halfway_leaves_summarisable_raw_file(server, tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, str(ROOT / "tuneloop_cli.py"), "load", "run", "--endpoint", server,
                          "--scenario", str(DATA / "sim64.yaml"), "--n", "200", "--concurrency", "8", "--rate", "40",
                          "--out", str(out)], cwd=ROOT)
    assert kill_when_written(p, out / rec.REQUESTS, 6) == -signal.SIGKILL
    done = list(rec.read_jsonl(out / rec.REQUESTS, RequestRecord))
    assert not (out / rec.DONE).exists() and 6 <= len(done) < 200
    summary, verdict = summarize_run(out)
    assert summary.n_ok == len(done) and summary.output_len_min == summary.output_len_max == 256
    assert verdict.kind == "orchestration_fault" and verdict.reasons[0].count == 200 - len(done)
    with pytest.raises(CollectionError):
        summarize_run(tmp_path / "nothing-here")


def test_crash_at_needs_expected_requests_and_crashes_after_that_share():
    bare = subprocess.run([sys.executable, str(ROOT / "tuneloop_cli.py"), "sim", "serve", "--profile", PROFILE,
                           "--port", str(free_port()), "--fault", "crash_at=0.5"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert bare.returncode == 2 and "crash_at=0.5 needs --expected-requests N" in bare.stderr
    p, url = start_server("--fault", "crash_at=0.5", "--expected-requests", "4", time_scale=50.0)
    try:
        for _ in range(2):
            ok = httpx.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 2}, timeout=30)
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        with pytest.raises(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 2}, timeout=30)
        assert p.wait(30) == 137  # the third of 4 expected requests: after 0.5 * 4 were served
    finally:
        p.kill()
        p.wait()
