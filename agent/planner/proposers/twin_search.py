"""The twin proposes (agent/planner/twin.py): the goal's space searched on a simulator calibrated to this goal's own
runs, the path to the twin's optimum turned into the next experiment card.

While the twin leads (it predicts this goal's runs inside its interval), it values every ranked move, its own and
the other proposers' alike, by its predicted gain over the best station: the gain, times the chance that the gain
reaches the goal's least gain (the objective's interval read as a normal error) and that every latency limit holds
(each limit's figure with its own interval: a p99's is its own, wider than a mean's), per card-hour as every move
is; while the best station breaks a limit, a station predicted to keep them all is worth at least the least gain.
Its own moves are the best station's one-change neighbours it predicts a gain for, and, when the ascent to its
optimum needs two changes together to gain what neither gives alone, that pair (the card names both, and the gain
each alone was predicted); and, while the twin predicted this goal's last run inside its interval, the jump to its
optimum: every change from the best station to the twin's optimum in one card, where it gains at least the least
gain more than the best one change predicted to keep every limit (the card names every change and the gain each
alone was predicted); while that jump is on the table, a move that stops short of the optimum by the least gain is
worth no more than the path it starts (its own expected gain plus the optimum's further gain, at its card-hours
plus those of the run from its station to there). Every card it touches carries its prediction (the hypothesis
ledger's source "twin") and says that the twin led and on what fidelity. When it does not lead, it proposes nothing
and says why on the cards the rules lead.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from core.canonical import canon

from agent.planner import twin as tw
from agent.planner.candidates import CandidateCard, build_card, station_hash
from agent.planner.cards import CARD_HOURS_DIGITS
from agent.planner.checks import estimate
from agent.planner.history import History
from agent.planner.pairs import build_jump, build_pair, move_direction
from agent.planner.proposers.base import Asking, Proposals, Proposed, Proposer
from agent.planner.tpot_fit import chance_under, normal_cdf
from agent.planner.value import PREDICTED_DIGITS, VALUE_DIGITS, Value, per_card_hour
from core.goalview import GoalView, Limit, effect
from core.knobs import COST_ORDER
from core.station import change_cost, needs_restart
from core.ledger import Interval, Prediction

LED = "led by the twin"
LIKELY = 0.5  # a twin-valued move at least this likely to gain the least gain (within every limit) is worth running


class TwinSearch(Proposer):
    name = "twin"
    phase = "rank"

    def propose(self, asking: Asking) -> Proposals:
        h = asking.history
        if h.twin is None:
            return Proposals()
        fid = tw.fidelity(h, h.twin)
        if fid.twin is None or not fid.leads:
            return Proposals(yields=fid.why if tw.runs_of(h) else "")
        found = tw.search(h, fid.twin)
        if found is None:
            return Proposals(yields="the twin cannot predict the best station's objective")
        judge = Judge(h, fid, found, asking.restart)
        moves = []
        for k, v, st in found.singles:
            card = _one(h, k, v)
            if card is None:
                continue
            got = judge.value(card, st)
            if got is not None:
                moves.append(Proposed(got[0], got[1]))
        jump = _jump(h, fid, found, judge)
        if jump is not None:
            moves.append(jump)
        pair = _pair(h, found, judge)
        if pair is not None and (jump is None or pair.card.knobs_hash != jump.card.knobs_hash):
            moves.append(pair)
        opt = tw.gain(found.optimum, found.base) or 0.0
        path = " + ".join(f"{k}={v!r}" for k, v in found.path) or "the best station itself"
        lead = (f"{LED}: {fid.words()}; its optimum ({path}) predicted {effect(opt, tight=True)} over the best station, "
                f"{found.simulated} stations simulated" + (" (the whole space)" if found.exhaustive else "")
                + (f"; not modelled, so not searched: {', '.join(found.unmodelled)}" if found.unmodelled else ""))
        return Led(moves=moves, why=lead, judged=judge, settled_why=_settled(h, fid, found, opt))


@dataclass
class Led(Proposals):
    """The twin's answer while it leads: every pooled move valued by its model, its own moves first."""

    why: str = ""
    judged: Judge | None = None
    settled_why: str = ""

    def lead(self) -> str:
        return self.why

    def judge(self, card: CandidateCard) -> tuple[CandidateCard, Value] | None:
        return self.judged.value(card) if self.judged is not None else None

    def likely(self, card: CandidateCard, value: Value) -> bool:
        """The twin values this move and expects at least the least gain of it: even odds of the least gain within
        every limit, or a predicted objective gain large enough that it times that chance reaches the least gain (a
        station the twin puts +7 % up but on a limit it may break, at 36 % odds, is worth a run; one it puts +0.5 % up
        is not, however sure). The objective's own gain, not the move's worth: while the best station breaks a limit
        a station that keeps them all is worth more than any gain (Judge.value), a rank, not a gain to multiply.
        Worth running whatever the rules' least value (agent/planner/value.py MIN_VALUE), which prices moves by the
        rules' rough confidence, not by a model measured on this goal's runs."""
        pred = card.prediction
        if pred is None or pred.source != "twin" or value.gain is None or value.gain <= 0:
            return False
        least = self.judged.h.goal.view().least_gain if self.judged is not None else 0.0
        return value.confidence >= LIKELY or pred.objective_effect.value * value.confidence >= least > 0

    def settled(self) -> str:
        return self.settled_why


