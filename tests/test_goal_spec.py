"""Goal specs: the examples load, bad input is refused naming the field and the reason."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from core.knobs import catalog
from state.errors import GoalError
from state.goal import GoalSpec, load_goal, parse_goal

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _base() -> dict:
    return yaml.safe_load((EXAMPLES / "goal-16k.yaml").read_text())


def _fields(data: dict) -> dict[str, str]:
    with pytest.raises(GoalError) as err:
        parse_goal(data, "test")
    return dict(err.value.errors)


def test_examples_load_with_their_contracts():
    g16 = load_goal(EXAMPLES / "goal-16k.yaml")
    assert g16.start_knobs["max_prefill_reqs"] == 1 and g16.start_station()["concurrency"] == 128
    assert g16.start_station()["num_prefill_instances"] == 4  # the profile's own layout: P 4x2 + D 1x8 = 16 cards
    assert g16.authorisation["hot"] == g16.authorisation["restart"] == "auto"
    c = g16.contract()
    assert (c.output_len, c.zero_cache, c.cards_required, c.all_succeed) == (1024, True, 16, True)
    assert g16.slos() == {"tpot_ms": 20.0}
    g128 = load_goal(EXAMPLES / "goal-128k.yaml")
    assert g128.contract().min_request_hit == pytest.approx(0.85) and not g128.contract().zero_cache
    assert {90, 128} <= set(g128.space()["concurrency"])


def test_json_and_yaml_give_the_same_goal(tmp_path: Path):
    p = tmp_path / "g.json"
    p.write_text(json.dumps(_base()))
    assert load_goal(p) == load_goal(EXAMPLES / "goal-16k.yaml")


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda d: d["start_knobs"].update(max_prefill_reqs=0), "start_knobs.max_prefill_reqs", "0 is below the minimum 1"),
    (lambda d: d["start_knobs"].update(warp_drive=1), "start_knobs.warp_drive", "no such knob"),
    (lambda d: d["search_space"].update(concurrency=[64, "lots"]), "search_space.concurrency", "expected an integer"),
    (lambda d: d["search_space"].update(parallel=[1, 2]), "search_space.parallel", "not a knob of engine 'sim'"),
    (lambda d: d["start_knobs"].update(speculative_method="none", num_speculative_tokens=2), "start_knobs.num_speculative_tokens",
     "needs speculative_method != 'none' first"),
    # a draft method of width 0: vLLM refuses it at start, SGLang runs no draft; refused naming both knobs
    (lambda d: d["start_knobs"].update(speculative_method="mtp", num_speculative_tokens=0),
     "start_knobs.speculative_method", "mtp with num_speculative_tokens 0 drafts nothing"),
    (lambda d: d["start_knobs"].pop("num_speculative_tokens"), "start_knobs.speculative_method",
     "set num_speculative_tokens to 1 or more, or speculative_method to none"),
    (lambda d: d["constraints"].update(tpot_mean_ms_lt=-1), "constraints.tpot_mean_ms_lt", "must be a finite number in (0, 3600000] ms"),
    (lambda d: d["constraints"].update(tpot_avg_ms_lt=20), "constraints.tpot_avg_ms_lt", "Extra inputs are not permitted"),
    (lambda d: d["constraints"].update(output_len=512), "constraints", "output_len 512 differs from scenario"),
    (lambda d: d.update(scenario="no-such-scenario"), "scenario", "no scenario named 'no-such-scenario'"),
    (lambda d: d.update(scenario="/etc/passwd"), "scenario", "no path, no suffix"),
    (lambda d: d.update(scenario="../simulator/scenarios/chat2k"), "scenario", "no path, no suffix"),
    (lambda d: d.update(sim_profile="examples/targets.yaml"), "sim_profile", "no path, no suffix"),
    (lambda d: d.update(sim_profile="no-such-profile"), "sim_profile", "no profile named 'no-such-profile'"),
    (lambda d: d["authorisation"].update(teleport="auto"), "authorisation.teleport.[key]", "Input should be"),
    (lambda d: d["authorisation"].update(restart="maybe"), "authorisation.restart", "'auto', 'ask' or 'deny'"),
    (lambda d: d["budget"].pop("card_hours"), "budget.card_hours", "Field required"),
    (lambda d: d["protocol"].update(confirm_n=100), "protocol.confirm_n", "smaller than screen_n"),
    (lambda d: d["protocol"].update(confirm_n=320), "protocol.confirm_n", "equals screen_n"),
    (lambda d: d.update(reported=["ttft_p95_ms"]), "reported", "unknown metric"),
    (lambda d: d.update(objective={"metric": "vibes"}), "objective.metric", "Input should be"),
    (lambda d: d.update(engine="tensorrt"), "engine", "unknown engine"),
    (lambda d: d.update(surprise=True), "surprise", "Extra inputs are not permitted"),
])
def test_errors_name_the_field_and_reason(mutate, field, reason):
    data = _base()
    mutate(data)
    errors = _fields(data)
    assert field in errors, errors
    assert reason in errors[field], errors


def test_every_error_is_reported_at_once_and_files_are_named(tmp_path: Path):
    data = _base()
    data["constraints"]["tpot_mean_ms_lt"] = 0
    data["budget"]["experiments"] = 0
    assert {"constraints.tpot_mean_ms_lt", "budget.experiments"} <= set(_fields(data))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(GoalError, match="bad.yaml") as err:
        load_goal(bad)
    assert err.value.errors[0][0] == "(file)"
    with pytest.raises(GoalError, match=r"\(goal\)"):
        parse_goal(["not", "a", "mapping"])


def test_default_search_space_comes_from_the_catalog():
    data = _base()
    del data["search_space"]
    g = parse_goal(data)
    space = g.space()
    sim_knobs = {k.name for k in catalog().knobs if "sim" in k.engines or k.cost_class == "hot"}
    assert set(space) == sim_knobs
    assert space["speculative_method"] == ("none", "mtp") and space["max_prefill_reqs"][:3] == (None, 1, 2)
    for name, values in space.items():  # every default value passes the catalog's own validation
        for v in values:
            catalog().get(name).coerce(v)


def test_slo_is_strict_and_frozen(make_result):
    g = load_goal(EXAMPLES / "goal-16k.yaml")
    at_limit = make_result("r", tpot=20.0).summary
    below = make_result("r", tpot=19.99).summary
    assert g.constraints.violations(below) == []
    assert any("tpot_mean_ms_lt" in v for v in g.constraints.violations(at_limit))
    assert g.objective.value(below) == pytest.approx(210.0)
    assert g.objective.value(make_result("r", native=None).summary) is None  # no native window: no figure, not 0
    with pytest.raises(Exception):
        g.constraints.tpot_mean_ms_lt = 30  # type: ignore[misc]
    assert isinstance(GoalSpec.model_validate(g.model_dump()), GoalSpec)


NUMERIC = ["constraints.tpot_mean_ms_lt", "constraints.ttft_p90_ms_lt", "constraints.output_len", "constraints.cards",
           "constraints.min_cache_hit", "protocol.screen_n", "protocol.confirm_n", "protocol.warmup",
           "protocol.native_min_requests", "protocol.native_min_seconds", "budget.card_hours", "budget.experiments",
           "stop.max_without_improvement", "stop.min_gain_pct"]


@pytest.mark.parametrize("field", NUMERIC + ["protocol.seeds.0"])
@pytest.mark.parametrize("value", ["Infinity", "1e309", "-Infinity", "NaN", str(10**20), str(10**30)])
def test_every_number_is_finite_and_bounded_naming_the_field_and_the_range(field, value):
    data = _base()
    node = data
    *parents, leaf = field.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if leaf.isdigit():
        data["protocol"]["seeds"] = [json.loads(value)]
    else:
        node[leaf] = json.loads(value)  # what a JSON body carries: Infinity, 1e309 (= inf), 10^20
    errors = _fields(data)
    assert field in errors, errors
    assert " in [" in errors[field] or " in (" in errors[field], errors[field]  # the message states the range
