"""The deterministic planner (the default; no LLM): history in, the next card or None out (ask/tell).

Order of business: a reference of the starting station at confirm N (a screen-N reference of the best station
only before a screen); then a recovery of a gain the goal cannot
take as it is (agent.planner.recovery: a lost native window, a load gain that broke only a decode-side latency limit); then any promising
screen is confirmed (with a reference of its parent at confirm N first, so the comparison is like for like);
then the diagnosis of the best station's latest evidence ranks moves by value, each passed through `checks`.
None means stop: nothing left is worth its cost, or too many experiments in a row changed nothing.
"""
from __future__ import annotations

from agent.planner.candidates import CandidateCard, build_card, direction_of, rule_for, station_hash, with_stage
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import budget_only, check, estimate, said
from agent.planner.diagnosis import OPEN_LOW, Diagnosis, diagnose
from agent.planner.history import History
from agent.planner.pairs import hold, pair_hypothesis
from agent.planner.plan import Plan, PlanRow
from agent.planner.proposers import RANK, RECOVER, Asking
from agent.planner.proposers.guarded import asked
from agent.planner.proposers.twin_search import RULES_LED, likely
from agent.planner.rules.spec_acceptance import fitted_cost
from agent.planner.screens import screen_blind, to_confirm
from agent.planner.stops import MIN_VALUE, explore_or_stop
from agent.planner.value import Value
from core.station import full_knobs  # the deployed station: catalog defaults filled in (the token budget)

DRAFT_COST_DIGITS = 4  # a fitted draft position's cost (relative to a decode step) is kept to 1/10000
REF_SCREEN_CONFIRM = 3  # screening a best confirmed at confirm N only: its screen-N reference, the screen, the confirm
SCREEN_CONFIRM = 2  # screening a best with its screen-N reference at hand: the screen and its confirm


def ruled_out(history: History) -> set[str]:
    """Hypotheses a valid negative from the best station has tested (the rule its move named)."""
    out: set[str] = set()
    for o in history.outcomes:
        if o.decision != "negative" or o.card.change is None or o.card.parent_knobs_hash != history.best_knobs_hash:
            continue
        if o.card.multi:  # a coupled pair tests its coupling, not either change's hypothesis alone
            out.add(pair_hypothesis(o.card))
            continue
        c = o.card.change
        rule = rule_for(c.knob, direction_of(c))
        if not rule.tradeoff:
            out.update(rule.hypotheses)
    return out


def closes_hypothesis(outcome: str, card: CandidateCard, history: History) -> str | None:
    """The hypothesis a valid negative from the best station closes (one no earlier negative from it had tested):
    a closed hypothesis is a changed decision (the diagnosis, and so the next move, changes). None otherwise."""
    c = card.change
    if outcome != "negative" or c is None or card.parent_knobs_hash != history.best_knobs_hash:
        return None
    if card.multi:
        h = pair_hypothesis(card)
        return h if h not in ruled_out(history) else None
    rule = rule_for(c.knob, direction_of(c))
    if rule.tradeoff:
        return None
    return next((h for h in rule.hypotheses if h not in ruled_out(history)), None)


def diagnosis_for(history: History) -> Diagnosis | None:
    """The diagnosis of the best station's latest valid run; computed once per History and kept with it."""
    if not history._diagnosed:
        history._diagnosis, history._diagnosed = _diagnose(history), True
    return history._diagnosis


def carry_diagnosis(history: History, state: dict) -> None:
    """Keep the diagnosis the graph state carries (the diagnose node's) with this History, so the planner reads
    that one even when the History was rebuilt after diagnose (a restart between the two nodes)."""
    if "diagnosis_data" in state and not history._diagnosed:
        data = state["diagnosis_data"]
        history._diagnosis = Diagnosis.model_validate(data) if data is not None else None
        history._diagnosed = True


