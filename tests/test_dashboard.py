"""The dashboard end to end in headless Chromium (Debian's /usr/bin/chromium via Playwright):
post a goal, approve a card in the browser, see the decision appear."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_api_support import TOKENS, ServerProcess, service_env, small_goal

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def _need_chromium() -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{CHROMIUM} missing under CI=true (tests/sysdeps.sh installs it)")
        pytest.skip(f"{CHROMIUM} not installed (run tests/sysdeps.sh)")


def test_post_goal_approve_in_browser_and_see_the_decision(tmp_path):
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    srv = ServerProcess(tmp_path, service_env(tmp_path, f"sqlite:///{tmp_path / 't.db'}"))
    try:
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=FLAGS)
            try:
                page = ctx.new_page()
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
                card.locator("button.approve").click()
                row = page.locator("#decisions tr.decision", has_text="reference at N=40")
                expect(row.first).to_be_visible(timeout=180_000)
                expect(page.locator("#status")).to_contain_text("browser-goal", timeout=10_000)
                expect(page.locator("#best")).not_to_have_text("—", timeout=120_000)
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
                assert ap["decision"] == "approve" and ap["who"] == "admin1 (api)"
                assert external == []  # no CDN, nothing outside the service (dashboard and report pages)
                assert TOKENS["admin"] not in page.content()
            finally:
                ctx.close()
    finally:
        srv.stop()
