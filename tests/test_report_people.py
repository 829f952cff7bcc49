"""The report an approver decides from (issue 36 items 7-8): it opens with the answer (best station and knobs, the
gain in both windows, the decisive experiments, the frontier, why it stopped) before any configuration table; it
records every person's decision with who, where, when and why; every station hash it shows resolves, and so does
the one STATE.md's veto line names (GET /stations/<hash>). The goal is driven the way people drive it: cards asked
and answered (one rejected with a reason), a pause and a resume, a budget extension."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent.report import build_report, render
from agent.report.answer import gains, made_best, reference_of
from agent.loop.session import run_session
from state.goal import GoalSpec
from state.kpis import compute_kpis
from state.snapshots import Conditions
from state.statefile import render_state
from state.store import Store

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
REASON = "not on the shared cluster today"


def drive(spec: GoalSpec, url: str) -> str:
    """Run the goal to its end, answering each ask as people would through the API, chat, Slack or Feishu."""
    st = Store(url)
    try:
        res, asked = run_session(spec, url), 0
        for _ in range(40):
            if res.status == "paused":
                st.add_instruction(res.goal_id, "resume", "frank (chat)", text="go on")
            elif res.status != "waiting":
                return res.goal_id
            else:
                w, asked = res.waiting_for, asked + 1
                assert w["kind"] == "approval", w
                if asked == 2:
                    st.reject(w["candidate_id"], w["card_hash"], "bob (feishu)", REASON)
                else:
                    st.approve(w["candidate_id"], w["card_hash"], "alice (slack)")
                if asked == 1:
                    st.add_instruction(res.goal_id, "pause", "frank (chat)", text="pause while I look")
                if asked == 3:
                    st.extend_budget(res.goal_id, 2.0, 1, "erin (api)", "one more to confirm the gain")
            res = run_session(spec, url)
        raise AssertionError(f"the goal never finished: {res.status} {res.reason}")
    finally:
        st.close()


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    d = tmp_path_factory.mktemp("decided")
    g = yaml.safe_load((ROOT / "examples/goal-16k.yaml").read_text())
    g["authorisation"] |= {"hot": "ask", "restart": "ask"}
    g["budget"] = {"card_hours": 24, "experiments": 4}
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNELOOP_RUNS_ROOT", str(d / "runs"))
    url = f"sqlite:///{d / 'tuneloop.db'}"
    try:
        gid = drive(GoalSpec.model_validate(g), url)
    finally:
        mp.undo()
    store = Store(url)
    rep = build_report(store, gid)
    paths = render(rep, d / "report")
    yield {"store": store, "gid": gid, "rep": rep, "paths": paths, "url": url, "dir": d}
    store.close()


def cells(html: str, table_cls: str) -> list[dict[str, str]]:
    """The rows of one table of the HTML twin: {header: cell text}."""
    import html as h

    t = re.search(rf'<table class="{table_cls}">(.*?)</table>', html, re.S).group(1)
    heads = [h.unescape(x) for x in re.findall(r"<th>(.*?)</th>", t)]
    return [dict(zip(heads, (h.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r))))
            for r in re.findall(r"<tr[^>]*>(.*?)</tr>", t.split("</thead>", 1)[1], re.S)]


def test_the_report_opens_with_the_answer_before_any_configuration(decided):
    st, gid, rep = decided["store"], decided["gid"], decided["rep"]
    md = decided["paths"].markdown.read_text()
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads[0] == "## The answer" and heads[1] == "## People's decisions"
    for later in ("## Goal, fixed scenario and contract", "## Metric definitions", "## Decision log"):
        assert heads.index(later) > heads.index("## Best deployable station")
    answer = {r["field"]: r["value"] for r in cells(decided["paths"].html.read_text(), "kv answer")}
    best = st.best_station(gid)
    assert answer["best station"].startswith(best.hash)
    stops = st.decisions(gid, ("stop",))
    assert answer["stopped because"] == stops[-1].text == st.get_goal(gid).status_reason
    # the gain as the KPIs take it in the objective's window, and the whole window's from the stored figures
    k = compute_kpis(st, gid)
    assert answer["gain, native window (the objective's)"].startswith(f"{k.improvement_pct:+.2f} %")
    ref = reference_of(rep.content)
    bw, rw = (st.get_result(e.run.id).result.summary.whole.output_tok_s_per_card for e in (rep.content.best, ref))
    assert answer["gain, whole window"].startswith(f"{(bw / rw - 1) * 100:+.2f} % ({bw:.2f} vs {rw:.2f}")
    assert [g.window for g in gains(rep.content)] == ["whole", "native"] and k.improvement_pct > 0
    knobs = {r["field"]: r["value"] for r in cells(decided["paths"].html.read_text(), "kv answer-knobs")}
    assert knobs == {k: str(v) for k, v in best.knobs.items()}
    decisive = cells(decided["paths"].html.read_text(), "decisive")
    # exactly the runs that made the best station: its run, its parent station's run, ... back to the reference
    made = made_best(rep.content)
    assert [r["run"].split(" (")[1].rstrip(")") for r in decisive] == [e.run.id for e in made]
    assert made[-1].run.id == st.best(gid).run_id and all(a.station == b.parent for a, b in zip(made, made[1:]))
    assert not {e.run.id for e in rep.content.quality_failed} & {e.run.id for e in made}
    front = cells(decided["paths"].html.read_text(), "answer-frontier")
    assert best.hash in {r["station"] for r in front}
    assert '<figure class="plot" data-plot="tput_tpot_mean">' in decided["paths"].html.read_text().split('id="people"')[0]


def test_every_person_decision_is_in_the_report_with_who_where_when_and_why(decided):
    st, gid = decided["store"], decided["gid"]
    rows = cells(decided["paths"].html.read_text(), "people")
    rejected = [r for r in rows if r["decision"] == "reject"]
    assert len(rejected) == 1
    (cid,) = [c.id for c in st.candidates(gid) if st.approval(c.id) and st.approval(c.id).decision == "reject"]
    r = rejected[0]
    assert (r["who"], r["where"], r["why"]) == ("bob", "feishu", REASON)
    assert r["about"].startswith(f"candidate {cid}: ")
    assert r["when (UTC)"] == f"{st.approval(cid).created_at:%Y-%m-%d %H:%M:%S}"
    approved = [c.id for c in st.candidates(gid) if st.approval(c.id) and st.approval(c.id).decision == "approve"]
    assert sorted(int(x["about"].split(":")[0].split()[1]) for x in rows if x["decision"] == "approve") == approved
    assert all((x["who"], x["where"]) == ("alice", "slack") for x in rows if x["decision"] == "approve")
    ext = [x for x in rows if x["decision"] == "budget extension"]
    assert [(x["who"], x["where"], x["about"], x["why"]) for x in ext] == [
        ("erin", "api", "+2 card-hours, +1 experiment(s)", "one more to confirm the gain")]
    ins = [(x["decision"], x["who"], x["where"], x["why"]) for x in rows if x["decision"].startswith("instruction")]
    assert ins == [("instruction: pause", "frank", "chat", "pause while I look"),
                   ("instruction: resume", "frank", "chat", "go on")]
    assert [x["when (UTC)"] for x in rows] == sorted(x["when (UTC)"] for x in rows)
    md = decided["paths"].markdown.read_text()
    assert f"| bob | feishu | reject | candidate {cid}: " in md and f"| {REASON} |" in md


def test_every_station_hash_shown_resolves(decided):
    st, gid = decided["store"], decided["gid"]
    html = decided["paths"].html.read_text()
    # the engine's own command is a shell block: its paths carry the server hash an expert map is fitted for
    # (executor/engines/base.py layout_files), a file name, not a station shown to the reader
    html = re.sub(r"(?s)<pre class=\"engine-command[^\"]*\">.*?</pre>", " ", html)
    text = re.sub(r"<[^>]+>", " ", html.split("<figure")[0] + "".join(x.split("</figure>", 1)[-1]
                                                                     for x in html.split("<figure")[1:]))
    for r in st.runs(gid):
        text = text.replace(r.id, " ")  # a run id carries its experiment key: not a station hash
    shown = set(re.findall(r"\b[0-9a-f]{16}\b", text))
    assert st.best_station(gid).hash in shown and len(shown) >= 2
    for h in shown:
        assert st.get_station(h).hash == h  # every one a frozen station: /stations/<hash> and restore take it


def test_state_md_veto_names_a_station_that_the_api_resolves(decided, tmp_path):
    from fastapi.testclient import TestClient
    from test_api_support import TOKENS_ENV, auth

    from api.app import create_app
    from api.settings import Settings

    st, gid = decided["store"], decided["gid"]
    text = (decided["dir"] / "runs" / gid / "STATE.md").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("- vetoed: ")]
    assert f"rejected by bob (feishu): {REASON}" in line
    h = re.search(r" from station ([0-9a-f]{16}) ", line).group(1)
    settings = Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": decided["url"], "TUNELOOP_WORKERS": "0",
                                  "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs")})
    with TestClient(create_app(settings)) as c:
        r = c.get(f"/stations/{h}", headers=auth("viewer"))
        assert r.status_code == 200 and r.json()["hash"] == h
    # a veto whose parent never ran names the digest as what it is, never as a station
    st.add_veto(gid, "concurrency", 64, Conditions(scenario=st.get_goal(gid).spec.scenario, parent_hash="f" * 16),
                who="carol (cli)", reason="too risky")
    line = [x for x in render_state(st, gid).splitlines() if "carol" in x][0]
    assert f"from a parent never run (knobs digest {'f' * 16}: no frozen station yet)" in line


def test_refusals_and_the_loops_own_approvals_are_told_apart(store, tmp_path):
    """A refused extension is a person's; an approval the authorisation table gave is the loop's, counted apart."""
    from agent.report.people import gather_people

    goal = store.create_goal(GoalSpec.model_validate(yaml.safe_load((ROOT / "examples/goal-16k.yaml").read_text())))
    card = {"stage": "screen", "n": 320, "change": {"knob": "concurrency", "old": 128, "new": 90}}
    a = store.add_candidate(goal.id, card | {"experiment_key": "a"})
    b = store.add_candidate(goal.id, card | {"experiment_key": "b",
                                             "change": {"knob": "request_rate", "old": 6, "new": 8}})
    store.approve(a.id, a.card_hash, "worker w1", "authorisation table: hot -> auto", given_by="table")
    # a person's approval is a person's whatever its words (the approval's column decides, agent/loop/approval.py)
    store.approve(b.id, b.card_hash, "dana (chat)", "authorisation table: would ask, so I say yes")
    store.refuse_extension(goal.id, "erin (api)", "enough for today")
    people, auto = gather_people(store, goal.id, {a.id: a.card, b.id: b.card})
    assert auto == 1
    assert [(p.kind, p.who, p.via, p.reason) for p in people] == [
        ("approve", "dana", "chat", "authorisation table: would ask, so I say yes"), ("budget extension refused", "erin", "api", "enough for today")]
    md = render(build_report(store, goal.id), tmp_path).markdown.read_text()
    assert "| erin | api | budget extension refused | the goal stops | enough for today |" in md
    assert "1 card(s) approved by the loop itself" in md


# -- the report in a browser: its first screen ------------------------------------------------------------------
def test_the_reports_first_screen_shows_the_best_station_its_gain_and_why_it_stopped(decided):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "chromium missing: run tests/sysdeps.sh"
    st, gid = decided["store"], decided["gid"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = b.new_page(viewport={"width": 1280, "height": 720})
            page.goto(decided["paths"].html.resolve().as_uri(), wait_until="load")
            want = {"best station": st.best_station(gid).hash, "gain, whole window": "%",
                    "gain, native window (the objective's)": f"{compute_kpis(st, gid).improvement_pct:+.2f} %",
                    "stopped because": st.get_goal(gid).status_reason}
            for key, text in want.items():
                row = page.locator(f'table.kv.answer tr[data-key="{key}"]')
                assert text in row.inner_text()
                box = row.bounding_box()
                assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 720, (key, box)
            assert page.evaluate("() => window.scrollY") == 0  # the first screen, nothing scrolled
            reject = page.locator("table.people tr", has_text=REASON)
            assert reject.count() == 1 and "bob" in reject.inner_text() and "feishu" in reject.inner_text()
        finally:
            b.close()
