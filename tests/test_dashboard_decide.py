"""Deciding from the dashboard (issue 36 item 5), in headless Chromium against `tuneloop serve`: the card an
approver reads carries the numeric prediction with its interval, the hypothesis and the evidence it rests on,
why the loop asks and the card hash; a refused action (422) stays on the page until the person dismisses it,
whatever the 1 s refresh does meanwhile."""
from __future__ import annotations

import json

import httpx
from test_api_support import TOKENS, small_goal
from test_dashboard import _browser, _ink

VIEW = {"Authorization": f"Bearer {TOKENS['viewer']}"}


def pct(v: float) -> str:
    """A relative effect as the page writes it (JavaScript's toFixed(1) of the percentage)."""
    return ("+" if v >= 0 else "") + f"{100 * v:.1f} %"


def span(i: dict) -> str:
    return f"{pct(i['value'])} [{pct(i['lo'])}, {pct(i['hi'])}]"


def test_an_approver_sees_prediction_interval_hypothesis_evidence_and_a_refusal_stays(tmp_path):
    from playwright.sync_api import expect

    with _browser(tmp_path) as (srv, ctx, page):
        page.goto(srv.url + "/")
        page.fill("#token", TOKENS["admin"])
        page.click("#save-token")
        page.fill("#goal-spec", "{}")  # a goal without its fields: 422, kept on the page
        page.click("#post-goal")
        expect(page.locator("#action-errors .action-error")).to_contain_text("post goal: 422", timeout=60_000)
        page.fill("#goal-spec", json.dumps(small_goal("approver-goal", experiments=4)))
        page.click("#post-goal")
        expect(page.locator("#post-result")).to_contain_text("posted approver-goal", timeout=120_000)
        expect(page.locator("#action-errors .action-error")).to_contain_text("post goal: 422")  # several refreshes on
        page.locator("#action-errors button.dismiss").click()
        expect(page.locator("#action-errors .action-error")).to_have_count(0)
        # approve references until the loop proposes a change: a card with a hypothesis to decide on
        for _ in range(4):
            card = page.locator("#pending .card").first
            expect(card).to_contain_text("candidate", timeout=180_000)
            cid = card.get_attribute("data-candidate")
            c = httpx.get(f"{srv.url}/candidates/{cid}", headers=VIEW, timeout=60).json()
            if c["card"].get("hypothesis"):
                break
            card.locator("button.approve").click()
            expect(page.locator(f'#pending .card[data-candidate="{cid}"]')).to_have_count(0, timeout=180_000)
        else:
            raise AssertionError("no card with a hypothesis was proposed")
        k = c["card"]
        p = k["prediction"]
        expect(card.locator("tr.prediction li.objective-effect")).to_have_text(
            f"{p['objective']}: {span(p['objective_effect'])}")
        if p.get("slo_effect"):
            expect(card.locator("tr.prediction li.slo-effect")).to_have_text(
                f"binding SLO {p['slo']}, its figure: {span(p['slo_effect'])}")
        expect(card.locator("tr.prediction li.basis")).to_contain_text(p["basis"])
        expect(card.locator("tr.hypothesis td")).to_have_text(k["hypothesis"])
        h = next(x for x in k["diagnosis"]["hypotheses"] if x["name"] == k["hypothesis"])
        assert h["evidence_for"] or h["evidence_against"]
        expect(card.locator("tr.evidence li.for")).to_have_text([f"for: {e}" for e in h["evidence_for"]])
        expect(card.locator("tr.evidence li.against")).to_have_text([f"against: {e}" for e in h["evidence_against"]])
        assert c["asked_why"] and "-> ask" in c["asked_why"]
        # the twin's jump (on by default) takes the index-cache reuse: a quality-risk card says that too
        qr = ["quality risk: the change may alter the model's outputs; it becomes deployable only after an accuracy "
              "evaluation passes"] if k.get("quality_risk") else []
        expect(card.locator("tr.why-ask li")).to_have_text(c["asked_why"].split("; ") + qr)
        expect(card.locator("tr.why-ask li.asks").first).to_contain_text("-> ask")
        expect(card.locator("tr.hash td")).to_contain_text(c["card_hash"])
        assert _ink(card.screenshot(path=str(tmp_path / "card.png")))[0] > 500
        # a blank reason reaches the API, which refuses it: the refusal stays until dismissed
        card.locator("input.reason").fill(" ")
        card.locator("button.reject").click()
        err = card.locator(".card-error .action-error")
        expect(err).to_contain_text("reject refused: 422", timeout=30_000)
        expect(err).to_contain_text("reason")
        page.wait_for_timeout(5000)  # five refreshes later
        expect(err).to_contain_text("reject refused: 422", timeout=100)
        assert err.is_visible()
        page.screenshot(path=str(tmp_path / "refused.png"), full_page=True)
        assert httpx.get(f"{srv.url}/candidates/{cid}/approval", headers=VIEW).json() is None  # nothing recorded
        err.locator("button.dismiss").click()
        expect(card.locator(".card-error .action-error")).to_have_count(0)
        page.wait_for_timeout(1500)  # a dismissed refusal does not come back with the next refresh
        expect(page.locator(f'#pending .card[data-candidate="{cid}"] .action-error')).to_have_count(0)


def test_a_quality_risk_card_says_why_the_loop_asks(tmp_path, monkeypatch):
    """What the card's "why it asks" reads (`asked_why`): the loop's own ask record, the authorisation table's
    entries as `authorise` weighed them; a budget extension's ask says so."""
    from fastapi.testclient import TestClient
    from test_api_support import TOKENS_ENV, auth

    from agent.loop.approval import permission
    from agent.planner.candidates import build_card
    from agent.loop.record import card_record
    from agent.loop.session import record_ask, waiting_reason
    from api.app import create_app
    from api.settings import Settings

    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp_path / 't.db'}",
                                  "TUNELOOP_RUNS_ROOT": str(tmp_path / "runs"), "TUNELOOP_WORKERS": "0"})
    with TestClient(create_app(settings)) as c:
        table = {"restart": "auto", "quality_risk": "ask"}
        gid = c.post("/goals", json=small_goal("qr-goal") | {"authorisation": table}, headers=auth("admin")).json()["id"]
        store = c.app.state.service.store
        spec = store.get_goal(gid).spec
        card = card_record(build_card(gid, spec.scenario, spec.start_station(), "index_cache_reuse", True,
                                      stage="screen", n=40))
        assert card["quality_risk"]
        cand = store.add_candidate(gid, card)
        perm, why = permission(card, spec.authorisation, store.budget(gid), 0.1)
        assert perm == "ask" and "quality_risk -> ask" in why and "restart -> auto" in why
        payload = {"kind": "approval", "candidate_id": cand.id, "card_hash": cand.card_hash, "card": card, "why": why}
        record_ask(store, gid, payload, waiting_reason(payload))
        got = c.get(f"/candidates/{cand.id}", headers=auth("viewer")).json()
        assert got["asked_why"] == why
        listed = c.get(f"/goals/{gid}/candidates", headers=auth("viewer")).json()
        assert [x["asked_why"] for x in listed] == [why]
        ext = {"kind": "budget_extension", "candidate_id": cand.id, "card_hash": cand.card_hash, "card_hours": 1.5,
               "experiments": 0, "why": "screen N=40: estimated 3.000 card-hours exceeds the 1.500 left"}
        record_ask(store, gid, ext, waiting_reason(ext))
        got = c.get(f"/candidates/{cand.id}", headers=auth("viewer")).json()["asked_why"]
        assert got == "budget extension needed: " + ext["why"]