def _diagnose(history: History) -> Diagnosis | None:
    ref = history.latest_valid(history.best_knobs)
    if ref is None or ref.summary is None:
        return None
    knobs = full_knobs(history.best_knobs, history.goal.engine)
    d = diagnose(ref.summary, ref.evidence, history.goal.view().limits, knobs, ruled_out(history))
    fit = fitted_cost(history, history.best_knobs) if d.spec_positions is not None else None
    if fit is not None:  # the measured widths price a position (verification too), not the draft share alone
        d = d.model_copy(update={"draft_cost": round(fit[0], DRAFT_COST_DIGITS), "draft_cost_why": fit[1]})
    return d


def _pending_confirm(history: History) -> CandidateCard | None:
    done = history.finished_keys
    for o in history.outcomes:
        if o.decision == "promising":
            conf = with_stage(o.card, "confirm", history.goal.protocol.confirm_n)
            if conf.experiment_key not in done and history.vetoed(conf) is None:  # a rejected confirm is skipped
                return conf
    return None


def extension_allowed(history: History) -> bool:
    """`budget_extension: ask` (or auto, which never extends without a person): the confirm of a promising screen
    (or the recovery of a confirmed gain) the budget cannot pay for is proposed anyway, and the loop asks a person
    for the extension instead of stopping."""
    return history.goal.authorisation.get("budget_extension", "ask") != "deny"


def _stale_streak(history: History) -> int:
    """Valid experiments in a row (screen/confirm) that changed no decision."""
    streak = 0
    for o in reversed(history.outcomes):
        if o.card.stage == "baseline" or o.verdict != "valid":
            continue
        if o.decision in ("negative",):
            streak += 1
        else:
            break
    return streak


def _native_missing(history: History) -> bool:
    """The objective is read in the native window and the best station's latest run has none."""
    ref = history.latest_valid(history.best_knobs)
    return history.goal.objective.window == "native" and ref is not None and ref.summary is not None \
        and ref.summary.native is None


def candidates(history: History, diag: Diagnosis | None) -> list[tuple[CandidateCard, Value]]:
    """Every rank-phase proposer's moves from the best station, pooled and valued (unchecked), best first: the
    value per card-hour every move is ranked by. A proposer's holds (an exclusive coupling) cut the value of the
    one-change moves they name to HELD_ALONE of what it was (the pair runs first; each alone stays open)."""
    return pooled(history, diag)[0]


def pooled(history: History, diag: Diagnosis | None) -> tuple[list[tuple[CandidateCard, Value]], str]:
    """`candidates`, and why the leading model says nothing is left to gain ("" when none says so)."""
    goal = history.goal
    restart = history.cost.estimate("restart", goal.protocol.screen_n, goal.protocol.warmup, needs_restart=True)
    asking = Asking(history, diag, restart=restart, native_missing=_native_missing(history))
    pooled, held, led = [], {}, []
    lead, judge, yields, settled = "", None, [], ""
    for proposer in RANK:
        got = asked(proposer, asking)  # a proposer that raises yields with its reason
        if got.lead and not lead:
            lead, judge, settled = got.lead, got.judge, got.settled
            led += [(p.card, p.value) for p in got.moves if p.value is not None]
        else:
            pooled += [(p.card, p.value) for p in got.moves if p.value is not None]
        held.update(got.holds)
        if got.yields:
            yields.append(got.yields)
    out = [hold(card, v, held) for card, v in pooled]
    if judge is not None:  # the leading model values every other move too (a move it cannot predict keeps its own)
        out = [judge(card) or (card, v) for card, v in out]
    out = [(_noted(card, lead), v) for card, v in led] + [(_noted(card, lead or "; ".join(
        f"{RULES_LED}: {y}" for y in yields)), v) for card, v in out]
    out.sort(key=lambda cv: (-cv[1].value, cv[0].title()))
    # one experiment once: the leading twin's own card and a rule's card for the same station, stage and N are one
    # candidate (else a person's one refusal reads as "2 of the 4 remaining candidates"); the first, ranked higher
    # (the leader's on a tie), stays
    seen: set[str] = set()
    out = [cv for cv in out if cv[0].experiment_key not in seen and not seen.add(cv[0].experiment_key)]
    return out, settled


