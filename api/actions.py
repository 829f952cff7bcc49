"""What a person can do to a goal, shared by the REST routes and the chat: each records who asked,
wakes the goal's worker, and notifies. Replies cite candidate / experiment ids and figures.
"""
from __future__ import annotations

from typing import Any

from agent.planner import change_words
from api import permissions
from api.auth import Principal
from api.chat import HELP, Intent
from api.failures import shown_status
from api.service import Service
from state.errors import Conflict, NotFound
from state.lifecycle import UNDECIDED, GoalStatus, OutcomeKind
from state.workqueue import WorkState
from core.errors import FieldError


def decide(svc: Service, candidate_id: int, card_hash: str, decision: str, who: Principal, reason: str | None,
           via: str = "api") -> Any:
    """Approve or reject a card as shown (its hash); raises Conflict / Stale / NotFound from the store."""
    st = svc.store
    cand = st.check_waiting(candidate_id)  # 409 unless the goal waits for a decision on this card
    fn = st.approve if decision == "approve" else st.reject
    ap = fn(candidate_id, card_hash, f"{who.name} ({via})", reason)
    svc.wake(cand.goal_id, who.name)
    svc.notifier.notify("decision", cand.goal_id, f"candidate {candidate_id} {'approved' if decision == 'approve' else 'rejected'} by {who.name}"
                        + (f": {reason}" if reason else ""),
                        {"candidate_id": candidate_id, "decision": decision, "who": who.name})
    return ap


def instruct(svc: Service, goal_id: str, kind: str, who: Principal, *, count: int | None = None,
             knobs: dict[str, Any] | None = None, restore: str | None = None, text: str | None = None,
             via: str = "api") -> tuple[Any, str]:
    """Record an instruction `via` a channel; (it, what the person is told at once: what it replaced, that it waits
    for a decision a person owes). Conflict (409) when it was refused: it is recorded with that outcome."""
    ins = svc.store.add_instruction(goal_id, kind, f"{who.name} ({via})", count=count, knobs=knobs, restore=restore,
                                    text=text)
    if ins.outcome_kind is OutcomeKind.REFUSED:
        raise Conflict(f"instruction {ins.id} {ins.outcome}")
    svc.wake(goal_id, who.name)
    return ins, standing(svc, goal_id, ins)


def standing(svc: Service, goal_id: str, ins: Any) -> str:
    """What a new instruction did to earlier ones and when it takes effect, in words ('' when nothing to say)."""
    said = [f"it replaces instruction {i.id} ({i.kind.replace('_', ' ')} by {i.who}), which had not taken effect"
            for i in svc.store.instructions(goal_id) if i.superseded_by == ins.id]
    waiting = pending(svc, goal_id)
    if waiting:
        said.append(f"queued: candidate {waiting[0].id} waits for a person's decision; this takes effect after it")
    return "; ".join(said)


def shown_hash(svc: Service, candidate_id: int) -> str:
    """The card hash the loop showed people when it asked about this card (the decision log's ask); the stored
    hash when it never asked (then the card is unchanged since it was proposed)."""
    cand = svc.store.get_candidate(candidate_id)
    asks = [d for d in svc.store.decisions(cand.goal_id, ("ask",)) if d.candidate_id == candidate_id]
    return (asks[-1].data.get("card_hash") if asks else None) or cand.card_hash


def asked_extension(svc: Service, goal_id: str) -> dict[str, Any] | None:
    """The budget extension the loop waits for (card-hours, experiments, candidate, why), else None."""
    g = svc.store.get_goal(goal_id)
    if not g.waits_for_extension:
        return None
    asks = [d for d in svc.store.decisions(goal_id, ("ask",)) if d.data.get("kind") == "budget_extension"]
    return {**asks[-1].data, "why": asks[-1].text} if asks else None


def extend_budget(svc: Service, goal_id: str, who: Principal, card_hours: float, experiments: int | None = None,
                  reason: str | None = None, via: str = "api") -> Any:
    """Grant the budget extension the loop asked for: card-hours (and experiments: by default those the loop asked
    for); wakes the goal. Conflict (409, nothing stored) when the loop asked for none."""
    ext = svc.store.answer_extension(goal_id, "grant", f"{who.name} ({via})", reason, card_hours=card_hours,
                                     experiments=experiments)
    svc.wake(goal_id, who.name)
    svc.notifier.notify("decision", goal_id, f"budget extended by {who.name}: +{ext.card_hours:g} card-hours, "
                        f"+{ext.experiments} experiments" + (f": {ext.reason}" if ext.reason else ""),
                        {"extension": ext.id, "card_hours": ext.card_hours, "experiments": ext.experiments})
    return ext


