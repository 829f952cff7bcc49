"""Coupled-pair cards (issue 16 item 3) on real simulator evidence of the bench's library profiles: where the
evidence names a coupling the planner proposes the pair, saying which coupling and which evidence, and the pair
passes the same checks as a one-change card; a pair with a known negative or a veto in it is refused; where no
coupling is named the one-change cards are exactly what they were; the explorer keeps a TPE suggestion's two
largest changes only once every one-change neighbour of the best is measured or ruled out."""
from __future__ import annotations

from agent.loop.approval import _title
from agent.planner.candidates import build_card, change_words
from agent.planner.checks import check
from agent.planner.refusals import RefusalKind
from agent.planner.proposers.explorer import propose
from agent.planner.history import Negative, Veto
from agent.planner.pairs import build_pair
from agent.planner.deterministic import DeterministicPlanner, candidates, closes_hypothesis, diagnosis_for, ruled_out
from agent.loop.record import card_of, card_record
from tests.rules_support import measure, measured_start

MTP = "deepseek-v3-910c-wider-mtp-wins"  # acceptance per position values k 1 -> 2; decode batch at its limit


def _pairs(h):
    return [(c, v) for c, v in candidates(h, diagnosis_for(h)) if c.also is not None]


def test_a_named_coupling_gives_a_pair_card_that_passes_the_same_checks(tmp_path):
    h = measured_start(tmp_path, MTP).model_copy(update={"warm_knobs": None})
    pairs = {c.hypothesis: (c, v) for c, v in _pairs(h)}
    assert set(pairs) == {"spec_acceptance", "client_supply"}
    client, _ = pairs["client_supply"]  # C = the decode limit (96, one instance): the client cannot fill more
    assert (client.change.knob, client.change.new, client.also.knob, client.also.new) == ("concurrency", 128,
                                                                                          "max_num_seqs", 128)
    assert "the client cannot fill a larger batch (C=96 over 1 decode instance(s) is no more than the limit)" in client.coupling
    assert not check(client, h)
    held = next(v for c, v in candidates(h, diagnosis_for(h)) if c.also is None and c.change.knob == "concurrency"
                and c.change.new == 128)
    assert "held alone:" in held.why  # the evidence says C alone only queues: valued below the pair
    card, v = pairs["spec_acceptance"]
    assert (card.change.knob, card.change.old, card.change.new) == ("num_speculative_tokens", 1, 2)
    assert (card.also.knob, card.also.old, card.also.new) == ("max_num_seqs", 96, 128)
    assert "acceptance model values k 1 -> 2" in card.coupling and "decode batch is held at its limit" in card.coupling
    assert "the decode batch must change with it" in card.coupling and "coupled pair:" in v.why
    assert card.knobs == h.best_knobs | {"num_speculative_tokens": 2, "max_num_seqs": 128}
    assert card.parent_knobs_hash == h.best_knobs_hash and card.hypothesis == "spec_acceptance"
    assert card.cost_class == "restart" and not check(card, h)
    assert card.title() == "screen N=320: num_speculative_tokens 1 -> 2 + max_num_seqs 96 -> 128"
    stored = card_record(card)  # stored, shown for approval and read back as the same card
    assert _title(stored) == card.title() and card_of(stored).content_hash == card.content_hash
    assert change_words(stored, fmt=str) == "num_speculative_tokens 1 -> 2 + max_num_seqs 96 -> 128"
    assert "also" not in card_record(build_card("g1", "s", {}, "max_num_seqs", 8, stage="screen", n=1))
    plan = DeterministicPlanner().ask(h)  # the pair is worth more than either change alone here
    assert plan.card is not None and plan.card.experiment_key == card.experiment_key, plan.ranked
    # its negative closes the coupling it tested once, never either change's hypothesis alone
    neg = measure(tmp_path, h.goal, card, "negative")
    assert closes_hypothesis("negative", card, h) == "spec_acceptance (coupled num_speculative_tokens + max_num_seqs)"
    after = h.model_copy(update={"outcomes": h.outcomes + [neg]})
    assert ruled_out(after) == {"spec_acceptance (coupled num_speculative_tokens + max_num_seqs)"}
    assert closes_hypothesis("negative", card, after) is None