def _noted(card: CandidateCard, why: str) -> CandidateCard:
    """The card, saying which proposer led its ranking and why."""
    if not why or why in (card.note or ""):
        return card
    return card.model_copy(update={"note": "; ".join(x for x in (card.note, why) if x)})


def worth_running(passing: list[tuple[CandidateCard, Value]]) -> tuple[CandidateCard, Value] | None:
    """The first card worth a run, in rank order: the top card when its value reaches the rules' least value
    (MIN_VALUE), else the first card the twin, leading, calls more likely than not to gain the least gain (its own
    calibrated chance, agent/planner/proposers/twin_search.py); None when no card is worth a run."""
    if passing and passing[0][1].value >= MIN_VALUE:
        return passing[0]
    return next((cv for cv in passing if likely(*cv)), None)


class DeterministicPlanner:
    name = "deterministic"

    def ask(self, history: History) -> Plan:
        goal = history.goal
        if history.experiments_left < 1:
            conf = _pending_confirm(history) if extension_allowed(history) else None
            if conf is None:
                return Plan(card=None, stop_reason="experiment budget spent")
            return self._confirm(conf, history, diagnosis_for(history))  # asks a person to extend the budget
        ref = history.reference(history.best_knobs, goal.protocol.screen_n)
        # a best confirmed at confirm N only (a recovery, a direct confirm) is compared there; its screen-N
        # reference is measured only when screens will follow (below)
        at_confirm = history.best_at_confirm_only()
        if ref is None and not at_confirm:
            # the first reference runs at confirm N: every later comparison can use it (a confirm compares there,
            # and its evidence is the longer run's), and the screen-N reference is measured only when a screen
            # follows (at_confirm, below) — a first move that goes straight to confirm needs none
            card = build_card(history.goal_id, goal.scenario, history.best_knobs, None, None, stage="baseline",
                              n=goal.protocol.confirm_n)
            refusals = check(card, history)
            if refusals and budget_only(refusals):  # a budget that pays a screen-N one
                card = with_stage(card, "baseline", goal.protocol.screen_n)
            veto = history.vetoed(card)
            if veto is not None:
                return Plan(card=None, stop_reason=f"nothing left that was not rejected: the reference of the "
                                                   f"starting station was {veto.how()}")
            return self._checked(card, history, None, "reference of the starting station")
        diag = diagnosis_for(history)
        if goal.protocol.confirm_n != goal.protocol.screen_n and not any(o.card.stage != "baseline" for o in history.outcomes) \
                and history.reference(history.best_knobs, goal.protocol.confirm_n) is None \
                and history.warm_knobs is not None and station_hash(history.warm_knobs) == history.best_knobs_hash:
            # the start is warm now: its confirm-N reference costs a hot run, after the first move a restart
            card = build_card(history.goal_id, goal.scenario, history.best_knobs, None, None, stage="baseline",
                              n=goal.protocol.confirm_n)
            if not check(card, history):  # optional: a saving, never a reason to stop
                return self._checked(card, history, diag, f"reference of the starting station at N={card.n} while it is warm")
        ext = extension_allowed(history)
        for proposer in RECOVER:  # a confirmed gain the goal cannot take as it is, kept before anything new
            for rec in asked(proposer, Asking(history, diag)).moves:
                if history.vetoed(rec.card) is None:  # a rejected recovery: the planner moves on
                    return self._checked(rec.card, history, diag, rec.why, extension_ok=ext)
        conf = _pending_confirm(history)
        if conf is not None:
            plan = self._confirm(conf, history, diag)
            if plan is not None:
                return plan
        # too few experiments left for a reference, a screen and its confirm: every move goes to confirm N at once
        direct = history.experiments_left < (REF_SCREEN_CONFIRM if at_confirm else SCREEN_CONFIRM) and (
            at_confirm or history.reference(history.best_knobs, goal.protocol.confirm_n) is not None)
        ref_card = build_card(history.goal_id, goal.scenario, history.best_knobs, None, None, stage="baseline",
                              n=goal.protocol.screen_n)
        if at_confirm and history.vetoed(ref_card) is not None:
            direct = True  # a person rejected the reference: the moves go straight to confirm N
        stale = _stale_streak(history) >= goal.stop.max_without_improvement
        ranked: list[PlanRow] = []
        passing: list[tuple[CandidateCard, Value]] = []
        left = (f"{history.experiments_left} experiment(s) left cannot pay a reference, a screen and its confirm"
                if direct else None)
        found, settled = pooled(history, diag)
        cands = [(card, v, check(card, history)) for card, v in found]
        screens = sum(1 for c, _, r in cands if not r and c.stage == "screen")  # would share a screen-N reference
        for card, v, refusals in cands:
            why_direct = left or _cheaper_direct(card, v, history, screens) or screen_blind(card, history, v.gain)
            if why_direct and not refusals:
                card = straight_to_confirm(card, history, why_direct)
                refusals = check(card, history)
            ranked.append(PlanRow.of(card.title(), v.value, v.why, refusals))
            if not refusals:
                passing.append((card, v))
        chosen = worth_running(passing)
        if chosen is not None and not stale:
            card, v = chosen
            # a move the twin, leading, values at even odds or better keeps its place: the twin ranked every move by
            # its predicted gain per card-hour over the whole space, restarts priced in
            hot = hot_while_warm(passing, history) if not likely(card, v) else None
            if hot is not None and hot[0] is not card:
                card = hot[0]
                ranked.append(PlanRow.of(card.title(), hot[1].value, "runs first: a hot move on the warm best station; "
                                                                     "after a restart elsewhere it would cost a restart too"))
            plan = Plan(card=card, diagnosis=diag, ranked=ranked, move=True)
        elif settled and not stale:  # the twin, predicting the runs, searched the space: nothing left to gain
            plan = Plan(card=None, diagnosis=diag, ranked=ranked, stop_reason=settled)
        else:
            restage = (lambda c: straight_to_confirm(c, history, left or "the best station has no screen-N "  # noqa: E731
                                                     "reference to screen against")) if direct or at_confirm else None
            plan = explore_or_stop(history, diag, ranked, passing, stale, restage)
        if at_confirm and plan.card is not None and plan.card.stage == "screen":
            # the move is screened: the best station (confirmed at confirm N only) needs its screen-N reference
            return self._checked(ref_card, history, diag, f"reference of the best station at N={ref_card.n}: "
                                                          f"the screen compares with it")
        return plan

    def _confirm(self, conf: CandidateCard, history: History, diag: Diagnosis | None) -> Plan | None:
        """The confirm of a promising screen (its parent's reference at the confirm N first); when only the budget
        refuses it and extensions may be asked for, proposed anyway (the loop asks). None: the reference was
        rejected by a person, so the confirm cannot be compared (the planner moves on)."""
        ext = extension_allowed(history)
        if history.reference(conf.parent_knobs, conf.n) is None:
            base = build_card(history.goal_id, history.goal.scenario, conf.parent_knobs, None, None,
                              stage="baseline", n=conf.n)
            if history.vetoed(base) is not None:
                return None
            return self._checked(base, history, diag, f"reference of the parent at N={conf.n} before confirming",
                                 extension_ok=ext)
        return self._checked(conf, history, diag, "confirm a promising screen", extension_ok=ext)

    @staticmethod
    def _checked(card: CandidateCard, history: History, diag: Diagnosis | None, why: str,
                 extension_ok: bool = False) -> Plan:
        refusals = check(card, history)
        if refusals and extension_ok and budget_only(refusals):
            card = card.model_copy(update={"est_card_hours": round(estimate(card, history), CARD_HOURS_DIGITS)})
            return Plan(card=card, diagnosis=diag, ranked=[PlanRow.of(card.title(), 1.0, f"{why}; needs a budget extension: "
                                                                      + said(refusals))])
        if refusals:
            spent = "budget spent: " if budget_only(refusals) else ""
            return Plan(card=None, diagnosis=diag, ranked=[PlanRow.of(card.title(), 0.0, "", refusals)],
                        stop_reason=f"{spent}cannot run the {why}: " + said(refusals))
        card = card.model_copy(update={"est_card_hours": round(estimate(card, history), CARD_HOURS_DIGITS)})
        return Plan(card=card, diagnosis=diag, ranked=[PlanRow.of(card.title(), 1.0, why)])