def refuse_extension(svc: Service, goal_id: str, who: Principal, reason: str | None, via: str = "api") -> Any:
    """Refuse the extension the loop asked for (409, nothing stored, when it asked for none): the goal stops with
    the reason."""
    ext = svc.store.answer_extension(goal_id, "refuse", f"{who.name} ({via})", reason)
    svc.wake(goal_id, who.name)
    svc.notifier.notify("decision", goal_id, f"budget extension refused by {who.name}"
                        + (f": {ext.reason}" if ext.reason else ""), {"extension": ext.id, "decision": "refuse"})
    return ext


def pending(svc: Service, goal_id: str) -> list[Any]:
    """Cards the loop waits on: open, undecided ones while the goal is waiting for a person."""
    st = svc.store
    if st.get_goal(goal_id).status != GoalStatus.WAITING:
        return []
    return [c for c in st.candidates(goal_id) if c.status in UNDECIDED
            and st.approval(c.id) is None]


def figures(svc: Service, run_id: str | None) -> str:
    """A run's figures in its goal's own terms (core.goalview `figures_words`): `goodput: whole 6.97 / native — req/s
    at N=640; TTFT p99 1843.2 ms (< 2000), TPOT p99 31.20 ms (< 35), E2E p99 ...`, or '' without a valid summary."""
    if not run_id:
        return ""
    res = svc.store.get_result(run_id)
    s = res.result.summary if res else None
    if s is None:
        return f"verdict {res.verdict}" if res else ""
    view = svc.store.get_goal(res.goal_id).spec.view() if res.goal_id else None
    if view is None:  # a run of no goal: the throughput per card alone
        return f"whole {s.whole.output_tok_s_per_card if s.whole else 0:.1f} tok/s/card at N={s.n_formal}"
    return view.figures_words(s)


def status_text(svc: Service, goal_id: str) -> str:
    st = svc.store
    g = st.get_goal(goal_id)
    w = st.work_item(goal_id)
    view = g.spec.view()
    lines = [f"goal {g.id}: {shown_status(g, w is not None and w.state == WorkState.FAILED)}"
             + (f" — {g.status_reason}" if g.status_reason else ""),
             f"objective: maximise {view.objective_words}; SLO: {view.slo_words()}"]
    best = st.best(goal_id)
    if best is not None:
        lines.append(f"best: {best.kind} from experiment {best.run_id} (candidate {best.candidate_id}): "
                     f"{figures(svc, best.run_id)}; station {best.station_hash}")
    ask = asked_extension(svc, goal_id)
    if ask is not None:
        lines.append(f"waiting for a budget extension: {ask.get('card_hours', 0):.2f} card-hours and "
                     f"{ask.get('experiments', 0)} experiment(s) for candidate {ask.get('candidate_id')} — say "
                     f"'extend budget by {ask.get('card_hours', 0):g} card-hours' or 'refuse the extension because …'")
    else:
        for c in pending(svc, goal_id):
            lines.append(f"waiting for approval: candidate {c.id} ({_title(c.card)}), card hash {shown_hash(svc, c.id)}")
    b = st.budget(goal_id)
    lines.append(f"budget: {b.experiments_used}/{b.experiments_limit} experiments, "
                 f"{b.card_hours_used:.2f}/{b.card_hours_limit:.2f} card-hours")
    return "\n".join(lines)


