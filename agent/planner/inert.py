"""Inert changes (issue 38): no card runs whose change the evidence shows cannot move the objective.

A cap that does not bind cannot move the objective by going up, so a card that raises one is refused by
`checks.check` (every card passes there: the rules' moves, the explorer's, coupled pairs, any future proposer's).
The parent station's latest valid run is the evidence (for a screen that is the best station), read per change:
* the client cap C (role client_cap): the run's achieved concurrency (the objective's window where it has one,
  as the client_supply rule reads it) clearly below its C: the clients were never all in flight, so a higher C
  cannot add load (the arrival rate, or the sender, is what holds it down);
* the prefill request cap (prefill_request_cap): the prefill batches already fill the token budget
  (rules/prefill_supply.py prefill_limit, its BUDGET_FULL): a higher request cap cannot add tokens to a full batch;
* the batch cap (batch_cap): the decode batch's peak (per engine) clearly below the cap: it never bound.
A coupled pair is refused when every change in it is inert (one change that binds moves the objective), or when
its one other change cuts the offered load (a lower C or arrival rate: a cap idle at the parent's load stays idle
at a lower one, so the pair learns only what the cut alone would; the explorer's pairs did this on the bench).
Lowering a cap is never refused here (a smaller batch can move latency). Where the run lacks the figure (a real
engine that does not export it), or the card's own station was measured already (the confirm of a screen that
ran: a measurement outranks the evidence's reading), nothing is refused.

The exception the issue allows ("unless it says what it would rule out and is the cheapest way to learn it") is
kept narrow and read off the card alone: its `hypothesis` is one of the diagnosis's named hypotheses, not one its
own move's rule ties to the change (that is the question the evidence has just answered), not yet tested negative
from this parent; its `negative_rules_out` says something other than the move table's wording for the change; and
no knob of the goal's space whose move tests that hypothesis is of a cheaper cost class than the card. The rules'
moves (hypothesis = their own rule's) and the explorer's (hypothesis "exploration") never meet it; a proposer
that argues a run for a different open hypothesis can.
"""
from __future__ import annotations

from agent.planner.cards import CandidateCard, Change, direction_of
from agent.planner.history import History, Outcome
from agent.planner.refusals import Refusal, RefusalKind
from agent.planner.rules import MOVES, NAMES
from agent.planner.rules.prefill_supply import prefill_limit
from core.knobs import ARRIVAL_RATE, BATCH_CAP, CLIENT_CAP, COST_ORDER, PREFILL_REQUEST_CAP, KnobError, catalog, role_of
from core.station import full_knobs

LOAD_KNOBS = (CLIENT_CAP, ARRIVAL_RATE)  # the roles that set the offered load: cutting it never makes a cap bind

# a cap's figure (achieved concurrency on average, the decode batch at its sampled peak) under 80 % of the cap:
# a fifth of its slots stay free, clearly beyond the 85-90 % at which the rules already call a filled cap binding
# (load_headroom C_FILLED, client_supply CAP_FILLED) and beyond a sampled gauge's miss of a peak (AT_LIMIT's 5 %);
# relative, so it reads the same at C=16 as at C=512
CLEAR_OF_CAP = 0.8  # a judgement: a fifth of the cap's slots free is clearly not binding


def inert_refusal(card: CandidateCard, history: History) -> Refusal | None:
    """The refusal of a card whose every change the parent's latest valid run shows cannot move the objective
    (with the evidence's figures), or None: a change that may bind, no evidence, or the narrow exception."""
    if not card.changes or card.stage == "baseline" or history.latest_valid(card.knobs) is not None:
        return None
    run = history.latest_valid(card.parent_knobs)
    if run is None:
        return None
    whys = [inert_why(c, run, history) for c in card.changes]
    idle = [w for w in whys if w is not None]
    if not idle:
        return None
    if len(idle) < len(whys):  # a pair with one idle raise: inert only beside a cut of the offered load
        cut = next(c for c, w in zip(card.changes, whys) if w is None)
        if role_of(cut.knob) not in LOAD_KNOBS or direction_of(cut) != "down":
            return None
        idle.append(f"{cut.knob} {cut.old!r} -> {cut.new!r} lowers the load, so the cap stays idle: the pair "
                    f"learns what that change alone would")
    if learns(card, history) is not None:
        return None
    return Refusal(RefusalKind.INERT, "; ".join(idle))


def inert_why(c: Change, run: Outcome, history: History) -> str | None:
    """Why raising this cap cannot move the objective at the run's station, in the evidence's figures; None when
    the change is no raise of a cap, or the run does not show it idle."""
    if direction_of(c) != "up" or c.old is None:
        return None  # a lowered cap may move latency; a cap raised from unlimited is no raise
    role, ev, s = role_of(c.knob), run.evidence, run.summary
    if role == CLIENT_CAP and s is not None:
        win = s.native or s.whole
        got = win.achieved_concurrency if win is not None else None
        if got is not None and s.concurrency and got < CLEAR_OF_CAP * s.concurrency:
            return (f"achieved concurrency {got:.1f} < C {s.concurrency} ({got / s.concurrency:.0%} of it in "
                    f"flight): the clients were never all in flight, so raising C cannot add load")
    elif role == PREFILL_REQUEST_CAP:
        try:
            knobs = full_knobs(run.card.knobs, history.goal.engine)
        except KnobError:
            return None
        limit, why, _ = prefill_limit(ev, knobs)
        if limit == "token_budget" and why:
            return why
    elif role == BATCH_CAP:
        peak, cap = ev.decode_running_max, ev.decode_batch_limit
        if peak is not None and cap and peak < CLEAR_OF_CAP * cap:
            return (f"the decode batch peaked at {peak:.0f} of a {cap:.0f} batch cap ({peak / cap:.0%}): the cap "
                    f"did not bind, so raising it cannot batch more")
    return None


def learns(card: CandidateCard, history: History) -> str | None:
    """Why an inert card may run all the same (the module's narrow exception), or None."""
    h = card.hypothesis
    if h is None or h not in NAMES:
        return None
    rules = [MOVES.get((role_of(c.knob) or "", direction_of(c))) for c in card.changes]
    if any(r is not None and (h in r.hypotheses or card.negative_rules_out == r.rules_out) for r in rules) \
            or not card.negative_rules_out.strip():
        return None  # the question its own move asks, which the evidence answered, or nothing said
    if any(o.decision == "negative" and o.card.hypothesis == h and o.card.parent_knobs_hash == card.parent_knobs_hash
           for o in history.outcomes):
        return None  # tested already from this station
    cat = catalog()
    costs = [COST_ORDER[cat.get(k).cost_class] for k in history.goal.space() if k in cat
             and any(h in m.hypotheses for (role, _), m in MOVES.items() if role == role_of(k))]
    if costs and min(costs) < COST_ORDER.get(card.cost_class, len(COST_ORDER)):
        return None  # a cheaper move tests the same hypothesis
    return f"it tests {h}, which no cheaper move does; a negative rules out {card.negative_rules_out}"