def _cheaper_direct(card: CandidateCard, v: Value, history: History, screens: int) -> str | None:
    """Why a move skips its screen: the screen path costs more card-hours than the confirm alone. The screen path
    is the parent's screen-N reference where it is missing (its share: every passing screen of this plan would
    compare with it), the screen, and, with the probability that the screen passes (the move's confidence), the
    confirm on the station the screen left warm. A restart is paid once on either path, so the choice turns on the
    load a failed screen saves against the chance of paying for the confirm as well, and on a reference still to
    be measured. Needs the parent's run at the confirm N to compare a confirm with. None: screen first."""
    goal = history.goal
    conf_n = goal.protocol.confirm_n
    if conf_n == goal.protocol.screen_n or card.stage != "screen" \
            or history.reference(card.parent_knobs, conf_n) is None:
        return None
    direct = estimate(with_stage(card, "confirm", conf_n), history)
    screen = estimate(card, history)
    ref = 0.0
    if history.reference(card.parent_knobs, card.n) is None:
        ref_card = build_card(history.goal_id, goal.scenario, card.parent_knobs, None, None, stage="baseline", n=card.n)
        ref = estimate(ref_card, history) / max(1, screens)
    p = min(1.0, max(0.0, v.confidence))
    then = history.cost.estimate("hot", conf_n, goal.protocol.warmup, needs_restart=False)
    path = ref + screen + p * then
    if direct > path:
        return None
    parts = (f"{ref:.2f} reference share + " if ref else "") + f"{screen:.2f} screen + {p:.2f} x {then:.2f} confirm"
    return (f"the confirm alone ({direct:.2f} card-h) costs no more than screening first ({parts} = {path:.2f} card-h)")


