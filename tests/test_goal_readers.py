"""Issue 56 items 1 and 2: the goal the user wrote reaches the person. A goal of each shape (objective output tok/s per
card, output tok/s, qps, goodput; limits at p99, p90 and the mean; `reported` figures) runs through a real `tuneloop
run` on the simulator; its report (tables, frontier plots, captions), chat `status` through the real service, the
dashboard in a real browser and the Slack card show the goal's objective and each limit at its own statistic
(core/goalview.py), and nothing the goal did not ask for in their place. No percentage above 1000 % anywhere."""
from __future__ import annotations

import html
import itertools
import re
from pathlib import Path

import httpx
import pytest
import yaml

from test_api_support import TOKENS, ServerProcess, auth, service_env
from test_dashboard import CHROMIUM, FLAGS, _ink, _need_chromium
from test_report import tuneloop

from agent.cli.run import clip
from agent.report import build_report
from api.chatops.cards import slack_blocks, view
from core.escape import markdown
from core.goalview import change, effect, figure_named
from core.ledger import Interval, interval_words
from state.goal import LATENCIES, STATS
from state.hypotheses import card_title
from state.store import Store

BASE = {"engine": "sim", "target": "sim", "sim_profile": "llama70b-h100-p2d2", "scenario": "chat2k",
        "start_knobs": {"max_num_seqs": 32, "concurrency": 32},
        "search_space": {"max_num_seqs": [32, 64, 128], "concurrency": [32, 64, 128]},
        "protocol": {"screen_n": 80, "confirm_n": 160}, "authorisation": {"hot": "auto", "restart": "auto"},
        "budget": {"card_hours": 50, "experiments": 2}}
SHAPES = {  # name -> (objective, limits, reported); goodput last: the dashboard shows the latest goal
    "per-card": ("output_tok_s_per_card", {"ttft_p99_ms_lt": 10000}, ["e2e_p99_ms"]),
    "tok-s": ("output_tok_s", {"tpot_p90_ms_lt": 40}, []),
    "qps": ("qps", {"e2e_p99_ms_lt": 60000, "tpot_mean_ms_lt": 40}, ["cache_hit"]),
    "goodput": ("goodput", {"ttft_p99_ms_lt": 2000, "tpot_p99_ms_lt": 35}, ["e2e_p99_ms"]),
}
BIG_PCT = re.compile(r"[+-]?\d{4,}(?:\.\d+)?\s?%")  # a percentage of 1000 or more


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """Each shape's goal run to its stop by `tuneloop run` (one store): {shape: (goal id, view, stdout, report.md)}."""
    cwd = tmp_path_factory.mktemp("shapes")
    db = f"sqlite:///{cwd / 'shapes.db'}"
    out = {}
    for name, (metric, limits, reported) in SHAPES.items():
        g = BASE | {"name": f"shape-{name}", "objective": {"metric": metric, "window": "whole"},
                    "constraints": {**limits, "all_succeed": True, "output_len": 512}, "reported": reported}
        (cwd / f"{name}.yaml").write_text(yaml.safe_dump(g))
        res = tuneloop("run", f"{name}.yaml", "--db", db, "--auto-approve", "--no-twin", cwd=cwd)
        assert res.exit_code == 0, res.output[-3000:]
        report = re.search(r"^report: (\S+report\.html)$", res.output, re.M)
        assert report, res.output[-2000:]
        store = Store(db)
        try:
            (goal,) = [x for x in store.goals() if x.spec.name == f"shape-{name}"]
        finally:
            store.close()
        out[name] = (goal.id, goal.spec.view(), res.output, (cwd / report.group(1)).with_name("report.md"))
    yield cwd, db, out


def _latency_words() -> set[str]:
    return {figure_named(f"{m}_{s}_ms").words for m, s in itertools.product(LATENCIES, STATS)}


