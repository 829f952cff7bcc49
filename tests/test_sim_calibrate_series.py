"""The calibration uses the engine's own iteration statistics (metrics.jsonl: vllm:iteration_tokens_total and
num_requests_running per scrape interval), not only the per-request records: from records that are not streamed
(each response one chunk after its first token: no per-step information) the decode coefficients are identified
by the batch series alone, within 5 % of the true ones; without the series the same runs cannot be calibrated."""
from __future__ import annotations

import json

import pytest

from core import profiles
from core import records as rec
from core.records import RequestRecord
from executor.evidence import parse_prometheus
from simulator import calibrate_series as series
from simulator import engine
from simulator.cluster import Cluster
from tests.test_sim_calibrate import LLAMA, STATIONS, _calibrate, _runs


def _unstream(d):
    """The requests as a non-streaming client sees them: the first token, then the rest in one chunk."""
    rs = list(rec.read_jsonl(d / rec.REQUESTS, RequestRecord))
    for r in rs:
        r.chunk_times, r.chunk_tokens = [r.chunk_times[0], r.chunk_times[-1]], [1, sum(r.chunk_tokens[1:])]
    (d / rec.REQUESTS).write_text("".join(r.model_dump_json() + "\n" for r in rs))


def test_the_batch_series_alone_identifies_the_decode_coefficients(tmp_path):
    dirs = _runs(tmp_path, n=160)
    for d in dirs:
        _unstream(d)
    proc = _calibrate(dirs, tmp_path / "cal.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    truth = profiles.load(LLAMA).decode_cost
    coeffs = {c["name"]: c for c in got["coefficients"]}
    for k in ("a", "b", "c", "a_draft", "b_draft"):
        c = coeffs[f"decode.{k}"]
        assert c["note"] == "fitted" and c["value"] == pytest.approx(getattr(truth, k), rel=0.05), k
    for r in got["runs"]:
        assert r["decode"] is None  # no per-step row from the records: every decode figure is the series'
        s = r["series"]
        assert s["steps"] >= 20 and s["rms"] < 0.03 and abs(s["mean"]) < 0.01
        assert s["batch_min"] < 0.5 * s["batch_max"]  # the batch moves inside a run: what identifies a from b
    for d in dirs:  # the same runs without their scraped samples: nothing to fit decode from, said so
        (d / rec.METRICS).unlink()
    proc = _calibrate(dirs, tmp_path / "cal2.yaml")
    assert proc.returncode == 2 and series.ITER in proc.stderr and not (tmp_path / "cal2.yaml").exists()


def test_streamed_runs_report_the_series_residuals_beside_the_records(tmp_path):
    dirs = _runs(tmp_path, STATIONS[:2], n=120)
    proc = _calibrate(dirs, tmp_path / "cal.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    for r in json.loads(proc.stdout)["runs"]:
        assert r["decode"]["steps"] > 100 and r["series"]["steps"] >= 10 and r["series"]["rms"] < 0.03
    text = _calibrate(dirs, tmp_path / "cal.yaml").stdout
    assert text.count("series ") >= 2 and " B " in text


def test_the_simulator_exports_vllm_iteration_tokens_as_vllm_does():
    p = profiles.load(LLAMA)
    run = engine.simulate(p, "chat2k", p.knobs({"max_num_seqs": 8}, start=True), n=24)
    last = {s.instance: s.values for s in run.samples if s.role == "decode"}
    for v in last.values():  # generated tokens per step: every step's batch, counted once
        n, tot = v[f"{series.ITER}_count"], v[f"{series.ITER}_sum"]
        assert 0 < n <= tot <= 8 * n and v[f'{series.ITER}_bucket{{le="+Inf"}}'] == n
    cl = Cluster(p, p.knobs({"max_num_seqs": 8}, start=True), seed=0)
    text = parse_prometheus(cl.metrics_text())
    assert any(k.startswith(f"{series.ITER}_count{{") and 'role="decode"' in k for k in text)
    assert any(k.startswith(f"{series.ITER}_bucket{{") and 'le="+Inf"' in k and 'engine="0"' in k for k in text)