def test_the_checks_hold_for_both_changes_of_a_pair(tmp_path):
    h = measured_start(tmp_path, MTP).model_copy(update={"warm_knobs": None})
    card = next(c for c, _ in _pairs(h) if c.hypothesis == "spec_acceptance")
    for knob, value in (("max_num_seqs", 128), ("num_speculative_tokens", 2)):  # a negative of either change
        neg = Negative(knob=knob, value=value, scenario=h.goal.scenario, data_version="dv1",
                       parent_station=h.best_knobs_hash, source_identity="sim", experiment_key="x1")
        hn = h.model_copy(update={"negatives": [neg]})
        assert any(str(r).startswith(f"known_negative: {knob}={value}") for r in check(card, hn))
        assert all(check(c, hn) for c, _ in _pairs(hn) if (knob, value) in [(x.knob, x.new) for x in c.changes])
        assert DeterministicPlanner().ask(hn).card.experiment_key != card.experiment_key
        veto = Veto(knob=knob, value=value, scenario=h.goal.scenario, data_version="dv1",
                    parent_station=h.best_knobs_hash, source_identity="sim", who="ops")
        assert any(r.kind is RefusalKind.REJECTED for r in check(card, h.model_copy(update={"vetoes": [veto]})))
    bare = card.model_copy(update={"coupling": None})
    assert "one_change: a second change needs the coupling the evidence names" in map(str, check(bare, h))
    cheap = card.model_copy(update={"cost_class": "hot"})
    assert any(str(r).startswith("cost_class: a coupled pair costs its dearer change's class (restart)") for r in check(cheap, h))
    elsewhere = card.model_copy(update={"parent_knobs": h.best_knobs | {"concurrency": 128}})
    assert "parent: a screen starts from the current best station" in map(str, check(elsewhere, h))
    same = build_pair(h, ("max_num_seqs", 128), ("max_num_seqs", 160), coupling="x")
    assert any(str(r).startswith("one_change: a coupled pair must change its two knobs") for r in check(same, h))


def test_no_pair_where_no_coupling_is_named_and_one_change_cards_are_unchanged(tmp_path):
    # the sender starves the server (no full slots); the flat case has no TPOT headroom for a bigger load
    for case in ("qwen25-32b-h100-starved-sender", "llama31-8b-910b-flat", "llama70b-h100-decode-bound"):
        h = measured_start(tmp_path, case)
        cards = candidates(h, diagnosis_for(h))
        assert cards and all(c.also is None and c.coupling is None for c, _ in cards), case
    # a one-change card hashes as it did before pairs existed (run ids and approvals stay what they were)
    c = build_card("g1", "code4k", {"num_speculative_tokens": 1, "max_num_seqs": 96, "concurrency": 96},
                   "max_num_seqs", 128, stage="screen", n=320)
    assert (c.content_hash, c.experiment_key) == ("a9a35ee44e84fd2ed94ba693", "c108d6364e61b4a3")
    assert "also" not in c.model_dump(exclude_none=True) and c.title() == "screen N=320: max_num_seqs 96 -> 128"


