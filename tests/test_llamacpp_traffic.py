"""A trace of the user's traffic replayed on a real engine (issue 56 item 5): a small Mooncake-format trace sent to
llama.cpp's llama-server by the target-side load generator (`tuneloop load run`, a real process) at the trace's own
arrival times, with each line's output length, and judged valid against each request's own length. The scenario is
named as a goal names it, from a data directory the load generator inherits ($TUNELOOP_DATA_DIRS), as the loop's
load on a local target does."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from test_llamacpp_cache import _serve
from test_llamacpp_loop import _target, engine  # noqa: F401  (engine: shared fixture)

from core import scenarios
from core.station import Station, full_knobs
from executor.templates import render

ROOT = Path(__file__).resolve().parents[1]
TUNELOOP = [sys.executable, "-c", "from tuneloop_cli import main; main()"]
TRACE = [  # timestamp ms, input words, output tokens, prefix blocks (two requests share block 7)
    (0, 24, 4, [7]), (150, 30, 3, [7]), (180, 20, 5, []), (700, 36, 4, [9]), (760, 28, 6, []), (1100, 32, 3, [7])]


def test_a_mooncake_trace_replays_on_llama_server_at_its_own_times(engine, tmp_path):  # noqa: F811
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "tiny-trace.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": ids}) + "\n"
        for t, n_in, n_out, ids in TRACE))
    (folder / "tiny-trace.yaml").write_text(
        "name: tiny-trace\nversion: 1\nsource: {file: tiny-trace.jsonl, format: mooncake}\n")
    tg = _target(engine, tmp_path / "t")
    st = Station(engine="llamacpp", knobs=full_knobs({"parallel": 2, "threads": 1, "ctx_size": 4096,
                                                       "cache_prompt": True}, "llamacpp"),
                 scenario="tiny-trace", data_version="d", source_identity="s", target=tg.name)
    (svc,) = render(tg, st).services
    proc = _serve(list(svc.argv), svc.port)
    run_dir = tmp_path / "run"
    env = os.environ | {"PYTHONPATH": str(ROOT), "TUNELOOP_DATA_DIRS": str(tmp_path)}  # the scenario by name
    try:
        load = subprocess.run(TUNELOOP + ["load", "run", "--endpoint", f"http://127.0.0.1:{svc.port}",
                                          "--scenario", "tiny-trace", "--n", str(len(TRACE)),
                                          "--concurrency", "4", "--out", str(run_dir)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert load.returncode == 0, load.stderr[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    records = sorted((json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()),
                     key=lambda r: r["id"])
    t0 = records[0]["t_sched"]
    assert [round(r["t_sched"] - t0, 9) for r in records] == [t / 1000 for t, *_ in TRACE]
    assert all(r["t_send"] >= r["t_sched"] for r in records)
    assert [(r["ok"], r["n_out"], r["n_out_expected"]) for r in records] == [(True, n, n) for _, _, n, _ in TRACE]
    trace = scenarios.load(str(folder / "tiny-trace.yaml"))
    specs = scenarios.generate(trace, len(TRACE))
    assert [len(s.prompt(trace).split()) for s in specs] == [n for _, n, _, _ in TRACE]
    assert all(r["n_in"] >= n for r, (_, n, _, _) in zip(records, TRACE))  # the engine's tokens, each word one or more
    info = json.loads((run_dir / "run.json").read_text())
    assert info["output_len"] is None and info["data_version"] == trace.data_version
    judged = subprocess.run(TUNELOOP + ["load", "summarize", str(run_dir), "--json"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert judged.returncode == 0, judged.stderr[-2000:]
    assert json.loads(judged.stdout)["verdict"]["kind"] == "valid"