class Judge:
    """Values a card by the twin's prediction of its station against the twin's prediction of the best station."""

    def __init__(self, history: History, fid: tw.Fidelity, found: tw.Search, restart: float):
        self.h, self.fid, self.found, self.restart = history, fid, found, restart
        self.known = {station_hash(st.knobs): st for _, _, st in found.singles} | \
            {station_hash(found.base.knobs): found.base}

    def station(self, knobs: dict[str, Any]) -> tw.Station | None:
        key = station_hash(knobs)
        if key not in self.known:
            if not tw.runnable(self.h, knobs):
                return None  # no run of it (the catalog refuses it, or it failed quality): the card checks refuse it
            self.known[key] = tw.predicted(self.h, self.fid.twin, knobs)[0]  # type: ignore[arg-type]
        return self.known[key]

    def value(self, card: CandidateCard, st: tw.Station | None = None) -> tuple[CandidateCard, Value] | None:
        """(the card with the twin's prediction, its value); None when the twin cannot predict its station."""
        goal, base, view = self.h.goal, self.found.base, self.h.goal.view()
        st = st or self.station(card.knobs)
        if st is None:
            return None
        g = tw.gain(st, base)
        if g is None:
            return None
        worth, conf = self._odds(st, g)
        cost = estimate(card, self.h)
        v = per_card_hour(max(0.0, worth) * conf, card.cost_class, cost, self.h.budget_left_card_hours, self.restart)
        onward = self._onward(st, worth, conf, card.cost_class, cost, v)
        lat_words = "".join(
            f", {lim.words} {st.figures[lim.figure_key]:.1f} ms (limit {lim.limit_ms:g} ms"
            f"{'' if lim.kept(st.figures[lim.figure_key]) else ': breaks it'})"
            for lim in view.limits if st.figures.get(lim.figure_key) is not None)
        lat_words += f"; breaks the contract: {st.broken}" if st.broken else ""
        kept = "; keeps every limit the best station breaks" if worth != g else ""
        why = (f"the twin predicts {effect(g, tight=True)} {goal.objective.metric}{lat_words}{kept}; chance of at least the least "
               f"gain within every limit {conf:.0%}; {card.cost_class}, ~{cost:.2f} card-h")
        if onward is not None:
            v, words = onward
            why += f"; {words}"
        value = Value(value=round(v, VALUE_DIGITS), gain=worth, confidence=conf, rules_out=0.0, cost_card_hours=cost,
                      why=why)
        lo, hi = g - self.fid.interval, g + self.fid.interval
        bound = _binding(view, base)
        pred = Prediction(source="twin", objective=f"{goal.objective.metric} (whole)",
                          objective_effect=Interval(value=g, lo=lo, hi=hi),
                          slo=bound.key if bound is not None else None,
                          slo_effect=_slo_effect(st, base, bound, self.fid),
                          basis=(f"the goal's twin (a simulator profile calibrated to its {len(self.fid.twin.runs)} "  # type: ignore[union-attr]
                                 f"valid run(s), from its {self.fid.twin.origin}): this station vs the best at "  # type: ignore[union-attr]
                                 f"N={goal.protocol.confirm_n}"),
                          predicted={k: round(x, PREDICTED_DIGITS) for k, x in
                                     [(goal.objective.metric, st.objective)]
                                     + [(lim.figure_key, st.figures.get(lim.figure_key)) for lim in view.limits]
                                     if x is not None})
        card = card.model_copy(update={"prediction": pred, "score": value.value,
                                       "est_card_hours": round(cost, CARD_HOURS_DIGITS)})
        return card, value


    def _odds(self, st: tw.Station, g: float) -> tuple[float, float]:
        """A station's worth over the best station and the chance it gains the least gain within every limit."""
        view = self.h.goal.view()
        least, worth = view.least_gain, g
        if not self.found.base.feasible and st.feasible:
            # the best breaks a limit: a station that keeps them all gains at least the least gain whatever its
            # objective, and among such stations the higher objective is worth more (feasible first, then the
            # objective, as the search ranks them): the least gain plus its objective as a share of the best's
            worth = least + 1.0 + g
        # the chance it gains the least gain (the objective's own error), and that each latency limit holds (each
        # figure's own error: a p99's is wider than a mean's); a broken contract is an invalid run
        conf = normal_cdf(worth - least, self.fid.interval / tw.INTERVAL_Z) if not st.broken else 0.0
        for lim in view.limits:
            fig = st.figures.get(lim.figure_key)
            sigma = self.fid.intervals.get(lim.figure_key, tw.PRIOR_INTERVAL) / tw.INTERVAL_Z
            conf *= chance_under(lim.limit_ms, fig, fig * sigma) if fig is not None else 0.0
        return worth, conf

    @cached_property
    def _optimum_odds(self) -> tuple[float, float] | None:
        """The twin's optimum's worth and chance (`_odds`), once per proposal; None while a move is not to be
        valued as the path to it (the twin's last run outside its interval, or an optimum that breaks a limit)."""
        opt, fid = self.found.optimum, self.fid
        if not fid.scored or fid.scored[-1].miss or not opt.feasible or opt.objective is None:
            return None
        g = tw.gain(opt, self.found.base)
        return None if g is None else self._odds(opt, g)

    def _onward(self, st: tw.Station, worth: float, conf: float, cls: str, cost: float,
                own: float) -> tuple[float, str] | None:
        """A move that stops short of the twin's optimum leaves a run to make from its station to there: while the
        twin leads with its last run inside its interval (as for its jump), the move is worth no more than that
        path: its own expected worth plus the optimum's further gain at the optimum's chance, at both runs'
        card-hours (a pair that gains half for a quarter of the jump's card-hours, with the jump's relayout still
        ahead, costs more to the optimum than the jump itself; a sure step towards an optimum on a limit's edge
        keeps most of its own worth). (value, words) where the path is worth less than the move alone; None
        otherwise."""
        h, opt, odds = self.h, self.found.optimum, self._optimum_odds
        if odds is None:
            return None
        short = tw.gain(opt, st)
        if short is None or short < h.goal.view().least_gain:
            return None
        top, chance = odds
        expect = max(0.0, worth) * conf + max(0.0, top - max(0.0, worth)) * chance
        rest = change_cost(st.knobs, opt.knobs) or "hot"
        proto = h.goal.protocol
        more = h.cost.estimate(rest, proto.confirm_n, proto.warmup, needs_restart=needs_restart(rest))
        dearer = max(cls, rest, key=lambda c: COST_ORDER.get(c, len(COST_ORDER)))
        path = per_card_hour(expect, dearer, cost + more, h.budget_left_card_hours, self.restart)
        if path >= own:
            return None
        return path, (f"the twin's optimum is {effect(short, tight=True)} past it, a {rest} run of ~{more:.2f} card-h more: worth "
                      f"{path:.4f} as that path, not {own:.4f} alone")


