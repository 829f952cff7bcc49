"""`tuneloop run GOAL.yaml`: the loop to a stop, with a live display (phase, card, best so far, budget)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agent.session import SessionResult, make_planner, run_session


class Display:
    """Live table fed by the loop's events; also usable without a terminal (then it prints one line each)."""

    def __init__(self, store_url: str, console: Console):
        self.console, self.store_url = console, store_url
        self.rows: dict[str, str] = {"phase": "-", "card": "-", "last": "-", "best": "-", "budget": "-"}
        self.live: Live | None = None

    def table(self) -> Table:
        t = Table(show_header=False, title="tuneloop run", expand=False)
        for k, v in self.rows.items():
            t.add_row(k, v)
        return t

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        self.rows["phase"] = phase + (f" (retry {info['retry']} after {info['fault']})" if info.get("retry") else "")
        card = info.get("card")
        if card:
            ch = card.get("change")
            what = f"{ch['knob']} {ch['old']} -> {ch['new']}" if ch else "reference"
            self.rows["card"] = f"{card['stage']} N={card['n']}: {what} [{card.get('cost_class')}]"
        if info.get("reason"):
            self.rows["last"] = str(info["reason"])[:160]
        if phase in ("judge", "stop", "observe"):
            self._refresh_store_rows()
        if self.live is not None:
            self.live.update(self.table())
        elif not self.console.is_terminal:
            self.console.print(f"[{self.rows['phase']}] {self.rows['card']} | {self.rows['last']}", highlight=False)

    def _refresh_store_rows(self) -> None:
        from state.store import Store

        st = Store(self.store_url)
        try:
            goals = st.goals()
            if not goals:
                return
            gid = goals[-1].id
            b = st.budget(gid)
            self.rows["budget"] = (f"{b.card_hours_used:.2f}/{b.card_hours_limit:.2f} card-h, "
                                   f"{b.experiments_used}/{b.experiments_limit} experiments")
            best = st.best(gid)
            if best is not None and best.run_id:
                res = st.get_result(best.run_id)
                s = res.result.summary if res else None
                if s is not None:
                    nat = f"{s.native.output_tok_s_per_card:.1f}" if s.native else "—"
                    self.rows["best"] = (f"{best.kind} run {best.run_id[-12:]}: whole "
                                         f"{s.whole.output_tok_s_per_card if s.whole else 0:.1f} / native {nat} "
                                         f"tok/s/card at N={s.n_formal}")
        finally:
            st.close()


def summary_text(res: SessionResult, store_url: str) -> str:
    from state.kpis import compute_kpis
    from state.store import Store

    st = Store(store_url)
    try:
        lines = [f"goal {res.goal_id}: {res.status} — {res.reason}"]
        for d in st.decisions(res.goal_id):
            if d.kind != "note" or "fell back" in d.text:
                lines.append(f"  [{d.kind}] {d.text}")
        best = st.best_station(res.goal_id)
        if best is not None:
            lines.append(f"best station {best.hash}: restore with `tuneloop restore {best.hash}`")
        k = compute_kpis(st, res.goal_id)
        lines.append(f"experiments {k.experiments} ({k.valid_experiments} valid), card-hours {k.card_hours_used:.2f}, "
                     f"improvement {k.improvement_pct if k.improvement_pct is None else round(k.improvement_pct, 2)} %, "
                     f"repeated negatives {k.repeated_negatives}, invalid negatives {k.invalid_negatives}")
        if res.state_path:
            lines.append(f"state file: {res.state_path}")
        report = _report(st, res.goal_id)
        if report:
            lines.append(f"report: {report}")
        return "\n".join(lines)
    finally:
        st.close()


def _report(store: Any, goal_id: str) -> str | None:
    """Write the report (agent.report, issue 8) beside the store; its path."""
    from agent.report import write_report

    try:
        return str(write_report(store, goal_id))
    except Exception as e:  # a report failure must not hide the loop's own summary
        return f"(report failed: {e})"


def run(goal: Path = typer.Argument(..., help="goal spec (YAML or JSON)"),
        db: Optional[str] = typer.Option(None, "--db", help="store URL (default sqlite:///.tuneloop/tuneloop.db)"),
        auto_approve: bool = typer.Option(False, "--auto-approve", help="approve every 'ask' step (never 'deny')"),
        llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", envvar="TUNELOOP_LLM_BASE_URL",
                                                   help="OpenAI-compatible endpoint for the LLM planner"),
        llm_model: str = typer.Option("tuneloop-planner", "--llm-model", envvar="TUNELOOP_LLM_MODEL"),
        fault: list[str] = typer.Option([], "--fault", help="inject a simulator fault into the Nth run: N:fault"),
        targets: Optional[Path] = typer.Option(None, "--targets", help="targets YAML (local/ssh engines; sim needs none)"),
        ) -> None:
    """Run the tuning loop for GOAL to a stop (or until a person must approve a step)."""
    from state.errors import GoalError
    from state.goal import load_goal

    try:
        spec = load_goal(goal)
    except GoalError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    url = db or "sqlite:///" + str(Path(".tuneloop") / "tuneloop.db")
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    faults = _fault_plan(fault)
    tg = None
    if isinstance(targets, (str, Path)):  # called from Python (tuneloop demo) the option object stands for None
        from executor.targets import load_targets
        try:
            tg = load_targets(targets)
        except (OSError, ValueError) as e:
            raise typer.BadParameter(str(e), param_hint="--targets") from None
    console = Console()
    display = Display(url, console)
    planner = make_planner(llm_base_url, llm_model, os.environ.get("TUNELOOP_LLM_API_KEY"))
    if console.is_terminal:
        with Live(display.table(), console=console, refresh_per_second=4) as live:
            display.live = live
            res = run_session(spec, url, auto_approve=auto_approve, planner=planner, faults=faults, on_event=display,
                              targets=tg)
    else:
        res = run_session(spec, url, auto_approve=auto_approve, planner=planner, faults=faults, on_event=display,
                              targets=tg)
    console.print(summary_text(res, url), highlight=False)
    if res.waiting_for:
        console.print(f"waiting: approve candidate {res.waiting_for.get('candidate_id')} "
                      f"(card hash {res.waiting_for.get('card_hash')}), then run again", highlight=False)


def _fault_plan(specs: list[str]) -> Any:
    """'2:stats_failure' -> the run with index 2 (0-based, in this goal) gets that simulator fault."""
    if not specs:
        return None
    plan: dict[int, list[str]] = {}
    for s in specs:
        idx, _, f = s.partition(":")
        if not idx.isdigit() or not f:
            raise typer.BadParameter(f"--fault {s!r}: expected N:fault, e.g. 1:stats_failure")
        plan.setdefault(int(idx), []).append(f)
    return lambda card, n_runs: plan.get(n_runs, [])
