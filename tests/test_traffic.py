"""The user's own traffic as a scenario (issue 56 item 5): a prompt dataset (ShareGPT JSON, JSONL of prompts and
output lengths) or a trace with arrival times (Mooncake JSONL, BurstGPT CSV), each format read and each bad line
refused naming the file, the line and the reason; a trace replayed on the simulator at its own arrival times (and
stretched to a rate); `tuneloop run` tuning a goal on the shipped trace to a stop. The real engine's replay is
tests/test_llamacpp_traffic.py."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core import profiles, scenarios
from core.datafiles import DataFileError
from core.summary import Contract
from executor.verdict import judge
from simulator import engine
from state.store import Store

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "examples" / "traffic" / "scenarios"
TUNELOOP = [sys.executable, "-c", "from tuneloop_cli import main; main()"]
EXT = {"mooncake": "jsonl", "prompts-jsonl": "jsonl", "burstgpt": "csv", "sharegpt": "json"}


def scenario(folder: Path, fmt: str, text: str, name: str = "mine", **source) -> Path:
    """A scenario YAML and its source file (`mine.<ext>`) in `folder`; the YAML's path."""
    ext = EXT[fmt]
    (folder / f"{name}.{ext}").write_text(text)
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "version": 1, "source": {"file": f"{name}.{ext}", "format": fmt,
                                                                          **source}}))
    return p


def test_the_shipped_mooncake_trace_is_read_with_its_times_lengths_and_prefix_blocks():
    s = scenarios.load(str(SAMPLES / "mooncake-sample.yaml"))
    lines = [json.loads(x) for x in (SAMPLES / "mooncake-sample.jsonl").read_text().splitlines()]
    assert isinstance(s, scenarios.Traffic) and len(s.rows) == len(lines) >= 30
    assert [(r.t, r.n_in, r.n_out, r.blocks) for r in s.rows] == [
        (x["timestamp"] / 1000, x["input_length"], x["output_length"], tuple(x["hash_ids"])) for x in lines]
    specs = scenarios.generate(s, 3, warmup=0)
    a, b = (specs[0].prompt(s).split(), specs[2].prompt(s).split())
    assert len(a) == lines[0]["input_length"] and len(b) == lines[2]["input_length"]
    ids_a, ids_b = lines[0]["hash_ids"], lines[2]["hash_ids"]
    shared = next(j for j, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)  # leading hash ids both carry
    assert shared and a[:512 * shared] == b[:512 * shared] and a[512 * shared:][:8] != b[512 * shared:][:8]
    assert s.source.sha256 and s.source.sha256 in s.model_dump_json() and s.zero_cache is False


def test_the_shipped_burstgpt_log_leaves_out_its_failed_requests():
    s = scenarios.load(str(SAMPLES / "burstgpt-sample.yaml"))
    rows = list(csv.DictReader((SAMPLES / "burstgpt-sample.csv").open()))
    kept = [r for r in rows if int(r["Response tokens"]) and int(r["Request tokens"])]
    assert len(kept) < len(rows) and len(s.rows) == len(kept)
    assert [(r.n_in, r.n_out) for r in s.rows] == [(int(r["Request tokens"]), int(r["Response tokens"])) for r in kept]
    assert s.rows[0].t == float(kept[0]["Timestamp"]) and not s.source.replays_times  # the sample says timing: rate


def test_the_datasets_keep_their_prompts_and_take_the_output_length(tmp_path):
    share = [{"id": "a", "conversations": [{"from": "human", "value": "why is the sky blue"},
                                           {"from": "gpt", "value": "because of Rayleigh scattering of light"}]},
             {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},  # no reply: left out
             {"id": "c", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"},
                                           {"from": "human", "value": "more"}]}]
    s = scenarios.load(str(scenario(tmp_path, "sharegpt", json.dumps(share, indent=1))))
    assert [(r.text, r.n_in, r.n_out) for r in s.rows] == [("why is the sky blue", 5, 6), ("hi", 1, 2)]
    specs = scenarios.generate(s, 3)
    assert [x.prompt(s) for x in specs] == ["why is the sky blue", "hi", "why is the sky blue"]  # wraps round
    assert scenarios.send_times(s, 3, 2.0) == [0.0, 0.5, 1.0]  # no times in a dataset: the run's arrivals
    jl = '{"prompt": "one two three", "output_len": 7}\n\n{"prompt": "four", "output_len": 1, "extra": true}\n'
    s = scenarios.load(str(scenario(tmp_path, "prompts-jsonl", jl, name="jl")))
    assert [(r.text, r.n_in, r.n_out, r.t) for r in s.rows] == [("one two three", 3, 7, None), ("four", 1, 1, None)]
    # on the simulator a dataset's prompts share what their words share: the second finds the first's 192 words cached
    system = " ".join(f"rule{i}" for i in range(192))
    jl = "".join(json.dumps({"prompt": f"{system} question {q}", "output_len": 4}) + "\n" for q in ("a", "b"))
    s = scenarios.load(str(scenario(tmp_path, "prompts-jsonl", jl, name="shared")))
    prof = profiles.load("llama31-8b-l40s-p1d1")
    run = engine.simulate(prof, s, prof.knobs({"request_rate": 1.0}, start=True), n=2, observe=False)
    assert [r.n_cached for r in sorted(run.records, key=lambda r: r.id)] == [0, 192]