def _binding(view: GoalView, base: tw.Station) -> Limit | None:
    """The limit with the least predicted slack at the best station (the ledger's SLO of a twin's prediction)."""
    rows = [lim for lim in view.limits if base.figures.get(lim.figure_key) is not None]
    if not rows:
        return None
    return min(rows, key=lambda lim: (1.0 - base.figures[lim.figure_key] / lim.limit_ms, lim.key))  # type: ignore


def _slo_effect(st: tw.Station, base: tw.Station, bound: Limit | None, fid: tw.Fidelity) -> Interval | None:
    """The predicted relative change of the binding figure, with that figure's own interval."""
    if bound is None:
        return None
    new, old = st.figures.get(bound.figure_key), base.figures.get(bound.figure_key)
    if new is None or not old:
        return None
    e, w = new / old - 1.0, fid.intervals.get(bound.figure_key, tw.PRIOR_INTERVAL)
    return Interval(value=e, lo=e - w, hi=e + w)


def _one(h: History, knob: str, value: Any) -> CandidateCard | None:
    goal = h.goal
    try:
        return build_card(h.goal_id, goal.scenario, h.best_knobs, knob, value, stage="screen",
                          n=goal.protocol.screen_n, direction=move_direction(knob, h.best_knobs, value),
                          mechanism=f"the twin (a simulator calibrated to this goal's runs) predicts a gain from "
                                    f"{knob}={value!r}",
                          decision=f"whether {knob}={value!r} gains what the twin predicts",
                          negative_rules_out=f"{knob}={value!r} from this station; the twin is refit with the result")
    except Exception:  # a knob outside the catalog cannot become a card
        return None


def _alone(found: tw.Search) -> dict[tuple[str, Any], tuple[float, bool]]:
    """Each one change from the best station, by (knob, canonical value): the twin's predicted gain, and whether it
    predicts the change keeps every limit and the contract."""
    return {(k, canon(v)): (tw.gain(st, found.base) or 0.0, st.feasible) for k, v, st in found.singles}