def test_the_explorer_pairs_only_once_every_one_change_neighbour_is_measured(tmp_path):
    h = measured_start(tmp_path, MTP).model_copy(update={"warm_knobs": None})
    props, _ = propose(h, "test")
    assert props and all(p.card.also is None for p in props)  # one-change neighbours left: no pair
    space = h.goal.space()
    outs = [measure(tmp_path, h.goal, build_card("g1", h.goal.scenario, h.best_knobs, k, v, stage="screen", n=320),
                    "negative")
            for k, vs in space.items() for v in vs if v != h.best_knobs.get(k)]
    spent = h.model_copy(update={"outcomes": h.outcomes + outs})
    props, told = propose(spent, "test")
    assert told == len(outs) + 1 and props
    for p in props:
        card = p.card
        assert card.also is not None and card.mechanism.endswith("(pair)") and card.hypothesis == "exploration"
        assert card.coupling.startswith("exploration: every one-change neighbour of the best station is measured or ruled out")
        assert p.prediction.ei > 0 and not check(card, spent) and card.parent_knobs_hash == spent.best_knobs_hash
    neg = Negative(knob=props[0].card.also.knob, value=props[0].card.also.new, scenario=h.goal.scenario,
                   data_version="dv1", parent_station=h.best_knobs_hash, source_identity="sim", experiment_key="x")
    after, _ = propose(spent.model_copy(update={"negatives": [neg]}), "test")
    assert props[0].card.experiment_key not in {p.card.experiment_key for p in after}


def test_a_person_rejecting_a_pair_card_vetoes_that_pair_and_neither_change_alone(tmp_path):
    """Through `tuneloop run` and `tuneloop approve --reject`: the loop asks for a multi-change card (the twin's
    jump, the twin being on by default), a person refuses it, and the next card is something else; the stored veto
    is of the changes together, so the draft width alone is still a card the checks pass (refusing the changes
    together says nothing of either)."""
    import yaml

    from agent.loop.record import build_history
    from state.store import Store
    from tests.rules_support import goal_of
    from tests.test_loop_cli import tuneloop

    g = goal_of(MTP).model_dump(mode="json", exclude_none=True)
    g["authorisation"] |= {"hot": "ask", "restart": "ask"}
    g["budget"]["experiments"] = 6
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump(g))
    db = f"sqlite:///{tmp_path / 't.db'}"

    def asked() -> dict:
        out = tuneloop(tmp_path, "run", str(goal), "--db", db)
        assert "waiting: approve candidate" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
        cid = int(out.stdout.split("waiting: approve candidate ", 1)[1].split()[0])
        st = Store(db)
        try:
            return {"id": cid, **st.get_candidate(cid).card}
        finally:
            st.close()

    card = asked()
    for _ in range(3):  # the start's reference(s) first
        if card.get("also"):
            break
        assert card["change"] is None, card  # no other move before the pair on this profile
        assert tuneloop(tmp_path, "approve", str(card["id"]), "--db", db).returncode == 0
        card = asked()
    assert card.get("also") and card.get("coupling"), card
    first, second = card["change"], card["also"]
    # with the goal's twin on (the default) the multi-change card is the twin's jump (the draft width and C), which
    # leads before the rules' evidence-named pair (the draft width and max_num_seqs); either is vetoed as a whole
    assert first["knob"] == "num_speculative_tokens" and card["note"].startswith("led by the twin"), card
    more = [(c["knob"], c["new"]) for c in card.get("more") or ()]
    r = tuneloop(tmp_path, "approve", str(card["id"]), "--reject", "--reason", "not both at once", "--db", db)
    assert r.returncode == 0, r.stderr
    nxt = asked()
    assert nxt["experiment_key"] != card["experiment_key"]
    st = Store(db)
    try:
        gid = st.goals()[0].id
        h = build_history(st, gid)
        [veto] = h.vetoes
        assert (veto.knob, veto.value, veto.also_knob, veto.also_value) == (first["knob"], first["new"],
                                                                            second["knob"], second["new"])
        assert [(k, v) for k, v in veto.more] == more
        rejected = [d for d in st.decisions(gid) if d.kind == "rejected"]
        assert len(rejected) == 1 and f" + {second['knob']}" in rejected[0].text
        assert "not both at once" in rejected[0].text
        pair = card_of({k: v for k, v in card.items() if k != "id"})
        assert h.vetoed(pair) is veto and any(r.kind is RefusalKind.REJECTED for r in check(pair, h))
        alone = build_card(gid, pair.scenario, h.best_knobs, first["knob"], first["new"], stage=pair.stage, n=pair.n)
        assert h.vetoed(alone) is None and not [r for r in check(alone, h) if r.kind is RefusalKind.REJECTED]
    finally:
        st.close()