SECRET = "s3cr3t-token"
BAD = [  # format, file text, the line and reason the refusal must name
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                 f'{{"timestamp": 5, "input_length": 10, "note": "{SECRET}"}}\n', "line 2: output_length: missing"),
    ("mooncake", '{"timestamp": 9, "input_length": 10, "output_length": 2}\n\n'
                 '{"timestamp": 3, "input_length": 10, "output_length": 2}\n', "line 3: timestamp: goes back in time"),
    ("mooncake", '{"timestamp": 0, "input_length": 0, "output_length": 2}\n', "line 1: input_length: must be an integer >= 1"),
    ("mooncake", '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2, 3]}\n',
     "line 1: hash_ids: 3 blocks of 512 tokens are more than input_length holds"),
    ("mooncake", f'{{"timestamp": 0, "input_length": 600, "output_length": 2}}\n{{{SECRET}\n', "line 2: not valid JSON"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 f"1.5,ChatGPT,10,20,30,API log\n2.0,ChatGPT,{SECRET},3,4,API log\n", "line 3: Request tokens: must be"),
    ("burstgpt", "time,tokens\n1,2\n", "line 1: header: no column ['Timestamp', 'Request tokens', 'Response tokens']"),
    ("sharegpt", '[\n {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},\n'
                 f' {{"id": "{SECRET}"}}\n]\n', "line 3: conversations: missing or not a list"),
    ("sharegpt", '[{"conversations": []},\n', "line 2: the array is not closed"),
    ("prompts-jsonl", '{"prompt": "a b", "output_len": 3}\n{"prompt": "c", "output_len": 0}\n',
     "line 2: output_len: must be an integer >= 1"),
    ("prompts-jsonl", f'{{"prompt": "", "output_len": 3, "k": "{SECRET}"}}\n', "line 1: prompt: missing, not a string or empty"),
]


@pytest.mark.parametrize("fmt,text,why", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_line_is_refused_naming_the_file_the_line_and_the_reason_never_its_content(tmp_path, fmt, text, why):
    p = scenario(tmp_path, fmt, text)
    with pytest.raises(DataFileError) as e:
        scenarios.load(str(p))
    msg = str(e.value)
    assert f"scenario {str(p)!r}: mine.{EXT[fmt]} {why}" in msg, msg
    assert SECRET not in msg


def test_the_scenario_file_itself_is_refused_where_it_cannot_be_a_replay(tmp_path):
    ok = '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
    cases = {  # what the scenario YAML says -> what the refusal names
        "input_len: 5": "input_len: a scenario with a source takes its lengths and prefixes from the file",
        "source: {file: ../mine.jsonl, format: mooncake}": "source.file",
        "source: {file: mine.jsonl, format: sharegpt, timing: trace}": "timing: trace needs arrival times",
        "source: {file: mine.jsonl, format: csv}": "source.format",
        "source: {file: other.jsonl, format: mooncake}": "source.file 'other.jsonl': no such file beside the scenario",
        f"source: {{file: mine.jsonl, format: mooncake, sha256: '{'0' * 64}'}}": "the file changed",
    }
    for i, (line, why) in enumerate(cases.items()):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "mine.jsonl").write_text(ok)
        body = "name: mine\nversion: 1\n" + (line if line.startswith("source") else
                                             f"{line}\nsource: {{file: mine.jsonl, format: mooncake}}") + "\n"
        (d / "mine.yaml").write_text(body)
        with pytest.raises(DataFileError, match=why.replace("(", r"\(").replace("[", r"\[")):
            scenarios.load(str(d / "mine.yaml"))
    # a symlink beside the scenario that leads out of its folder is no file beside it
    out = tmp_path / "elsewhere.jsonl"
    out.write_text(ok)
    (tmp_path / "0" / "link.jsonl").symlink_to(out)
    (tmp_path / "0" / "mine.yaml").write_text("name: mine\nversion: 1\nsource: {file: link.jsonl, format: mooncake}\n")
    with pytest.raises(DataFileError, match="no such file beside the scenario"):
        scenarios.load(str(tmp_path / "0" / "mine.yaml"))


