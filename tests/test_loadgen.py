"""The load generator against a real streaming server process (executor.mockserver), and its SSE parser."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from core import records as rec
from executor.collect import summarize_run
from executor.loadgen import LoadConfig, run, schedule
from executor.sse import SSEParser

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")


def start_mock(*args):
    p = subprocess.Popen([sys.executable, "-m", "executor.mockserver", "--port", "0", *args], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # blocks until the server has bound its port (or died)
    assert line.startswith("PORT "), f"mock server did not start: {line!r}"
    return p, f"http://127.0.0.1:{int(line.split()[1])}"


@pytest.fixture
def mock(request):
    p, url = start_mock(*getattr(request, "param", ()))
    yield url
    p.kill()
    p.wait()


# --- SSE parsing -------------------------------------------------------------------------------------

STREAM = ('data: {"choices":[{"text":"中文 é"}]}\r\n\r\n: keep-alive comment\n\n'
          'data: {"a":\ndata: 1}\n\ndata: [DONE]\n\n').encode()


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_sse_parser_survives_any_split(step):
    p, got = SSEParser(), []
    for i in range(0, len(STREAM), step):
        got += p.feed(STREAM[i:i + step])
    got += p.close()
    assert got == ['{"choices":[{"text":"中文 é"}]}', '{"a":\n1}', "[DONE]"]


def test_sse_parser_flushes_unterminated_last_event():
    p = SSEParser()
    assert p.feed(b"data: x") == [] and p.close() == ["x"]


# --- arrival processes ------------------------------------------------------------------------------

def test_schedules():
    assert schedule(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert schedule(3, math.inf) == [0.0, 0.0, 0.0]
    po = schedule(4000, 10.0, "poisson", seed=1)
    assert po[-1] / 3999 == pytest.approx(0.1, rel=0.06) and po == schedule(4000, 10.0, "poisson", seed=1)
    ga = schedule(4000, 10.0, "gamma", burstiness=0.25, seed=1)
    gaps = [b - a for a, b in zip(ga, ga[1:])]
    mean = sum(gaps) / len(gaps)
    cv2 = sum((g - mean) ** 2 for g in gaps) / len(gaps) / mean ** 2
    assert mean == pytest.approx(0.1, rel=0.1) and cv2 == pytest.approx(4.0, rel=0.25)  # CV^2 = 1/shape


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.5), ("constant", 1.0)])
def test_sent_schedule_matches_the_virtual_time_run(mock, tmp_path, arrival, burstiness):
    """Same seed, same arrival process: the load generator means to send exactly when the simulator sends."""
    from core import profiles
    from simulator import engine

    n, rate, seed = 12, 400.0, 5
    sim = engine.simulate(profiles.load("llama70b-h100-p2d2"), TINY, {"concurrency": 64, "request_rate": rate}, n=n,
                          seed=seed, arrival=arrival, burstiness=burstiness)
    sim_t = sorted(r.t_sched for r in sim.records if not r.warmup)
    run(LoadConfig(endpoint=mock, n=n, concurrency=64, request_rate=rate, arrival=arrival, burstiness=burstiness,
                   seed=seed), TINY, tmp_path)
    mine = sorted(r.t_sched for r in rec.read_jsonl(tmp_path / rec.REQUESTS, rec.RequestRecord))
    assert [t - mine[0] for t in mine] == pytest.approx([t - sim_t[0] for t in sim_t], abs=1e-9)
    assert len(set(round(t, 9) for t in mine)) == n  # really spaced, not all at once
    other = schedule(n, rate, arrival, burstiness, seed + 1)
    assert arrival == "constant" or other != schedule(n, rate, arrival, burstiness, seed)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="arrival='burst'"):
        LoadConfig(endpoint="http://x", n=1, concurrency=1, arrival="burst").check()
    with pytest.raises(ValueError, match="concurrency=0"):
        LoadConfig(endpoint="http://x", n=1, concurrency=0).check()


# --- against a real streaming server ----------------------------------------------------------------

@pytest.mark.parametrize("api", ["completions", "chat"])
def test_run_writes_records_usage_and_done(mock, tmp_path, api):
    rc = run(LoadConfig(endpoint=mock, n=12, concurrency=4, request_rate=200.0, warmup=2, api=api), TINY, tmp_path)
    assert rc == 0 and json.loads((tmp_path / rec.DONE).read_text()) == {"rc": 0}
    recs = list(rec.read_jsonl(tmp_path / rec.REQUESTS, rec.RequestRecord))
    assert sorted(r.id for r in recs) == list(range(14)) and sum(r.warmup for r in recs) == 2
    r = recs[-1]
    assert r.ok and r.n_out == 16 and r.n_in == 96 and r.n_cached == 0 and r.finish_reason == "length"
    assert len(r.chunk_times) == 16 and r.chunk_tokens == [1] * 16  # usage-only chunk is not a token event
    assert all(x.t_send >= x.t_sched for x in recs)
    summary, verdict = summarize_run(tmp_path)
    assert verdict.valid and summary.n_formal == 12 and summary.whole.output_tokens == 12 * 16


@pytest.mark.parametrize("mock", [("--fail-every", "3", "--http-error-every", "5")], indirect=True)
def test_stream_and_http_errors_recorded_per_request(mock, tmp_path):
    run(LoadConfig(endpoint=mock, n=15, concurrency=1), TINY, tmp_path)
    recs = list(rec.read_jsonl(tmp_path / rec.REQUESTS, rec.RequestRecord))
    bad = [r for r in recs if not r.ok]
    assert {r.error.split(":")[0] for r in bad} == {"stream error", "HTTP 500"}
    assert sum(r.http_status == 500 for r in bad) == 3 and len(bad) == 3 + 4  # 5,10,15 -> 500; 3,6,9,12 -> error
    _, verdict = summarize_run(tmp_path)
    fr = next(x for x in verdict.reasons if x.code == "failed_requests")
    assert verdict.kind == "contract_violation" and fr.count == 7


@pytest.mark.parametrize("mock", [("--barrier", "150",)], indirect=True)
def test_pool_reaches_c_above_httpx_default_100(mock, tmp_path):
    # the server holds every stream until 150 are open at once; a pool capped at 100 never gets there
    run(LoadConfig(endpoint=mock, n=150, concurrency=150), TINY, tmp_path)
    text = httpx.get(mock + "/metrics").text
    assert "mock_max_inflight 150" in text


def kill_when_written(p: subprocess.Popen, path: Path, lines: int) -> int:
    """SIGKILL `p` once `path` holds `lines` records (polling the file, not waiting for time to pass); its status."""
    try:
        while p.poll() is None:
            if path.exists() and path.read_text().count("\n") >= lines:
                os.kill(p.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        return p.wait(30)
    finally:
        p.kill()


@pytest.mark.parametrize("mock", [("--itl-ms", "20",)], indirect=True)  # 400 requests take seconds: killed mid-run
def test_sigkill_mid_run_leaves_summarisable_raw_file(mock, tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "executor.loadcli", "run", "--endpoint", mock, "--scenario", TINY,
                          "--n", "400", "--concurrency", "4", "--out", str(out)], cwd=ROOT)
    assert kill_when_written(p, out / rec.REQUESTS, 8) == -signal.SIGKILL  # some requests finished, then no warning
    assert not (out / rec.DONE).exists()
    lines = list(rec.read_jsonl(out / rec.REQUESTS, rec.RequestRecord))  # a torn last line is skipped
    assert 8 <= len(lines) < 400
    summary, verdict = summarize_run(out)
    assert summary.n_ok == summary.n_formal == len(lines) == summary.whole.n_requests
    assert verdict.kind == "orchestration_fault" and verdict.reasons[0].count == 400 - len(lines)


@pytest.mark.parametrize("mock", [("--itl-ms", "2",)], indirect=True)
def test_processes_share_one_budget_and_one_schedule(mock, tmp_path):
    """Two client processes, C=3 between them: the server never sees more than 3 streams at once, and does
    see 3 (a budget split per process would cap at 1 + 1, or allow 3 + 3); every request is sent once, at
    the shared schedule's time."""
    from executor.loadgen import ScenarioPrompts, run_procs

    cfg = LoadConfig(endpoint=mock, n=30, concurrency=3, request_rate=300.0, arrival="poisson", seed=3)
    info = rec.RunInfo(scenario="tiny", scenario_version=1, n=30, concurrency=3, request_rate=300.0, output_len=16)
    assert run_procs(cfg, TINY, tmp_path, info, procs=2) == 0
    assert "mock_max_inflight 3\n" in httpx.get(mock + "/metrics").text
    recs = sorted(rec.read_jsonl(tmp_path / rec.REQUESTS, rec.RequestRecord), key=lambda r: r.id)
    assert [r.id for r in recs] == [s.id for s in ScenarioPrompts(TINY, 30, 0).specs] and all(r.ok for r in recs)
    assert [r.t_sched for r in recs] == schedule(30, 300.0, "poisson", seed=3)
    assert all(r.t_send >= r.t_sched for r in recs)
    summary, verdict = summarize_run(tmp_path)
    assert verdict.valid and summary.n_ok == 30
