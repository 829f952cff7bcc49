"""Knob roles (core/knobs.yaml `role`): the planner reads what a knob does, never what an engine calls it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent.planner.candidates import build_card
from agent.planner.deterministic import candidates, diagnosis_for
from agent.planner.history import History
from core import knobs as knobs_mod
from core.knobs import BATCH_CAP, CATALOG_ENV, ROLES, Catalog, by_role, catalog, named, role_of
from state.goal import GoalSpec
from tests.rules_support import measured_start

ROOT = Path(__file__).resolve().parents[1]


def test_every_knob_says_what_it_does_and_an_engine_has_one_knob_per_role():
    cat = catalog()
    assert all(k.role in ROLES for k in cat.knobs)
    for engine in {e for k in cat.knobs for e in k.engines}:
        roles = [k.role for k in cat.knobs if engine in k.engines]
        assert len(roles) == len(set(roles)), engine
    # one batch cap, whatever each engine names it
    assert named(BATCH_CAP, cat.defaults("sim")) == "max_num_seqs"
    assert named(BATCH_CAP, [k.name for k in cat.for_engine("llamacpp")]) == "parallel"
    assert by_role({"parallel": 4, "threads": 2}, BATCH_CAP) == 4 and by_role({"threads": 2}, BATCH_CAP) is None
    with pytest.raises(ValueError, match="no such role"):
        named("batch_capp", ["max_num_seqs"])


def test_a_catalog_that_gives_an_engine_two_batch_caps_is_refused_naming_both():
    data = yaml.safe_load((ROOT / "core" / "knobs.yaml").read_text())
    for k in data["knobs"]:
        if k["name"] == "parallel":
            k["engines"]["sim"] = "parallel"
    with pytest.raises(ValueError, match="parallel: engine 'sim' already has 'max_num_seqs' as its batch_cap"):
        Catalog.model_validate(data)


def _renamed(tmp_path: Path, old: str, new: str) -> Path:
    """core/knobs.yaml with one knob renamed (its role, flags and values kept): another engine's name for it."""
    data = yaml.safe_load((ROOT / "core" / "knobs.yaml").read_text())
    for k in data["knobs"]:
        if k["name"] == old:
            k["name"] = new
    p = tmp_path / "site-knobs.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _respelled(h: History) -> History:
    """The same measured start, its goal and station spelling the batch cap max_running_requests."""
    goal = GoalSpec.model_validate(json.loads(h.goal.model_dump_json().replace("max_num_seqs", "max_running_requests")))
    best = {("max_running_requests" if k == "max_num_seqs" else k): v for k, v in h.best_knobs.items()}
    ref = h.outcomes[0]
    card = build_card(h.goal_id, goal.scenario, best, None, None, stage="baseline", n=ref.card.n)
    return History(goal_id=h.goal_id, goal=goal, data_version=h.data_version, best_knobs=best, warm_knobs=best,
                   outcomes=[ref.model_copy(update={"card": card})], budget_left_card_hours=h.budget_left_card_hours,
                   experiments_left=h.experiments_left)


def _moves(history: History, spell: dict[str, str]) -> list[tuple[str, float, str]]:
    out = []
    for card, v in candidates(history, diagnosis_for(history)):
        title, why = card.title(), v.why
        for a, b in spell.items():
            title, why = title.replace(a, b), why.replace(a, b)
        out.append((title, v.value, why))
    return out


@pytest.mark.parametrize("case", ["llama70b-h100-decode-bound", "llama33-70b-910b-above-slo"])
def test_a_batch_cap_named_max_running_requests_gets_the_same_moves_as_max_num_seqs(tmp_path, monkeypatch, case):
    """SGLang calls its batch cap --max-running-requests: a catalog whose batch cap has that name gets the same
    valued moves, hypothesis for hypothesis, from the same measured evidence as one whose cap is max_num_seqs."""
    h = measured_start(tmp_path, case)
    plain = _moves(h, {})
    # the batch cap's moves are among them, valued by its rules (a raise where decode is at its limit, a cut
    # where the best breaks the TPOT limit); their size is the rules' (decode's own KV use, not the pool's, since
    # issue 55: the decode-bound start's raise is 0.088 with decode's KV at 25 %), the test is that they are there
    assert any(": max_num_seqs " in t and v > 0 for t, v, _ in plain), plain

    monkeypatch.setenv(CATALOG_ENV, str(_renamed(tmp_path, "max_num_seqs", "max_running_requests")))
    assert "max_running_requests" in catalog() and "max_num_seqs" not in catalog()
    assert role_of("max_running_requests") == BATCH_CAP
    h2 = _respelled(h)
    renamed = _moves(h2, {"max_running_requests": "max_num_seqs"})
    assert renamed == plain


def test_without_the_role_the_renamed_cap_would_be_a_stranger(tmp_path, monkeypatch):
    """The check above can fail: a knob with the batch cap's name but no role gets none of its moves."""
    data = yaml.safe_load(_renamed(tmp_path, "max_num_seqs", "max_running_requests").read_text())
    for k in data["knobs"]:
        if k["name"] == "max_running_requests":
            del k["role"]
    p = tmp_path / "no-role.yaml"
    p.write_text(yaml.safe_dump(data))
    h = measured_start(tmp_path, "llama70b-h100-decode-bound")
    plain = _moves(h, {})
    monkeypatch.setenv(CATALOG_ENV, str(p))
    h2 = _respelled(h)
    assert _moves(h2, {"max_running_requests": "max_num_seqs"}) != plain


@pytest.fixture(autouse=True)
def _fresh_catalog():
    knobs_mod._load.cache_clear()
    yield
    knobs_mod._load.cache_clear()
