"""`tuneloop run` as a real process: SIGKILLed while waiting and mid-experiment, restarted, approved from the CLI;
plain one-line-per-event output when stdout is not a terminal; a finished goal says so, `--new` starts afresh."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ports_support import free_port

from state.store import Store
from tests.test_loop import goal_file

ROOT = Path(__file__).resolve().parents[1]
TUNELOOP = [sys.executable, "-c", "from tuneloop_cli import main; main()"]


def tuneloop(tmp_path: Path, *args: str, crash_at: str | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_CRASH")} | (env or {})
    env.update({"TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT), "COLUMNS": "300"})
    if crash_at:
        env["TUNELOOP_CRASH_AT"] = crash_at
    return subprocess.run(TUNELOOP + list(args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_killed_run_continues_the_same_goal_without_repeats_or_second_asks(tmp_path):
    goal = goal_file(tmp_path, authorisation={"hot": "ask", "restart": "ask"}, budget={"experiments": 3})
    db = f"sqlite:///{tmp_path / 't.db'}"
    # 1. killed (SIGKILL) just after the loop stopped to ask for the first approval
    p1 = tuneloop(tmp_path, "run", str(goal), "--db", db, crash_at="approval:waiting")
    assert p1.returncode == -signal.SIGKILL, p1.stderr[-2000:]
    st = Store(db)
    try:
        [g] = st.goals()
        [c1] = st.candidates(g.id)
        assert st.approval(c1.id) is None and st.runs(g.id) == []
    finally:
        st.close()
    # 2. a person approves from the CLI; the next run is SIGKILLed in the middle of the load
    ok = tuneloop(tmp_path, "approve", str(c1.id), "--db", db, "--who", "alice")
    assert ok.returncode == 0 and "approved by alice" in ok.stdout
    p2 = tuneloop(tmp_path, "run", str(goal), "--db", db, crash_at="load:mid")
    assert p2.returncode == -signal.SIGKILL, p2.stderr[-2000:]
    assert "waiting" not in p2.stdout  # the approval given before the kill was not asked again
    # 3. restarted: the same goal finishes that experiment and asks only about the next one
    p3 = tuneloop(tmp_path, "run", str(goal), "--db", db)
    assert p3.returncode == 0, p3.stderr[-2000:]
    st = Store(db)
    try:
        assert [x.id for x in st.goals()] == [g.id]  # one goal, continued
        runs = st.runs(g.id)
        assert [r.candidate_id for r in runs] == [c1.id] and runs[0].status == "done"
        assert st.get_result(runs[0].id).verdict == "valid"
        loads = [p for p in st.phases(runs[0].id) if p.phase == "load" and p.event == "outcome" and p.status == "ok"]
        assert len(loads) == 1  # the load finished once
        cands = st.candidates(g.id)
        assert len(cands) == 2 and st.approval(c1.id).who == "alice (cli)"
        c2 = cands[1]
        assert f"waiting: approve candidate {c2.id}" in p3.stdout and st.approval(c2.id) is None
        judged = [d for d in st.decisions(g.id) if d.run_id == runs[0].id and "outcome" in (d.data or {})]
        assert len(judged) == 1
    finally:
        st.close()
    # 4. approve the second, run again: it runs once; the first never runs again
    tuneloop(tmp_path, "approve", str(c2.id), "--db", db, "--who", "bob")
    p4 = tuneloop(tmp_path, "run", str(goal), "--db", db)
    assert p4.returncode == 0, p4.stderr[-2000:]
    st = Store(db)
    try:
        ids = [r.candidate_id for r in st.runs(g.id)]
        assert ids[:2] == [c1.id, c2.id] and len(ids) == len(set(ids))
        keys = [st.get_candidate(i).card["experiment_key"] for i in ids]
        assert len(keys) == len(set(keys))
        asked = [a for a in (st.approval(c.id) for c in st.candidates(g.id)) if a is not None]
        assert sorted(a.who for a in asked)[:2] == ["alice (cli)", "bob (cli)"]  # who, and where from
    finally:
        st.close()


def test_piped_output_one_line_per_event_then_summary_kpis_report_and_a_finished_goal_says_so(tmp_path):
    goal = goal_file(tmp_path, budget={"experiments": 2})
    db = f"sqlite:///{tmp_path / 't.db'}"
    p = tuneloop(tmp_path, "run", str(goal), "--db", db, "--auto-approve")
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "\x1b[" not in out  # no terminal control sequences: nothing is redrawn
    lines = out.splitlines()
    events = [ln for ln in lines if ln.startswith("[")]
    heads = [ln.split()[0] for ln in events]
    assert heads.count("[execute]") == 2 and heads.count("[judge]") == 2 and heads[-1] == "[stop]"
    assert heads.count("[observe]") == 3  # one line per event: two rounds, then the stop check
    after = lines[lines.index(events[-1]) + 1:]
    text = "\n".join(after)
    assert text.startswith("goal ") and "experiment budget spent" in text
    assert "KPIs:" in text and "repeated negatives 0" in text and "share of experiments" in text
    assert "state file: " in text
    report = next(ln for ln in after if ln.startswith("report: ")).removeprefix("report: ")
    assert (tmp_path / report).exists() or Path(report).exists()
    # the same spec again: the goal is finished, nothing runs, the answer points at its results
    again = tuneloop(tmp_path, "run", str(goal), "--db", db, "--auto-approve")
    assert again.returncode == 0 and "already finished" in again.stdout and "--new" in again.stdout
    assert "[execute]" not in again.stdout
    st = Store(db)
    try:
        [g] = st.goals()
        assert len(st.runs(g.id)) == 2 and g.id in again.stdout
    finally:
        st.close()
    fresh = tuneloop(tmp_path, "run", str(goal), "--db", db, "--auto-approve", "--new")
    assert fresh.returncode == 0 and "[execute]" in fresh.stdout
    st = Store(db)
    try:
        goals = st.goals()
        assert len(goals) == 2 and len(st.runs(goals[1].id)) == 2 and len(st.runs(g.id)) == 2
    finally:
        st.close()


def test_piped_run_prints_progress_lines_with_requests_done_during_a_real_load(tmp_path):
    """A local target (a real `tuneloop sim serve` process, real load generator): while the load runs, the
    piped output has [progress] lines naming the run, the phase, requests done / N and the budget."""
    import re
    import yaml

    port = free_port()
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"targets": [{
        "name": "loc", "kind": "local", "engine": "sim", "profile": "dsv4-flash-910c-p8d8", "time_scale": 20,
        "run_root": str(tmp_path / "tgt"), "tuneloop": [sys.executable, "-m", "tuneloop_cli"],
        "hosts": [{"host": "127.0.0.1", "roles": ["mixed", "load"], "cards": 16, "port": port}]}]}))
    goal = goal_file(tmp_path, target="loc", budget={"experiments": 1},
                     protocol={"screen_n": 40, "confirm_n": 60, "native_min_requests": 16, "native_min_seconds": 5})
    env_extra = {"TUNELOOP_PROGRESS_S": "0.1"}
    try:
        p = tuneloop(tmp_path, "run", str(goal), "--db", f"sqlite:///{tmp_path / 't.db'}", "--auto-approve",
                     "--targets", str(targets), env=env_extra)
    finally:  # the loop leaves its best station serving: stop it
        import asyncio

        from executor.targets import load_targets
        from executor.templates import ServiceSpec
        from executor.transports.local import LocalTransport

        svc = ServiceSpec(name="sim-0", role="mixed", host="127.0.0.1", port=port, argv=("true",))
        asyncio.run(LocalTransport(load_targets(targets)["loc"]).stop_service(svc, 10**9))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    progress = [ln for ln in p.stdout.splitlines() if ln.startswith("[progress] ")]
    assert progress, p.stdout[-3000:]
    # the one experiment is the start's reference, at confirm N
    assert all("budget " in ln and " card-h, " in ln and "phase " in ln and "baseline N=60" in ln for ln in progress)
    counts = [tuple(map(int, m.groups())) for ln in progress if (m := re.search(r"requests (\d+)/(\d+)", ln))]
    assert counts and all(total == 60 and 0 <= done <= 60 for done, total in counts), progress
    assert [d for d, _ in counts] == sorted(d for d, _ in counts)  # requests done only grow
    assert any(0 < d < 60 for d, _ in counts), progress  # counted while the load ran, not only at its end


def test_on_a_terminal_the_live_table_has_a_progress_row(tmp_path):
    """Under a pseudo-terminal `tuneloop run` redraws a rich table whose progress row names the running
    experiment (re-read from the store between events, not only when the loop reports one)."""
    import pty
    import re

    goal = goal_file(tmp_path, budget={"experiments": 2})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    env.update({"TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT), "COLUMNS": "200",
                "TERM": "xterm"})
    main, sub = pty.openpty()
    proc = subprocess.Popen(TUNELOOP + ["run", str(goal), "--db", f"sqlite:///{tmp_path / 't.db'}", "--auto-approve"],
                            cwd=tmp_path, env=env, stdin=sub, stdout=sub, stderr=sub)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(300) == 0
    os.close(main)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    rows = [ln for ln in out.splitlines() if re.search(r"│ progress\s+│", ln)]
    assert rows and "\x1b[" in b"".join(chunks).decode(errors="replace")
    assert any("run dsv4-16k-copy-" in ln for ln in rows), rows[-5:]
    assert "(progress not read" not in out and "experiment budget spent" in out
