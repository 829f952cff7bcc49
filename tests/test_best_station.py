"""Issue 56 items 3 and 4 on a goal that is not the demo's: goodput under TTFT p99 and TPOT p99 limits on
`llama70b-h100-p2d2` (the chat2k scenario, E2E p99 reported), run through the CLI as a user runs it.

* Restore is exact: the `tuneloop restore` command the run prints, pasted as it is, brings the best station back on
  the goal's own profile (`identical: true`); a restore on another profile answers `identical: false` and says what
  differs.
* The engine's own command for the best station (and the frontier's): `tuneloop best`, the report and the API give
  the launch the executor renders for the profile's deployment (vLLM P2+D2 with its router), shell-quoted: run by a
  real shell it hands each program exactly the rendered argv and environment, and vLLM's own `vllm serve` parser
  takes every engine line.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engine_command_support import through_a_shell

from core import profiles
from core.station import Station
from executor.engine_command import of_profile, profile_target
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.templates import render
from state.store import Store

TUNELOOP = Path(sys.executable).with_name("tuneloop")
PROFILE = "llama70b-h100-p2d2"
GOAL = {
    "name": "goodput-p99-restore", "engine": "sim", "target": "sim", "sim_profile": PROFILE, "scenario": "chat2k",
    "objective": {"metric": "goodput", "window": "whole"},
    "constraints": {"ttft_p99_ms_lt": 2000, "tpot_p99_ms_lt": 35, "all_succeed": True, "output_len": 512},
    "reported": ["e2e_p99_ms"],
    "start_knobs": {"max_num_seqs": 32, "concurrency": 32},
    "search_space": {"max_num_seqs": [32, 64], "concurrency": [32, 64]},
    "protocol": {"screen_n": 80, "confirm_n": 160},
    "authorisation": {"hot": "auto", "restart": "auto"},
    "budget": {"card_hours": 50, "experiments": 2},
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """`tuneloop run` of the goal in a fresh folder: (folder, environment, the run's output, store URL, goal id)."""
    cwd = tmp_path_factory.mktemp("restore")
    (cwd / "goal.yaml").write_text(yaml.safe_dump(GOAL))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    env |= {"TUNELOOP_RUNS_ROOT": str(cwd / "runs"), "PATH": f"{TUNELOOP.parent}{os.pathsep}{env.get('PATH', '')}"}
    url = f"sqlite:///{cwd / 't.db'}"
    proc = subprocess.run([str(TUNELOOP), "run", "goal.yaml", "--db", url, "--auto-approve", "--no-twin"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    st = Store(url)
    try:
        (goal,) = st.goals()
    finally:
        st.close()
    return cwd, env, proc.stdout, url, goal.id


def test_the_printed_restore_brings_a_non_demo_goals_best_back_identical(ran):
    cwd, env, out, _, _ = ran
    m = re.search(r"best station ([0-9a-f]{16}): restore with `(tuneloop restore [^`]+)`", out)
    assert m, out[-2000:]
    proc = subprocess.run(m.group(2), shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert (got["station"], got["identical"], got["differs"], got["healthy"]) == (m.group(1), True, {}, True), got
    rendered = json.loads((cwd / "runs" / got["run_id"] / "rendered.json").read_text())
    argv = rendered["services"][0]["argv"]
    assert argv[argv.index("--profile") + 1] == PROFILE  # the goal's own profile, not the built-in target's


def test_a_restore_on_another_profile_answers_not_identical_and_says_what_differs(ran):
    """An executor whose `sim` target is the built-in one (another profile) restores the station, and says so."""
    cwd, _, _, url, gid = ran
    st = Store(url)
    try:
        best = st.best_station(gid)
        ex = Executor(st, None, ExecSettings.from_env(runs_root=str(cwd / "runs")))
        got = ex.restore(best.hash)
    finally:
        st.close()
    assert got["identical"] is False and set(got["differs"]) == {"source_identity"}, got
    frozen, restored = got["differs"]["source_identity"]
    assert f"profile={PROFILE}" in frozen and "profile=dsv4-flash-910c-p8d8" in restored


@pytest.fixture(scope="module")
def best_json(ran) -> dict:
    """`tuneloop best GOAL --frontier --json`."""
    cwd, env, _, url, gid = ran
    proc = subprocess.run([str(TUNELOOP), "best", gid, "--db", url, "--frontier", "--json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_tuneloop_best_prints_the_engine_command_the_executor_renders(ran, best_json, tmp_path):
    """The best station's command is the vLLM adapter's own launch of the profile's deployment for the station's
    knobs: a real shell runs each line and hands the program exactly the rendered argv and environment."""
    cwd, _, _, url, gid = ran
    got = best_json
    best = got["stations"][0]
    st = Store(url)
    try:
        station = st.best_station(gid)
    finally:
        st.close()
    assert best["best"] and best["station"] == station.hash and best["engine"] == "vllm" and best["error"] is None
    assert got["restore"].startswith(f"tuneloop restore {station.hash} ")
    target = profile_target(profiles.load(PROFILE), station.knobs)
    rendered = render(target, Station(engine="vllm", knobs=station.knobs, scenario=station.scenario,
                                      data_version=station.data_version, source_identity=station.source_identity,
                                      target=target.name))
    assert [s["name"] for s in best["services"]] == ["prefill-0", "prefill-1", "decode-0", "decode-1", "router-0"]
    for svc, want in zip(best["services"], rendered.services):
        assert through_a_shell(svc["shell"], tmp_path) == (list(want.argv), want.env), svc["name"]
    assert station.knobs["max_num_seqs"] == int(_flag(rendered.services[2].argv, "--max-num-seqs"))
    assert all(x["station"] for x in got["stations"]) and len({x["station"] for x in got["stations"]}) == len(
        got["stations"])


def test_vllms_own_parser_takes_every_engine_line_of_the_best_station(ran, best_json):
    from vllm_support import parse_with_vllm

    from executor.engines.vllm_setup import vllm_binary

    try:
        python = str(Path(vllm_binary()).parent / "python")
    except FileNotFoundError as e:
        from unavailable import missing

        missing(f"vllm is not installed: {e} (make vllm)")
    cwd, _, _, url, gid = ran
    engines = [s for s in best_json["stations"][0]["services"] if s["role"] != "router"]
    argvs = [shlex.split(s["shell"].splitlines()[-1]) for s in engines]
    argvs = [a[a.index("vllm") + 1:] for a in argvs]  # after the environment: `serve MODEL --flag ...`
    verdicts = parse_with_vllm(python, argvs)
    assert all(v["ok"] and not v["inexact"] for v in verdicts), verdicts
    st = Store(url)
    try:
        seqs = st.best_station(gid).knobs["max_num_seqs"]
    finally:
        st.close()
    assert [v["args"]["max_num_seqs"] for s, v in zip(engines, verdicts) if s["role"] == "decode"] == [seqs, seqs]


def test_the_report_shows_the_engine_command_section(ran):
    from agent.report import render_report

    cwd, _, _, url, gid = ran
    st = Store(url)
    try:
        paths = render_report(st, gid, cwd / "report", base=cwd)
    finally:
        st.close()
    md = paths.markdown.read_text()
    section = md[md.index("The engine's own command"):]
    assert "vllm serve meta-llama/Meta-Llama-3-70B-Instruct" in section and "vllm-router" in section
    assert "engine-command best" in paths.html.read_text()


def test_a_static_expert_layout_and_a_pd_proxy_come_with_the_operators_placeholders():
    """dsv4 on vLLM-Ascend: the expert map's recorder and fitter and the proxy's checkout are the operator's, named."""
    knobs = profiles.load("dsv4-flash-910c-p8d8").knobs(start=True)
    cmd = of_profile("dsv4-flash-910c-p8d8", {"hash": "h", "knobs": knobs, "scenario": "copy16k-zero-cache",
                                               "data_version": "d", "source_identity": "s"})
    assert cmd.error is None and cmd.engine == "vllm-ascend", cmd.error
    text = cmd.text()
    assert "YOUR_EXPERT_MAP_FITTER" in text and "YOUR_VLLM_ASCEND_SOURCE/" in text and "# note: " in text
    missing = of_profile("llamacpp-cpu-tiny", {"hash": "h", "knobs": {}, "scenario": "s", "data_version": "d",
                                               "source_identity": "s"})
    assert missing.error and "deployment" in missing.error and missing.text().startswith("# no engine command:")


def _flag(argv, flag: str) -> str:
    return argv[list(argv).index(flag) + 1]
