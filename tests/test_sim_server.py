"""Against a real `tuneloop sim serve` process: the openai client streams; the load generator's records are the
server's requests, token for token; faults map to verdicts; a load killed halfway leaves a summarisable raw file.
How close the client's wall-clock figures lie to the server's virtual-time truth is a measured figure, printed by
bench/client_accuracy.py, never a pass condition here."""
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from ports_support import free_port

from core import records as rec
from core.metrics import summarize
from core.records import RequestRecord
from executor.collect import STATS_FAULT, CollectionError, collect, summarize_run
from executor.loadgen import LoadConfig, run
from tests.test_loadgen import kill_when_written

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "bench"))
from client_accuracy import PROFILE, scaled, truth  # noqa: E402
from client_accuracy import start_server as _start  # noqa: E402


def start_server(*args, time_scale=4.0):
    return _start(free_port(), *args, time_scale=time_scale)


@pytest.fixture(scope="module")
def server():
    p, url = start_server(time_scale=4.0)
    yield url
    p.kill()
    p.wait()


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


def test_http_run_records_every_request_the_server_served(server, tmp_path):
    """The load over HTTP and the virtual-time run of the same profile, scenario and knobs: every request answered,
    every output token counted, and the client's records are the server's requests one for one (its response ids,
    its token counts, its finish reasons). The client's timing against the truth: bench/client_accuracy.py."""
    from core import profiles
    from simulator import engine

    scale, c, r, n = 4.0, 16, 4.0, 64
    ref = engine.simulate(profiles.load(PROFILE), str(DATA / "sim64.yaml"), {"concurrency": c, "request_rate": r},
                          n=n, seed=0)
    before = {x.id for x in truth(server)}  # the module's server has served other tests' requests
    run(LoadConfig(endpoint=server, n=n, concurrency=c, request_rate=r * scale), str(DATA / "sim64.yaml"), tmp_path,
        cards=ref.cards)
    info = rec.RunInfo.model_validate_json((tmp_path / rec.RUN_INFO).read_text())
    mine = list(rec.read_jsonl(tmp_path / rec.REQUESTS, RequestRecord))
    got, want = summarize(scaled(mine, scale), info.model_copy(update={"request_rate": r})), \
        summarize(ref.records, ref.info)
    assert got.n_ok == want.n_ok == n and got.n_failed == 0
    assert got.whole.output_tokens == want.whole.output_tokens and got.output_len_min == got.output_len_max == 256
    served = {f"cmpl-sim{x.id}": x for x in truth(server) if x.id not in before}
    assert sorted(served) == sorted(m.response_id for m in mine)
    for m in mine:
        s = served[m.response_id]
        assert (m.n_out, m.n_in, m.ok) == (s.n_out, s.n_in, s.ok), (m, s)
        # every token arrived (usage above); a server behind its clock may send several in one chunk, never fewer
        # chunks than one
        assert 1 <= len(m.chunk_times) <= len(s.chunk_times) == s.n_out


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
