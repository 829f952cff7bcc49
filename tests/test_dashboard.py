"""The dashboard end to end in headless Chromium (Debian's /usr/bin/chromium via Playwright):
post a goal, read the card, approve it in the browser, see progress and the decision appear without a
reload; the login prompt; Chinese text rendered with a real CJK font (not boxes). Screenshots are checked
as pictures: not blank, and the glyphs of two different characters differ."""
from __future__ import annotations

import io
import json
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from test_api_support import TOKENS, ServerProcess, service_env, small_goal
from unavailable import missing

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def _need_chromium() -> None:
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} is not installed (tests/sysdeps.sh installs it)")


def _ink(png: bytes) -> tuple[int, bytes]:
    """Dark pixels in a screenshot (how much is drawn) and its grey bytes (to compare two pictures)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    data = img.tobytes()
    return sum(1 for b in data if b < 128), data


@contextmanager
def _browser(tmp_path, **env: str) -> Iterator[tuple[ServerProcess, Any, Any]]:
    """`tuneloop serve` as a process and a headless Chromium with one page: (server, context, page)."""
    _need_chromium()
    from playwright.sync_api import sync_playwright

    srv = ServerProcess(tmp_path, service_env(tmp_path, f"sqlite:///{tmp_path / 't.db'}", **env))
    try:
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=FLAGS, viewport={"width": 1280, "height": 900})
            try:
                yield srv, ctx, ctx.new_page()
            finally:
                ctx.close()
    finally:
        srv.stop()


def test_without_a_token_the_page_asks_for_one(tmp_path):
    from playwright.sync_api import expect

    with _browser(tmp_path) as (srv, ctx, page):
        page.goto(srv.url + "/")
        expect(page.locator("#login")).to_be_visible(timeout=30_000)
        expect(page.locator("#login")).to_contain_text("Sign in")
        expect(page.locator("#main")).to_be_hidden()
        assert page.locator("img:visible").count() == 0  # no broken image before a token
        shot = page.screenshot(path=str(tmp_path / "login.png"))
        assert _ink(shot)[0] > 500  # text drawn, not a blank page
        page.fill("#token", "not-a-token")
        page.click("#save-token")
        expect(page.locator("#login-error")).to_contain_text("401", timeout=30_000)
        page.wait_for_timeout(2500)  # the page refreshes every second: the refusal stays until the next try
        expect(page.locator("#login-error")).to_contain_text("401", timeout=100)
        page.fill("#token", TOKENS["viewer"])
        page.click("#save-token")
        expect(page.locator("#main")).to_be_visible(timeout=30_000)
        expect(page.locator("#login")).to_be_hidden()
        expect(page.locator("#frontier-empty")).to_contain_text("no goal yet", timeout=30_000)


def test_chinese_renders_with_a_cjk_font_not_boxes(tmp_path):
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True).stdout
    assert "CJK" in fonts, f"no CJK font installed (tests/sysdeps.sh installs fonts-noto-cjk): {fonts!r}"
    import httpx
    from playwright.sync_api import expect

    with _browser(tmp_path, TUNELOOP_WORKERS="0") as (srv, ctx, page):
        httpx.post(srv.url + "/goals", json=small_goal("zh-goal"), headers={"Authorization": f"Bearer {TOKENS['admin']}"},
                   timeout=60).raise_for_status()
        page.goto(srv.url + "/")
        page.fill("#token", TOKENS["approver"])
        page.click("#save-token")
        expect(page.locator("#status")).to_contain_text("zh-goal", timeout=60_000)
        page.fill("#chat-text", "状态")
        page.click("#chat-send")
        expect(page.locator("#chat-log")).to_contain_text("> 状态", timeout=30_000)
        expect(page.locator("#frontier")).to_be_visible(timeout=60_000)  # the plot's own empty state
        page.screenshot(path=str(tmp_path / "chat-zh.png"), full_page=True)
        # the same two characters of the chat line, each in its own box with the page's font:
        # a missing font draws both as the same empty box (tofu); a real one draws two glyphs
        page.evaluate("""() => { for (const [id, ch] of [["g1", "状"], ["g2", "态"]]) {
            const s = document.createElement("span"); s.id = id; s.textContent = ch;
            s.style.cssText = "font-size:48px;display:inline-block;background:#fff;color:#000";
            document.getElementById("chat-log").append(s); } }""")
        ink1, px1 = _ink(page.locator("#g1").screenshot())
        ink2, px2 = _ink(page.locator("#g2").screenshot())
        assert ink1 > 50 and ink2 > 50  # drawn at all
        assert px1 != px2, "two different characters rendered as the same box: no CJK font"


def test_post_goal_approve_in_browser_and_see_the_decision(tmp_path):
    from playwright.sync_api import expect

    with _browser(tmp_path) as (srv, ctx, page):
        external = []
        ctx.on("request", lambda r: external.append(r.url) if not r.url.startswith((srv.url, "blob:", "data:")) else None)
        page.goto(srv.url + "/")
        page.fill("#token", TOKENS["admin"])
        page.click("#save-token")
        page.fill("#goal-spec", json.dumps(small_goal("browser-goal", experiments=1)))
        page.click("#post-goal")
        expect(page.locator("#post-result")).to_contain_text("posted browser-goal", timeout=120_000)
        card = page.locator("#pending .card").first
        expect(card).to_contain_text("candidate", timeout=180_000)
        cid = card.get_attribute("data-candidate")
        # what a person decides on: the mechanism, the expected effect, the cost, the rank
        for cls in ("parent", "change", "mechanism", "expected", "rules-out", "cost", "rank"):
            expect(card.locator(f"tr.{cls} td")).not_to_be_empty()
        expect(card.locator("tr.cost td")).to_contain_text("card-hours")
        expect(card.locator("tr.change td")).to_contain_text("reference")
        shot = card.screenshot(path=str(tmp_path / "pending-card.png"))
        assert _ink(shot)[0] > 500
        expect(page.locator("#progress .budget")).to_contain_text("0.00 of 24.00 card-hours")
        page.evaluate("() => { window.__same_page = true; }")  # gone if anything reloads the page
        card.locator("button.approve").click()
        row = page.locator("#decisions tr.decision", has_text="reference at N=60")
        expect(row.first).to_be_visible(timeout=180_000)
        # the progress box followed the loop by itself: budget spent, one experiment used
        expect(page.locator("#progress .budget")).not_to_contain_text("0.00 of 24.00", timeout=60_000)
        expect(page.locator("#progress .budget")).to_contain_text("1 of 1 experiments", timeout=60_000)
        assert page.evaluate("() => window.__same_page === true")
        expect(page.locator("#best tr.objective")).to_be_visible(timeout=120_000)
        expect(page.locator("#best tr.n td")).to_have_text("60")
        assert page.locator("#best").bounding_box()["width"] <= 1280  # a table, not one 3000 px line
        expect(page.locator("#frontier")).to_be_visible(timeout=60_000)
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        expect(page.locator("#status")).to_contain_text("browser-goal", timeout=10_000)
        page.click("#render-report")  # fetched with the token, opened from a blob: URL
        expect(page.locator("#report-link")).to_be_visible(timeout=180_000)
        with ctx.expect_page(timeout=120_000) as popup:
            page.click("#report-link")
        report = popup.value
        report.wait_for_load_state()
        gid = page.locator("#goal-select").input_value()
        expect(report.locator("body")).to_contain_text(gid, timeout=120_000)
        expect(report.locator("body")).to_contain_text("tuneloop restore", timeout=10_000)
        assert report.locator("img").count() >= 1  # plots embedded in the page itself
        report.close()
        page.fill("#chat-text", f"why was {cid} rejected?")
        page.click("#chat-send")
        expect(page.locator("#chat-log")).to_contain_text(f"candidate {cid}", timeout=10_000)
        import httpx

        ap = httpx.get(f"{srv.url}/candidates/{cid}/approval",
                       headers={"Authorization": f"Bearer {TOKENS['viewer']}"}).json()
        assert ap["decision"] == "approve" and ap["who"] == "admin1 (dashboard)"
        assert external == []  # no CDN, nothing outside the service (dashboard and report pages)
        assert TOKENS["admin"] not in page.content()


def test_reject_in_place_needs_a_reason_and_records_it(tmp_path):
    import httpx
    from playwright.sync_api import expect

    with _browser(tmp_path) as (srv, ctx, page):
        page.goto(srv.url + "/")
        page.fill("#token", TOKENS["admin"])
        page.click("#save-token")
        page.fill("#goal-spec", json.dumps(small_goal("reject-goal", experiments=2)))
        page.click("#post-goal")
        card = page.locator("#pending .card").first
        expect(card).to_contain_text("candidate", timeout=180_000)
        cid = card.get_attribute("data-candidate")
        card.locator("button.reject").click()
        expect(card.locator(".card-error")).to_contain_text("say why")  # nothing sent without a reason
        ap = httpx.get(f"{srv.url}/candidates/{cid}/approval", headers={"Authorization": f"Bearer {TOKENS['viewer']}"})
        assert ap.json() is None
        card.locator("input.reason").fill("not today: the cluster is shared")
        card.locator("button.reject").click()
        expect(page.locator(f'#pending .card[data-candidate="{cid}"]')).to_have_count(0, timeout=60_000)
        ap = httpx.get(f"{srv.url}/candidates/{cid}/approval", headers={"Authorization": f"Bearer {TOKENS['viewer']}"}).json()
        assert ap["decision"] == "reject" and ap["reason"] == "not today: the cluster is shared"
        assert ap["who"] == "admin1 (dashboard)"


DRIFT = {"profile": "wrong.yaml", "threshold": 0.15, "predicted": {"output_tok_s": 130.0, "tpot_mean_ms": 21.0},
         "measured": {"output_tok_s": 100.0, "tpot_mean_ms": 30.0}, "drift": {"output_tok_s": 0.3, "tpot_mean_ms": -0.3},
         "worst": 0.3, "flagged": True, "suggestion": "re-calibrate, e.g. tuneloop sim calibrate RUN --out P.yaml"}
DRIFT_GOAL = {"objective": {"metric": "goodput", "window": "whole"}, "reported": ["e2e_p99_ms"],
              "constraints": {"ttft_p99_ms_lt": 2000, "tpot_p99_ms_lt": 35, "all_succeed": True, "output_len": 1024}}


def test_the_simulator_drift_in_the_goals_own_figures_is_on_the_dashboard(tmp_path, make_result):
    """Runs of a target with a calibrated profile (their evidence holds the drift record the API serves) under a goodput
    goal limiting TTFT p99 and TPOT p99: the page shows the flag with the re-calibration to run, and per run the goal's
    own figures predicted beside measured (goodput, TTFT p99, TPOT p99, the reported E2E p99), never tok/s or mean
    TPOT; a record from before the predicted Summary was kept shows what it has ("—" for the rest)."""
    from playwright.sync_api import expect

    from core.evidence import Evidence
    from core.station import Station
    from core.summary import Dist
    from core.trial import TrialSpec
    from state.goal import GoalSpec
    from state.store import Store

    _need_chromium()

    def figures(goodput: float, ttft: float, tpot: float, e2e: float):  # a run's Summary with the goal's figures
        s = make_result("x", n=40).summary
        return s.model_copy(update={"whole": s.whole.model_copy(update={"goodput": goodput}),
                                    "ttft_ms": Dist(n=40, mean=ttft / 2, p99=ttft), "tpot_ms": Dist(n=40, mean=tpot / 2, p99=tpot),
                                    "e2e_ms": Dist(n=40, mean=e2e / 2, p99=e2e)})

    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    try:
        goal = store.create_goal(GoalSpec.model_validate(small_goal("drift-goal", ask=False) | {"target": "real"} | DRIFT_GOAL))
        knobs = goal.spec.start_station()
        st = store.put_station(Station(engine="sim", knobs=knobs, scenario=goal.spec.scenario, data_version="d",
                                       source_identity="s", target="real"))
        old = DRIFT | {"flagged": False, "worst": 0.05, "drift": {"output_tok_s": 0.05, "tpot_mean_ms": -0.02},
                       "predicted": {"output_tok_s": 105.0, "tpot_mean_ms": 29.4}}  # no Summary: written before it was kept
        new = DRIFT | {"summary": figures(6.5, 1300.0, 42.0, 30000.0).model_dump(mode="json")}
        for i, drift in enumerate((old, new)):
            rid = f"{goal.id}-r{i}"
            store.create_run(TrialSpec(run_id=rid, goal_id=goal.id, target="real", scenario=goal.spec.scenario,
                                       knobs=knobs, stage="baseline", n=40), station_hash=st.hash)
            res = make_result(rid, station_hash=st.hash, n=40)
            res = res.model_copy(update={"summary": figures(5.0, 1000.0, 30.0, 25000.0),
                                         "evidence": Evidence.model_validate({"drift": drift})})
            store.record_result(res, goal_id=goal.id)
            store.record_decision(goal.id, "note", run_id=rid, text=f"run {i}")
        gid = goal.id
    finally:
        store.close()
    with _browser(tmp_path, TUNELOOP_WORKERS="0") as (srv, ctx, page):
        page.goto(srv.url + "/")
        page.fill("#token", TOKENS["viewer"])
        page.click("#save-token")
        expect(page.locator("#status")).to_contain_text(gid, timeout=60_000)
        flag = page.locator("#drift-flag")
        expect(flag).to_be_visible(timeout=60_000)
        expect(flag).to_contain_text("DRIFT: the calibrated simulator is off in 1 of 2 predicted run(s)")
        expect(flag).to_contain_text("tuneloop sim calibrate")
        expect(page.locator("#drift-empty")).to_be_hidden()
        head = page.locator("#drift-head").inner_text()
        for words in ("predicted goodput", "measured goodput", "TTFT p99 ms (limit < 2000)", "TPOT p99 ms (limit < 35)",
                      "measured E2E p99 ms"):
            assert words in head, head
        assert "tok/s" not in head and "mean TPOT" not in head, head
        bad = page.locator(f'#drift tr.drift-run[data-run="{gid}-r1"]')
        expect(bad).to_have_class("drift-run flagged")
        for key, cls, want in (("goodput", "predicted", "6.5"), ("goodput", "measured", "5.0"), ("goodput", "drift", "+30.0 %"),
                               ("ttft_p99_ms", "predicted", "1300.0"), ("ttft_p99_ms", "measured", "1000.0"),
                               ("tpot_p99_ms", "predicted", "42.00"), ("tpot_p99_ms", "measured", "30.00"),
                               ("tpot_p99_ms", "drift", "+40.0 %"), ("e2e_p99_ms", "drift", "+20.0 %")):
            expect(bad.locator(f'td.{cls}[data-figure="{key}"]')).to_have_text(want)
        expect(bad.locator("td.check")).to_contain_text("DRIFT (limit 15 %)")
        ok = page.locator(f'#drift tr.drift-run[data-run="{gid}-r0"]')
        expect(ok).to_have_class("drift-run within")
        expect(ok.locator("td.check")).to_have_text("within 15 %")
        expect(ok.locator('td.predicted[data-figure="goodput"]')).to_have_text("—")  # the old record has no goodput
        expect(ok.locator('td.measured[data-figure="goodput"]')).to_have_text("5.0")
        assert _ink(page.locator("#drift-box").screenshot(path=str(tmp_path / "drift.png")))[0] > 500