def test_a_replay_on_the_simulator_sends_at_the_traces_times_with_its_lengths_and_shared_prefixes():
    s = scenarios.load(str(SAMPLES / "mooncake-sample.yaml"))
    prof = profiles.load("llama31-8b-l40s-p1d1")
    m = len(s.rows)
    run = engine.simulate(prof, s, prof.knobs({}, start=True), n=m + 3, warmup=2, observe=False)
    formal = sorted((r for r in run.records if not r.warmup), key=lambda r: r.id)
    start = formal[0].t_sched
    span = s.rows[-1].t - s.rows[0].t
    want = [r.t for r in s.rows] + [span + span / (m - 1) + s.rows[j].t for j in range(3)]  # then the trace again
    assert [round(r.t_sched - start, 9) for r in formal] == [round(t, 9) for t in want]
    assert all(r.t_send >= r.t_sched for r in formal)
    rows = [s.rows[j % m] for j in range(m + 3)]
    assert [(r.n_in, r.n_out, r.n_out_expected) for r in formal] == [(x.n_in, x.n_out, x.n_out) for x in rows]
    # requests whose leading hash ids an earlier one carried find those blocks in the prefix cache
    assert sum(1 for r in formal if r.n_cached) >= m // 2
    assert run.info.output_len is None and judge(run.records, run.info, Contract(output_len=None)).kind == "valid"
    cut = formal[0].model_copy(update={"n_out": formal[0].n_out - 1})  # one output short of its trace line
    bad = judge([cut if r.id == cut.id else r for r in run.records], run.info, Contract(output_len=None))
    assert bad.kind == "contract_violation" and "shorter than the request's own output length" in bad.reasons[0].message
    # the same trace twice as fast, and stretched to a rate of 10 req/s
    fast = s.model_copy(update={"source": s.source.model_copy(update={"speed": 2.0})})
    fast._rows = s.rows
    assert scenarios.send_times(fast, m, 1.0) == pytest.approx([t / 2 for t in want[:m]])
    rate = s.model_copy(update={"source": s.source.model_copy(update={"timing": "rate"})})
    rate._rows = s.rows
    times = scenarios.send_times(rate, m, 10.0)
    assert times[-1] == pytest.approx((m - 1) / 10.0) and times == pytest.approx([t * times[-1] / span for t in want[:m]])


def tuneloop(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    return subprocess.run(TUNELOOP + list(args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_loop_tunes_a_goal_on_the_replayed_trace_to_a_stop(tmp_path):
    goal = ROOT / "examples" / "goal-trace.yaml"
    db = f"sqlite:///{tmp_path / 't.db'}"
    refused = tuneloop(tmp_path, "run", str(goal), "--db", db)  # the scenario is a name in a data directory
    assert refused.returncode == 2 and "no scenario named 'mooncake-sample'" in refused.stderr
    p = tuneloop(tmp_path, "run", str(goal), "--db", db, "--auto-approve", "--data-dir", str(ROOT / "examples" / "traffic"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("[")][-1].startswith("[stop]")
    st = Store(db)
    try:
        goal_ids = {r.goal_id for r in st.runs()}  # (st.goals() would validate the spec, whose scenario is this
        assert len(goal_ids) == 1                  # test's data directory's, not the pytest process's)
        results = st.results(goal_ids.pop())
        assert len(results) >= 2 and all(r.valid for r in results), [r.verdict for r in results]
        trace = scenarios.load(str(SAMPLES / "mooncake-sample.yaml"))
        run_dirs = sorted((tmp_path / "runs").rglob("requests.jsonl"))
        assert run_dirs
        info = json.loads((run_dirs[0].parent / "run.json").read_text())
        assert info["scenario"] == "mooncake-sample" and info["data_version"] == trace.data_version
        formal = sorted((json.loads(x) for x in run_dirs[0].read_text().splitlines()), key=lambda r: r["id"])
        formal = [r for r in formal if not r["warmup"]]
        t0 = formal[0]["t_sched"]
        assert [round(r["t_sched"] - t0, 9) for r in formal[:len(trace.rows)]] == [round(r.t, 9) for r in trace.rows]
    finally:
        st.close()
    report = Path(next(ln for ln in p.stdout.splitlines() if ln.startswith("report: ")).removeprefix("report: "))
    md = (report if report.is_absolute() else tmp_path / report).with_suffix(".md").read_text()
    assert f"mooncake file mooncake-sample.jsonl, {len(trace.rows)} requests" in md
