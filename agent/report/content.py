"""What a report says, gathered from the store alone: the goal, its contract, the best station, the decision
log and the trade-off rows. Pure reads; the renderers only format what is here, so the tests can check
the written report against these values and these values against the store.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from agent.loop.record import card_of, frozen_stations
from agent.report.experiment import Experiment
from agent.report.people import PersonDecision, gather_people
from agent.report.tradeoffs import TradeRow, tradeoffs
from core.metrics import DEFINITIONS
from core.scenarios import Traffic, load
from core.summary import Summary
from core.ledger import Scored
from state.hypotheses import hypothesis_ledger
from state.kpis import LoopKPIs, compute_kpis
from state.ledger import BudgetState, summarize_ledger
from state.snapshots import Decision, Goal, LedgerEntry
from state.store import BEST_KINDS, Store

# what a decision of each kind ruled out, when it is not a negative (only a valid negative rules a change out)
RULED_OUT = {
    "baseline": "nothing: a reference is never a negative",
    "promising": "nothing yet: the screen passed, the confirmation decides",
    "tradeoff": "nothing: kept on the frontier as a trade-off",
    "quality_pending": "nothing yet: performance-positive, quality pending",
    "quality_failed": "this station as a deployable best: its quality evaluation failed",
    "fault": "nothing: a fault or a contract violation is not a result, never a negative",
}


@dataclass
class Content:
    goal: Goal
    store_url: str
    contract: dict[str, Any]
    scenario: dict[str, Any]
    definitions: dict[str, str]
    definitions_from: str  # which run recorded them, or the load generator's own
    experiments: list[Experiment]
    best: Experiment | None
    best_station: Any  # state.snapshots.Station or None
    restore_command: str | None
    pending: list[Experiment]  # performance-positive, quality pending
    quality_failed: list[Experiment]
    tradeoffs: dict[str, dict[int, list[TradeRow]]]  # scenario -> N -> rows
    kpis: LoopKPIs
    budget: BudgetState
    ledger: list[LedgerEntry]
    ledger_summary: dict[str, Any]
    stop: Decision | None
    notes: list[Decision] = field(default_factory=list)
    hypotheses: list[Scored] = field(default_factory=list)  # the hypothesis ledger (state.hypotheses)
    people: list[PersonDecision] = field(default_factory=list)  # every person's decision, in time order
    auto_approvals: int = 0  # cards the loop approved itself (the authorisation table's auto, --auto-approve)


def objective_of(goal: Goal, s: Summary | None) -> float | None:
    return goal.spec.objective.value(s) if s is not None else None


def gather(store: Store, goal_id: str, base: str | Path | None = None) -> Content:
    """Everything the report says; relative run directories in the store resolve against `base`
    (default: the current folder, where `tuneloop run` wrote them)."""
    base = Path(base) if base is not None else Path.cwd()
    goal = store.get_goal(goal_id)
    spec = goal.spec
    runs = [r for r in store.runs(goal_id) if r.stage != "restore"]
    results = {r.run_id: r.result for r in store.results(goal_id)}
    cands = {c.id: c for c in store.candidates(goal_id)}
    decisions = store.decisions(goal_id)
    ledger = store.ledger(goal_id)
    by_run: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.run_id:
            by_run.setdefault(d.run_id, []).append(d)
    # the card's knobs digest -> the executor's station hash, so a parent is named as `tuneloop restore` knows it
    frozen = frozen_stations(store, goal_id)
    hours: dict[str, float] = {}
    for e in ledger:
        hours[e.run_id] = hours.get(e.run_id, 0.0) + e.card_hours
    experiments = []
    for i, r in enumerate(runs, 1):
        card = dict(cands[r.candidate_id].card) if r.candidate_id in cands else {}
        ds = tuple(by_run.get(r.id, ()))
        outcome = next((d for d in ds if "outcome" in (d.data or {})), None)
        res = results.get(r.id)
        experiments.append(Experiment(
            index=i, run=r, card=card, station=r.station_hash or (res.station_hash if res else None),
            parent=frozen.get(card_of(card).parent_knobs_hash) if card else None, result=res,
            outcome=outcome, decisions=ds, ruled_out=_ruled_out(outcome, card), card_hours=hours.get(r.id, 0.0),
            run_dir=(base / res.run_dir).resolve() if res and res.run_dir else None))
    by_id = {e.run.id: e for e in experiments}
    best_d = store.best(goal_id)
    best = by_id.get(best_d.run_id) if best_d and best_d.run_id else None
    station = None
    if best_d is not None and best_d.station_hash:
        try:
            station = store.get_station(best_d.station_hash)
        except LookupError:
            station = None
    evaluated = {d.station_hash for d in decisions if d.kind in ("quality_passed", "quality_failed")}
    pending = [by_id[d.run_id] for d in decisions if d.kind == "quality_pending" and d.run_id in by_id
               and d.station_hash not in evaluated]
    failed = [by_id[d.run_id] for d in decisions if d.kind == "quality_failed" and d.run_id in by_id]
    stops = [d for d in decisions if d.kind == "stop"]
    defs, defs_from = definitions(goal, store.results(goal_id))
    people, auto = gather_people(store, goal_id, {cid: c.card for cid, c in cands.items()})
    return Content(
        goal=goal, store_url=store.url, contract=spec.contract().model_dump(), scenario=_scenario(spec.scenario),
        definitions=defs, definitions_from=defs_from, experiments=experiments, best=best,
        best_station=station, restore_command=restore_command(store.url, station, best),
        pending=pending, quality_failed=failed, tradeoffs=tradeoffs(goal, experiments),
        kpis=compute_kpis(store, goal_id), budget=store.budget(goal_id), ledger=ledger,
        ledger_summary=summarize_ledger(ledger), stop=stops[-1] if stops else None,
        notes=[d for d in decisions if d.kind == "note"], hypotheses=hypothesis_ledger(store, goal_id),
        people=people, auto_approvals=auto)


def definitions(goal: Goal, results: list[Any]) -> tuple[dict[str, str], str]:
    """The metric definitions a run recorded with its summary; else the load generator's, with this goal's
    native-window minimums."""
    for r in results:
        if r.result.summary is not None and r.result.summary.definitions:
            return dict(r.result.summary.definitions), f"as recorded with run {r.run_id}"

    p = goal.spec.protocol
    defs = dict(DEFINITIONS)
    try:
        defs["native_window"] = defs["native_window"].format(min_n=p.native_min_requests, min_s=p.native_min_seconds)
    except (KeyError, IndexError):
        pass
    return defs, "the load generator's definitions (no run recorded its own)"


def _ruled_out(outcome: Decision | None, card: dict[str, Any]) -> str:
    if outcome is None:
        return "nothing: not judged"
    if outcome.kind == "negative":
        ch = card.get("change") or {}
        return (f"{card.get('negative_rules_out', 'this change')} — {ch.get('knob')}={ch.get('new')!r} is not "
                f"tried again from the same parent, scenario, data version and source")
    if outcome.kind == "new_best":
        return "the parent station as the deployable best"
    return RULED_OUT.get(outcome.kind, "nothing")


def _scenario(name: str) -> dict[str, Any]:
    """The fixed scenario as the scenario catalog describes it (empty where it is not known here)."""
    try:

        sc = load(name)
    except Exception:  # a scenario this machine does not hold: the report still names it
        return {"name": name}
    if isinstance(sc, Traffic):  # the user's own traffic: where it comes from, not a generator's parameters
        src = sc.source
        return {"name": name, "data_version": sc.data_version, "version": sc.version, "task": sc.task,
                "source": f"{src.format} file {src.file}, {len(sc.rows)} requests, sha256 {src.sha256}",
                "timing": ("the file's own arrival times" + (f", {src.speed:g}x as fast" if src.speed != 1 else "")
                           if src.replays_times else "stretched to the station's request rate")}
    keep = ("version", "task", "input_len", "input_jitter", "output_len", "prefix_share", "prefix_groups",
            "min_request_hit", "seed")
    dump = sc.model_dump(mode="json")
    return {"name": name, "data_version": sc.data_version, "zero_cache": sc.zero_cache} | {
        k: dump[k] for k in keep if k in dump}


def restore_command(store_url: str, station: Any, best: Experiment | None) -> str | None:
    """The one command that re-deploys the best station (with this store and run root where not default)."""
    if station is None:
        return None


    url = make_url(store_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        url = url.set(database=str(Path(url.database).resolve()))  # the report is read from anywhere
    parts = ["tuneloop", "restore", station.hash, "--store", url.render_as_string(hide_password=True)]
    if best is not None and best.run_dir is not None:  # run dirs are <runs-root>/<run id>/load
        parts += ["--runs-root", str(best.run_dir.parents[1])]
    return shlex.join(parts)


def best_objectives(content: Content) -> list[tuple[str, float, float | None, int | None]]:
    """(run id, card-hours spent after the run, the deployable best's objective then, its N) in run order."""
    spent, out, best, beaten = 0.0, [], None, False
    for e in content.experiments:
        spent += e.card_hours
        for d in e.decisions:  # a reference run makes a best only until something beat the start (Store.best)
            if d.kind in BEST_KINDS and (d.kind != "baseline" or not beaten):
                best, beaten = e, beaten or d.kind != "baseline"
        s = best.summary if best else None
        out.append((e.run.id, spent, objective_of(content.goal, s), s.n_formal if s else None))
    return out