def _table_heads(md: str) -> list[str]:
    """The head line of every table a reader compares runs in: the frontier, the trade-offs, each run's figures."""
    return [line for line in md.splitlines()
            if line.startswith(("| station | N | decision |", "| station | change | decision | frontier |", "| N formal |"))]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_report_shows_the_goals_objective_and_each_limit_at_its_own_statistic(shapes, shape):
    cwd, db, got = shapes
    gid, v, stdout, md_path = got[shape]
    md = md_path.read_text()
    cols = [f.words for f in v.columns()]
    assert [f.key for f in v.columns()][:len(v.limits)] == [x.figure_key for x in v.limits]
    assert f"maximise {v.objective_words}" in md and markdown(v.slo_words()) in md  # Markdown-escaped: "\\<"
    # each card's prediction (the objective's effect with its interval) beside what its run measured, in the log
    assert re.search(r"^\| prediction \| .*\(interval .*source: ", md, re.M) and "| measured | " in md
    assert "| prediction error (absolute, on the objective) | " in md
    heads = _table_heads(md)
    assert heads, md[:2000]
    for head in heads:
        cells = [c.strip() for c in head.strip("|").split("|")]
        assert all(c in cells for c in cols), (cols, head)
        assert not (_latency_words() - set(cols)) & set(cells), head  # no latency the goal did not ask for
    store = Store(db)
    try:
        rep = build_report(store, gid, base=cwd)
    finally:
        store.close()
    best = rep.content.best.summary if rep.content.best else None
    axes = v.axes(best)
    assert rep.frontiers == tuple("tput_" + f.key.removesuffix("_ms") for f in axes)
    assert axes[0].key == v.binding(best).figure_key and len(axes) == len(v.limits)
    for name, fig in zip(rep.frontiers, axes):
        p = rep.plots[name]
        assert p.series["x"] == fig.key and p.series["slo"] == fig.limit_ms
        assert f"The goal's SLO: {v.slo_words()}." in p.caption and fig.words.removesuffix(" ms") in p.title
        assert {pt["x"] for pt in p.series["points"]} <= {r.figures[fig.key] for by_n in rep.content.tradeoffs.values()
                                                          for rows in by_n.values() for r in rows}
    assert f'data-plot="{rep.frontiers[0]}"' in md_path.with_name("report.html").read_text()
    for text in (md, md_path.with_name("report.html").read_text(), stdout):
        assert not BIG_PCT.search(text), BIG_PCT.search(text)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_slack_card_carries_the_goals_figures_and_its_prediction(shapes, shape):
    cwd, db, got = shapes
    gid, v, _, _ = got[shape]
    store = Store(db)
    try:
        cand = [c for c in store.candidates(gid) if c.card.get("change")][-1]
        text = html.unescape("\n".join(b["text"]["text"] for b in slack_blocks(view(store, cand.id))
                                       if b.get("type") == "section"))
    finally:
        store.close()
    parent = next(line for line in text.splitlines() if line.startswith("*the parent measured:*"))
    assert parent.startswith(f"*the parent measured:* {v.objective_words.split(' (')[0]}: whole ")
    for lim in v.limits:
        assert f"{lim.words} " in parent and f"(< {lim.limit_ms:g})" in parent
    predicted = next(line for line in text.splitlines() if line.startswith("*predicted effect:*"))
    assert "(interval " in predicted and "source: " in predicted  # the interval beside the point, and whose it is
    if v.metric != "output_tok_s_per_card":
        assert "tok/s/card" not in parent + predicted


def test_chat_status_and_the_dashboard_speak_the_goals_own_figures(shapes, tmp_path):
    """`status` through the real service answers each goal in its objective and its limits at their statistics; a
    goodput goal in goodput and its p99 limits. The dashboard (headless Chromium) shows the goodput goal's best
    station with its SLO and each limit's figure, and a frontier plot per limit (TTFT p99 and TPOT p99, the binding
    one first), each named by its limit."""
    cwd, db, got = shapes
    srv = ServerProcess(tmp_path, service_env(cwd, db, TUNELOOP_WORKERS="0"))
    try:
        for shape, (gid, v, _, _) in got.items():
            reply = httpx.post(f"{srv.url}/goals/{gid}/chat", json={"text": "status"}, headers=auth("viewer"),
                               timeout=60).json()["reply"]
            assert f"SLO: {v.slo_words()}" in reply and f"maximise {v.objective_words}" in reply
            best = next(line for line in reply.splitlines() if line.startswith("best:"))
            assert f"{v.objective_words.split(' (')[0]}: whole " in best and v.unit in best
            for lim in v.limits:
                assert f"{lim.words} " in best and f"(< {lim.limit_ms:g})" in best
            others = _latency_words() - {f.words for f in v.columns()}
            assert not any(w.removesuffix(" ms") + " " in best for w in others), best
            if shape == "goodput":
                said = best + next(line for line in reply.splitlines() if line.startswith("objective:"))
                assert "tok/s" not in said and "goodput" in said and "TTFT p99" in best and "TPOT p99" in best
        _dashboard(srv, tmp_path, *got["goodput"][:2])
    finally:
        srv.stop()