straight_to_confirm = to_confirm  # the screen card re-staged as its confirm (agent/planner/screens.py)


def hot_while_warm(passing: list[tuple[CandidateCard, Value]],
                   history: History) -> tuple[CandidateCard, Value] | None:
    """The best hot move worth its cost, testing a hypothesis the evidence leaves open, while the service runs
    the best station: done now it costs a load, after a restart move (the service moves away) a restart too."""
    if history.warm_knobs is None or station_hash(history.warm_knobs) != history.best_knobs_hash:
        return None
    # a trade-off move (lower C) aims at the objective only when it may give the missing native window
    window = _native_missing(history)
    # never a change of a passing coupled pair: its negative alone would refuse the pair (a known negative in it)
    paired = {(x.knob, repr(x.new)) for p, _ in passing if p.multi for x in p.changes}
    return next(((c, v) for c, v in passing if c.cost_class == "hot" and v.value >= MIN_VALUE
                 and c.hypothesis is not None and v.confidence >= OPEN_LOW and (window or not _tradeoff(c))
                 and (c.change is None or (c.change.knob, repr(c.change.new)) not in paired)), None)


def _tradeoff(card: CandidateCard) -> bool:
    """A move that may lose on the objective to win on latency."""
    c = card.change
    return c is not None and rule_for(c.knob, direction_of(c)).tradeoff