def why_rejected(svc: Service, candidate_id: int, goal_id: str | None = None) -> str:
    """Why a card of this goal was rejected (or judged negative); a card of another goal is not this chat's."""
    st = svc.store
    cand = st.get_candidate(candidate_id)
    if goal_id is not None and cand.goal_id != goal_id:
        raise NotFound(f"no such candidate in goal {goal_id}: {candidate_id}")
    ap = st.approval(candidate_id)
    if ap is not None and ap.decision == "reject":
        return (f"candidate {candidate_id} ({_title(cand.card)}) was rejected by {ap.who}"
                + (f": {ap.reason}" if ap.reason else " (no reason given)"))
    for d in st.decisions(cand.goal_id):
        if d.candidate_id == candidate_id and d.kind in ("negative", "fault", "quality_failed", "note"):
            fig = figures(svc, d.run_id)
            return (f"candidate {candidate_id}: [{d.kind}] {d.text}" + (f" (experiment {d.run_id}: {fig})" if d.run_id else ""))
    return f"candidate {candidate_id} ({_title(cand.card)}) was not rejected; its status is {cand.status}"


def _title(card: dict[str, Any]) -> str:
    what = change_words(card, fmt=str) or "reference"
    return f"{card.get('stage')} N={card.get('n')}: {what}"


def act(svc: Service, goal_id: str, intent: Intent, who: Principal,
        said: str | None = None, via: str = "chat") -> tuple[str, dict[str, Any] | None]:
    """Carry out one chat intent; (reply, what was done). Each intent is the action of the permission table
    (api/permissions.py) that its REST route takes, with the same role: Forbidden (403) below it. An instruction
    keeps what the person typed (`said`, cut to 300 characters); `via` names where it was typed (the REST chat,
    Slack, Feishu) in the decisions and instructions it records."""

    st = svc.store
    k = intent.kind
    permissions.check(who, permissions.CHAT.get(k, "chat.ask"))
    if k == "unknown":
        return HELP, None
    if k == "refused":  # a negated command, several in one message, or a number that is not one: nothing is done
        return intent.reason or "not done", None
    if k == "status":
        return status_text(svc, goal_id), None
    if k == "why_rejected":
        if intent.candidate_id is None:
            return "which candidate? e.g. 'why was 12 rejected?'", None
        return why_rejected(svc, intent.candidate_id, goal_id), None
    if k in ("approve", "reject"):
        if intent.candidate_id is None:
            return f"which candidate? e.g. '{k} 7'", None
        cand = st.get_candidate(intent.candidate_id)
        if cand.goal_id != goal_id:
            raise NotFound(f"no such candidate in goal {goal_id}: {intent.candidate_id}")
        if k == "reject" and not intent.reason:
            return f"please say why: 'reject {cand.id} because …'", None
        shown = intent.card_hash or shown_hash(svc, cand.id)  # bound to the card as the loop showed it
        decide(svc, cand.id, shown, k, who, intent.reason, via=via)
        return (f"candidate {cand.id} ({_title(cand.card)}) {'approved' if k == 'approve' else 'rejected'} by {who.name}, bound to card hash {shown}"
                + (f": {intent.reason}" if intent.reason else ""), {"candidate_id": cand.id, "decision": k})
    if (out := _budget(svc, goal_id, intent, who, via)) is not None:
        return out
    try:
        return _instruct(svc, goal_id, intent, who, said, via)
    except Conflict as e:  # a second instruction of a kind still to be carried out: recorded refused
        return f"not done: {e}", None


def _instruct(svc: Service, goal_id: str, intent: Intent, who: Principal, said: str | None,
              via: str) -> tuple[str, dict[str, Any] | None]:
    """The chat intents that are instructions; the reply says what each replaced and whether it waits."""
    st, k = svc.store, intent.kind
    if k in ("pause", "resume", "stop"):
        ins, note = instruct(svc, goal_id, k, who, text=_said(said, k, via), via=via)
        return (f"{k} recorded for goal {goal_id} (instruction {ins.id} by {who.name})" + (f"; {note}" if note else ""),
                {"instruction": ins.id})
    if k == "one_more_round":
        if (bad := off_space(st.get_goal(goal_id).spec.space(), intent.knobs)) is not None:
            return f"not done: {bad}; nothing changed", None
        ins, note = instruct(svc, goal_id, "one_more_round", who, count=intent.count or 1, knobs=intent.knobs,
                             text=_said(said, "one more round", via), via=via)
        at = ", ".join(f"{a}={b}" for a, b in intent.knobs.items()) or "the planner's next candidate"
        return (f"{ins.count} more round(s) at {at}, then the loop stops (instruction {ins.id} by {who.name})"
                + (f"; {note}" if note else ""), {"instruction": ins.id})
    if k == "restore_best":
        best = st.best(goal_id)
        if best is None or not best.station_hash:
            return f"goal {goal_id} has no best station yet", None
        ins, note = queue_restore(svc, goal_id, best.station_hash, who, _said(said, "go back to the best", via), via)
        return (f"queued: go back to the best station {best.station_hash} (from experiment {best.run_id}: "
                f"{figures(svc, best.run_id)}). The loop re-deploys it, checks its health and stops; the decision "
                f"log shows the result (instruction {ins.id} by {who.name})" + (f"; {note}" if note else ""),
                {"instruction": ins.id, "station": best.station_hash})
    return HELP, None