def _dashboard(srv: ServerProcess, tmp_path: Path, gid: str, v) -> None:  # type: ignore[no-untyped-def]
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
                                                   args=FLAGS, viewport={"width": 1280, "height": 900})
        try:
            page = ctx.new_page()
            page.goto(srv.url + "/")
            page.fill("#token", TOKENS["viewer"])
            page.click("#save-token")
            expect(page.locator("#status")).to_contain_text(gid, timeout=60_000)
            best = page.locator("#best")
            expect(best.locator("tr.slo td")).to_have_text(v.slo_words(), timeout=60_000)
            expect(best.locator("tr.objective th")).to_contain_text(v.objective_words)
            for lim in v.limits:
                row = best.locator(f'tr[class="figure {lim.figure_key}"]')
                expect(row.locator("th")).to_contain_text(f"{lim.words} ms (limit < {lim.limit_ms:g})")
                expect(row.locator("td")).not_to_be_empty()
            assert "tok/s/card" not in best.inner_text() and "mean TPOT" not in best.inner_text()
            # a frontier per limit, as the report draws them: the binding limit's first, each named by its limit
            panels = page.locator("#frontier figure.frontier-panel")
            expect(panels).to_have_count(len(v.limits), timeout=60_000)
            axes = httpx.get(f"{srv.url}/goals/{gid}/frontier/axes", headers=auth("viewer"), timeout=60).json()
            assert sorted(a["key"] for a in axes) == sorted(lim.figure_key for lim in v.limits) and axes[0]["binding"]
            for i, a in enumerate(axes):
                panel = panels.nth(i)
                expect(panel).to_have_attribute("data-axis", a["key"])
                lim = next(x for x in v.limits if x.figure_key == a["key"])
                expect(panel.locator("figcaption")).to_contain_text(f"{v.objective_words} against {lim.words} ms "
                                                                    f"(limit < {lim.limit_ms:g})")
                expect(panel.locator("img")).to_be_visible()
                page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=panel.locator("img").element_handle())
                assert _ink(panel.locator("img").screenshot())[0] > 500  # each plot drawn, not an empty box
            expect(panels.nth(0).locator("figcaption")).to_contain_text("the limit that binds at the best run")
            bad = httpx.get(f"{srv.url}/goals/{gid}/frontier.png", params={"axis": "tpot_mean_ms"}, headers=auth("viewer"),
                            timeout=60)
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "axis"], bad.text
            one = httpx.get(f"{srv.url}/goals/{gid}/frontier.png", params={"axis": axes[1]["key"]}, headers=auth("viewer"),
                            timeout=60)
            assert one.status_code == 200 and one.headers["content-type"] == "image/png"
            shot = page.screenshot(path=str(tmp_path / "goodput-dashboard.png"), full_page=True)
            assert _ink(shot)[0] > 500
        finally:
            ctx.close()


def test_a_near_zero_parent_is_shown_as_its_two_figures_never_a_percentage_above_1000():
    assert change(6.97, 0.07, "req/s") == "0.07 -> 6.97 req/s"  # the goodput: not +9857.14 %
    assert change(1.5, 1.0) == "+50.00 %" and change(1.5, 1.0, tight=True) == "+50.00%"
    assert change(5.0, 0.0, "req/s") == "0.00 -> 5.00 req/s" and change(None, 1.0) is None
    assert change(10.9, 1.0) == "+990.00 %" and change(11.5, 1.0) == "1.00 -> 11.50"
    assert effect(0.1) == "+10.0 %" and effect(92.0) == "x93.0"
    wide = Interval(value=93.354, lo=93.334, hi=93.374)  # the "+9335.4 % [+9333.4 %, +9337.4 %]"
    assert interval_words(wide, 0.07, "req/s") == "0.07 -> 6.60 req/s (interval 6.60 to 6.61)"
    assert interval_words(wide) == "x94.4 (interval x94.3 to x94.4)" and not BIG_PCT.search(interval_words(wide, 0.07))
    assert interval_words(Interval(value=0.1, lo=0.05, hi=0.15)) == "+10.0 % (interval +5.0 % to +15.0 %)"


def test_a_jump_is_named_by_every_change_and_a_long_line_is_cut_at_a_word():
    jump = {"stage": "confirm", "n": 640, "change": {"knob": "a", "old": 1, "new": 2},
            "more": [{"knob": "b", "old": False, "new": True}, {"knob": "c", "old": 6.0, "new": 8.0}]}
    assert card_title(jump) == "confirm N=640: a 1 -> 2 + b False -> True + c 6.0 -> 8.0"
    words = "nothing left to gain by the goal's twin " * 10
    cut = clip(words.strip(), 200)
    assert len(cut) <= 200 and cut.endswith("twin…") and words.startswith(cut[:-1])
    assert clip("short", 200) == "short"