def _best_kept(alone: dict[tuple[str, Any], tuple[float, bool]], among: list[tuple[str, Any]] | None = None) -> float:
    """The largest predicted gain of the one changes (of `among`, when given) that keep every limit: one that breaks a
    limit gains nothing a result keeps, so it is no reason to prefer one change over the move that gets there."""
    return max((g for key, (g, kept) in alone.items() if kept and (among is None or key in among)), default=0.0)


def _pair(h: History, found: tw.Search, judge: Judge) -> Proposed | None:
    """The first two changes of the ascent moved together, where together they gain at least the least gain more
    than either alone (the twin's coupling)."""
    if len(found.path) < 2:
        return None
    (k1, v1), (k2, v2) = found.path[:2]
    each = _alone(found)
    keys = [(k, canon(v)) for k, v in found.path[:2]]
    both = judge.station(h.best_knobs | {k1: v1, k2: v2})
    g = None if both is None else tw.gain(both, found.base)
    if g is None or g - _best_kept(each, keys) < h.goal.view().least_gain:
        return None
    try:
        card = build_pair(h, (k1, v1), (k2, v2), coupling=(
            f"the twin predicts {effect(g, tight=True)} from {k1}={v1!r} with {k2}={v2!r} together, "
            + ", ".join(f"{k} alone {effect(each[key][0], tight=True)}" for (k, _), key in zip(found.path[:2], keys) if key in each)),
            mechanism=f"the twin's path to its optimum moves {k1} and {k2} together",
            decision=f"whether {k1} and {k2} together gain what the twin predicts",
            negative_rules_out=f"the twin's coupling of {k1} and {k2} from this station; the twin is refit with it")
    except Exception:
        return None
    got = judge.value(card, both)
    return None if got is None else Proposed(got[0], got[1])


def _jump(h: History, fid: tw.Fidelity, found: tw.Search, judge: Judge) -> Proposed | None:
    """Every change from the best station to the twin's optimum in one card (two: a pair; more: a jump), only while
    the twin's measured error on this goal is inside its interval (its last predicted run fell inside it), and
    where the optimum gains at least the least gain more than the best one change alone."""
    if not fid.scored or fid.scored[-1].miss:
        return None
    best, target = h.best_knobs, found.optimum.knobs
    order = list(dict.fromkeys(k for k, _ in found.path))  # the ascent's order: its first step first
    changes = [(k, target[k]) for k in order if canon(target[k]) != canon(best.get(k))]
    if len(changes) < 2:
        return None
    g = tw.gain(found.optimum, found.base)
    alone = _alone(found)
    if g is None or g - _best_kept(alone) < h.goal.view().least_gain:
        return None
    each = ", ".join(f"{k}={v!r} alone {effect(alone.get((k, canon(v)), (0.0, False))[0], tight=True)}" for k, v in changes)
    coupling = (f"the twin's optimum is {len(changes)} changes away and predicted {effect(g, tight=True)} over the best station "
                f"({each}); its last run was predicted {effect(fid.scored[-1].error, tight=True)}, inside its ±"
                f"{fid.scored[-1].interval:.1%}")
    words = " + ".join(f"{k}={v!r}" for k, v in changes)
    fields = dict(coupling=coupling, mechanism=f"the twin's path to its optimum moves {words} together",
                  decision=f"whether the twin's optimum ({words}) gains what the twin predicts",
                  negative_rules_out="the twin's optimum from this station, reached in one jump (each change alone "
                                     "stays open); the twin is refit with it")
    try:
        card = build_pair(h, changes[0], changes[1], **fields) if len(changes) == 2 else build_jump(h, changes, **fields)
    except Exception:  # a knob outside the catalog cannot become a card
        return None
    got = judge.value(card, found.optimum)
    return None if got is None else Proposed(got[0], got[1])


def _settled(h: History, fid: tw.Fidelity, found: tw.Search, opt: float) -> str:
    """Why the goal has nothing left to gain, by the twin: it predicted the goal's last runs inside its interval (as
    many in a row as misses hand its lead over), it models every knob of the space, the best station keeps the SLO,
    and its search finds no station that gains the least gain. "" otherwise (the explorer may still look)."""
    tail = fid.scored[-tw.MISSES_TO_YIELD:]
    if len(tail) < tw.MISSES_TO_YIELD or any(s.miss for s in tail) or found.unmodelled or not found.base.feasible \
            or opt >= h.goal.view().least_gain:
        return ""
    errs = ", ".join(f"{effect(s.error, tight=True)} inside ±{s.interval:.1%}" for s in tail)
    return (f"nothing left to gain by the goal's twin: it predicted the last {len(tail)} runs ({errs}), and its search "
            f"of {found.simulated} stations finds none that gains min_gain_pct {h.goal.stop.min_gain_pct:g} % over "
            f"the best station (its optimum {effect(opt, tight=True)})")
