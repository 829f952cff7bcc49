"""The rank step's machinery: every rank-phase proposer's moves pooled and valued per card-hour (a leading proposer
valuing them all), each passed through the checks (re-staged straight to its confirm where a screen cannot serve or
costs more), and the first one worth a run (a hot move first while the best station is warm)."""
from __future__ import annotations

from dataclasses import dataclass, field

from agent.planner.best import native_missing
from agent.planner.candidates import CandidateCard, direction_of, rule_for, station_hash, with_stage
from agent.planner.checks import check, estimate
from agent.planner.diagnosis import OPEN_LOW, Diagnosis
from agent.planner.history import History
from agent.planner.pairs import hold
from agent.planner.plan import PlanRow
from agent.planner.protocol_cards import reference_card
from agent.planner.proposers import RULES_LED, Asking, Proposals, of_phase
from agent.planner.proposers.guarded import asked, judged
from agent.planner.screens import screen_blind, to_confirm
from agent.planner.value import MIN_VALUE, Value


@dataclass
class Pool:
    """The pooled moves, best first, and the proposer that led their ranking (a no-op `Proposals` when none did)."""

    moves: list[tuple[CandidateCard, Value]]
    leader: Proposals = field(default_factory=Proposals)


@dataclass
class Ranking:
    """Every pooled move with its value and why or its refusals (for the record), the ones that pass the checks,
    and the leader of the pool."""

    ranked: list[PlanRow]
    passing: list[tuple[CandidateCard, Value]]
    leader: Proposals


def candidates(history: History, diag: Diagnosis | None) -> list[tuple[CandidateCard, Value]]:
    """Every rank-phase proposer's moves from the best station, pooled and valued (unchecked), best first: the
    value per card-hour every move is ranked by. A proposer's holds (an exclusive coupling) cut the value of the
    one-change moves they name to HELD_ALONE of what it was (the pair runs first; each alone stays open)."""
    return pooled(history, diag).moves


def pooled(history: History, diag: Diagnosis | None) -> Pool:
    """`candidates`, with the proposer that led them (its `settled`: why it says nothing is left to gain)."""
    goal = history.goal
    restart = history.cost.estimate("restart", goal.protocol.screen_n, goal.protocol.warmup, needs_restart=True)
    asking = Asking(history, diag, restart=restart, native_missing=native_missing(history))
    pool, held, led = [], {}, []
    leader: Proposals | None = None
    yields: list[str] = []
    for proposer in of_phase("rank"):
        got = asked(proposer, asking)  # a proposer that raises yields with its reason
        if leader is None and got.lead():
            leader = got
            led += [(p.card, p.value) for p in got.moves if p.value is not None]
        else:
            pool += [(p.card, p.value) for p in got.moves if p.value is not None]
        held.update(got.holds)
        if got.yields:
            yields.append(got.yields)
    out = [hold(card, v, held) for card, v in pool]
    if leader is not None:  # the leading model values every other move too (a move it cannot predict keeps its own)
        out = [judged(leader, card) or (card, v) for card, v in out]
    lead = leader.lead() if leader is not None else ""
    out = [(_noted(card, lead), v) for card, v in led] + [(_noted(card, lead or "; ".join(
        f"{RULES_LED}: {y}" for y in yields)), v) for card, v in out]
    out.sort(key=lambda cv: (-cv[1].value, cv[0].title()))
    # one experiment once: the leading twin's own card and a rule's card for the same station, stage and N are one
    # candidate (else a person's one refusal reads as "2 of the 4 remaining candidates"); the first, ranked higher
    # (the leader's on a tie), stays
    seen: set[str] = set()
    out = [cv for cv in out if cv[0].experiment_key not in seen and not seen.add(cv[0].experiment_key)]
    return Pool(out, leader if leader is not None else Proposals())


def _noted(card: CandidateCard, why: str) -> CandidateCard:
    """The card, saying which proposer led its ranking and why."""
    if not why or why in (card.note or ""):
        return card
    return card.model_copy(update={"note": "; ".join(x for x in (card.note, why) if x)})


def ranking(history: History, diag: Diagnosis | None, direct: str | None) -> Ranking:
    """The pool through the checks: a move whose screen cannot serve (`direct`: why every move goes to confirm N
    at once, else the move's own reason) is re-staged straight to its confirm and checked again."""
    pool = pooled(history, diag)
    cands = [(card, v, check(card, history)) for card, v in pool.moves]
    screens = sum(1 for c, _, r in cands if not r and c.stage == "screen")  # would share a screen-N reference
    ranked: list[PlanRow] = []
    passing: list[tuple[CandidateCard, Value]] = []
    for card, v, refusals in cands:
        why_direct = direct or cheaper_direct(card, v, history, screens) or screen_blind(card, history, v.gain)
        if why_direct and not refusals:
            card = to_confirm(card, history, why_direct)
            refusals = check(card, history)
        ranked.append(PlanRow.of(card.title(), v.value, v.why, refusals))
        if not refusals:
            passing.append((card, v))
    return Ranking(ranked, passing, pool.leader)


def worth_running(passing: list[tuple[CandidateCard, Value]],
                  leader: Proposals | None = None) -> tuple[CandidateCard, Value] | None:
    """The first card worth a run, in rank order: the top card when its value reaches the rules' least value
    (MIN_VALUE), else the first card the leading proposer (the twin) calls worth running (its own calibrated
    chance, agent/planner/proposers/twin_search.py); None when no card is worth a run."""
    if passing and passing[0][1].value >= MIN_VALUE:
        return passing[0]
    lead = leader if leader is not None else Proposals()
    return next((cv for cv in passing if lead.likely(*cv)), None)


def hot_while_warm(passing: list[tuple[CandidateCard, Value]],
                   history: History) -> tuple[CandidateCard, Value] | None:
    """The best hot move worth its cost, testing a hypothesis the evidence leaves open, while the service runs
    the best station: done now it costs a load, after a restart move (the service moves away) a restart too."""
    if history.warm_knobs is None or station_hash(history.warm_knobs) != history.best_knobs_hash:
        return None
    # a trade-off move (lower C) aims at the objective only when it may give the missing native window
    window = native_missing(history)
    # never a change of a passing coupled pair: its negative alone would refuse the pair (a known negative in it)
    paired = {(x.knob, repr(x.new)) for p, _ in passing if p.multi for x in p.changes}
    return next(((c, v) for c, v in passing if c.cost_class == "hot" and v.value >= MIN_VALUE
                 and c.hypothesis is not None and v.confidence >= OPEN_LOW and (window or not _tradeoff(c))
                 and (c.change is None or (c.change.knob, repr(c.change.new)) not in paired)), None)


def _tradeoff(card: CandidateCard) -> bool:
    """A move that may lose on the objective to win on latency."""
    c = card.change
    return c is not None and rule_for(c.knob, direction_of(c)).tradeoff


def stale_streak(history: History) -> int:
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


def cheaper_direct(card: CandidateCard, v: Value, history: History, screens: int) -> str | None:
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
        ref = estimate(reference_card(history, card.parent_knobs, card.n), history) / max(1, screens)
    p = min(1.0, max(0.0, v.confidence))
    then = history.cost.estimate("hot", conf_n, goal.protocol.warmup, needs_restart=False)
    path = ref + screen + p * then
    if direct > path:
        return None
    parts = (f"{ref:.2f} reference share + " if ref else "") + f"{screen:.2f} screen + {p:.2f} x {then:.2f} confirm"
    return (f"the confirm alone ({direct:.2f} card-h) costs no more than screening first ({parts} = {path:.2f} card-h)")