def _budget(svc: Service, goal_id: str, intent: Intent, who: Principal,
            via: str) -> tuple[str, dict[str, Any] | None] | None:
    """The chat's budget answers (grant, refuse), else None."""
    k = intent.kind
    if k == "extend_budget":
        ext = extend_budget(svc, goal_id, who, intent.card_hours or 0.0, intent.experiments, "chat", via=via)
        return (f"budget of goal {goal_id} extended by {ext.card_hours:g} card-hours and {ext.experiments} "
                f"experiment(s) (extension {ext.id} by {who.name}); the loop goes on",
                {"extension": ext.id, "card_hours": ext.card_hours, "experiments": ext.experiments})
    if k == "refuse_extension":
        ext = refuse_extension(svc, goal_id, who, intent.reason, via=via)
        return (f"budget extension refused by {who.name}" + (f": {intent.reason}" if intent.reason else "")
                + f"; goal {goal_id} stops (extension {ext.id})", {"extension": ext.id, "decision": "refuse"})
    return None


def _said(said: str | None, what: str, via: str = "chat") -> str:
    """An instruction's text: the person's own words when the chat gave them, else the command."""
    return f"{via}: {' '.join(said.split())[:300]}" if said and said.strip() else f"{via}: {what}"


def off_space(space: dict[str, tuple[Any, ...]], knobs: dict[str, Any]) -> str | None:
    """Why a round's knobs are not a station of the goal (a value outside its list), naming the goal's values."""
    for name, value in knobs.items():
        values = space.get(name)
        if values and not any(value == v for v in values):
            listed = ", ".join("inf" if isinstance(v, float) and v == float("inf") else f"{v:g}"
                               if isinstance(v, (int, float)) else str(v) for v in values)
            return f"{name}={value:g} is not one of the goal's values for {name}: {listed}"
    return None


def queue_restore(svc: Service, goal_id: str, station_hash: str, who: Principal, text: str,
                  via: str = "api") -> tuple[Any, str]:
    """'Go back to a station' has one path: an instruction the goal's loop carries out (agent/loop/restore.py),
    so it runs once, under the target's lease, and lands in the decision log with who asked."""
    svc.store.get_station(station_hash)  # NotFound (404) for a station nobody froze
    check_restore(svc, goal_id, station_hash)
    return instruct(svc, goal_id, "restore", who, restore=station_hash, text=text, via=via)


def check_restore(svc: Service, goal_id: str, station_hash: str) -> None:
    """A goal restores only a station it ran itself, on its own target (ValueError naming `restore`: 422)."""
    st = svc.store
    goal = st.get_goal(goal_id)
    try:
        station = st.get_station(station_hash)
    except NotFound:
        raise FieldError("restore", f"no frozen station with hash {station_hash!r}") from None
    if station.target != goal.spec.target:
        raise FieldError("restore", f"station {station_hash} is on target {station.target!r}, not on goal {goal_id}'s "
                         f"target {goal.spec.target!r}")
    if not any(r.station_hash == station_hash for r in st.runs(goal_id)):
        raise FieldError("restore", f"station {station_hash} was not run by goal {goal_id}; restore it through the "
                         f"goal that ran it (POST /stations/{station_hash}/restore)")


def goal_of_station(svc: Service, station_hash: str) -> str:
    """The goal whose latest experiment ran this station (the loop that owns its target)."""
    svc.store.get_station(station_hash)
    runs = [r for r in svc.store.runs() if r.station_hash == station_hash and r.goal_id]
    if not runs:
        raise NotFound(f"station {station_hash} belongs to no goal: restore it with `tuneloop restore {station_hash}`")
    return max(runs, key=lambda r: r.created_at).goal_id
