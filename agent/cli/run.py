"""`tuneloop run GOAL.yaml`: the loop to a stop, with a live display (phase, card, best so far, budget)."""
from __future__ import annotations

import os
import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agent.planner import change_words
from agent.loop.session import SessionResult, default_store_url, make_planner, run_session

if TYPE_CHECKING:  # the store is only annotated here (its import is deferred to the commands)
    from state.store import Store

PROGRESS_EVERY_S = 10.0  # piped output: one [progress] line this often while an experiment runs


class Display:
    """Live table fed by the loop's events and, between them, by the store: the progress row (running
    experiment, phase, elapsed against the estimate, requests done / N, budget) is re-read about once a
    second while the table is on a terminal. Without a terminal it prints one line per event, and a
    `[progress]` line every PROGRESS_EVERY_S seconds (`TUNELOOP_PROGRESS_S`) while an experiment runs."""

    def __init__(self, store_url: str, console: Console, runs_root: str | Path | None = None):
        from executor.phases import ExecSettings

        self.console, self.store_url = console, store_url
        self.runs_root = Path(runs_root) if runs_root is not None else Path(ExecSettings.from_env().runs_root)
        self.rows: dict[str, str] = {"phase": "-", "card": "-", "last": "-", "best": "-", "budget": "-",
                                     "progress": "-"}
        self.live: Live | None = None
        self.goal_id: str | None = None
        self.every = float(os.environ.get("TUNELOOP_PROGRESS_S") or PROGRESS_EVERY_S)
        self._store: Store | None = None
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._ticker: threading.Event | None = None

    def table(self) -> Table:
        if time.monotonic() - self._read_at >= 1.0:
            self._read_at = time.monotonic()
            self.rows["progress"] = self.progress_line() or "no experiment running"
        t = Table(show_header=False, title="tuneloop run", expand=False)
        for k, v in self.rows.items():
            t.add_row(k, v)
        return t

    def progress_line(self) -> str | None:
        """The goal's progress now (agent.loop.progress, as GET /goals/G shows it), or None when nothing runs."""
        from agent.loop.progress import goal_progress
        from state.store import Store

        with self._lock:  # the live table's refresh thread and the loop's thread share one store
            try:
                if self._store is None:
                    self._store = Store(self.store_url)
                gid = self.goal_id or next((g.id for g in reversed(self._store.goals())), None)
                p = goal_progress(self._store, gid, self.runs_root) if gid else None
            except Exception as e:  # a progress line must never stop the loop it describes
                return f"(progress not read: {type(e).__name__}: {e})"
        return p.line() if p else None

    def close(self) -> None:
        self._stop_ticker()
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.set()
            self._ticker = None

    def _start_ticker(self) -> None:
        stop = self._ticker = threading.Event()

        def tick() -> None:
            while not stop.wait(self.every):
                line = self.progress_line()
                if line and not stop.is_set():
                    typer.echo(f"[progress] {line}")

        threading.Thread(target=tick, name="tuneloop-progress", daemon=True).start()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        self._stop_ticker()
        if info.get("run_id") and self.goal_id is None:
            self._goal_of(str(info["run_id"]))
        self.rows["phase"] = phase + (f" (retry {info['retry']} after {info['fault']})" if info.get("retry") else "")
        card = info.get("card")
        if card:
            what = change_words(card, fmt=str) or "reference"
            self.rows["card"] = f"{card['stage']} N={card['n']}: {what} [{card.get('cost_class')}]"
        if info.get("reason"):
            self.rows["last"] = str(info["reason"])[:160]
        if phase in ("judge", "stop", "observe"):
            self._refresh_store_rows()
        if self.live is not None:
            self._read_at = 0.0
            self.live.refresh()
        else:  # no terminal (a pipe, a log file): one plain line per event, never a redrawn table
            typer.echo(event_line(phase, info, self.rows))
            if phase == "execute":
                self._start_ticker()

    def _goal_of(self, run_id: str) -> None:
        with self._lock:
            from state.store import Store

            st = self._store = self._store or Store(self.store_url)
            try:
                self.goal_id = st.get_run(run_id).goal_id
            except Exception:  # the run is registered just after this event: the latest goal stands in
                pass

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
                if s is not None:  # in the goal's own figures (core.goalview)
                    self.rows["best"] = f"{best.kind} run {best.run_id[-12:]}: {st.get_goal(gid).spec.view().figures_words(s)}"
        finally:
            st.close()


def event_line(phase: str, info: dict[str, Any], rows: dict[str, str]) -> str:
    """One line for one loop event (what a log file or a pipe gets instead of the live table)."""
    parts = [f"[{phase}]"]
    if info.get("retry"):
        parts.append(f"retry {info['retry']} after {info.get('fault')}")
    if info.get("card"):
        parts.append(rows["card"])
    if phase == "authorise" and info.get("why"):
        parts.append(f"({info['why']})")
    if info.get("run_id"):
        parts.append(f"run {info['run_id']}")
    if phase in ("judge", "stop") and info.get("reason"):
        parts.append("-> " + clip(" ".join(str(info["reason"]).split()), 200))
    if info.get("diagnosis"):
        parts.append("leading: " + str(info["diagnosis"]).splitlines()[0])
    if phase in ("observe", "stop"):
        parts.append(f"budget {rows['budget']}")
    return " ".join(parts)


def clip(text: str, most: int) -> str:
    """At most `most` characters, cut at a word's end with an ellipsis, never mid-word."""
    if len(text) <= most:
        return text
    cut = text[:most - 1]
    if text[most - 1] != " " and " " in cut:  # the cut falls inside a word: drop that word
        cut = cut.rsplit(" ", 1)[0]
    return cut + "…"


def restore_command(station: str, store_url: str, targets: Path | str | None = None) -> str:
    """`tuneloop restore` as it works when pasted in the directory the run was started from: the store, the runs
    root and the targets of this run (a store URL with a password is left to $TUNELOOP_DB, never printed)."""
    from executor.phases import ExecSettings
    from state.statefile import url_password

    runs_root = ExecSettings.from_env().runs_root
    db = '"$TUNELOOP_DB"' if url_password(store_url) else shlex.quote(store_url)
    parts = ["tuneloop restore", station, "--db", db, "--runs-root", shlex.quote(str(runs_root))]
    if targets is not None:
        parts += ["--targets", shlex.quote(str(targets))]
    return " ".join(parts)


def summary_text(res: SessionResult, store_url: str, targets: Path | str | None = None) -> str:
    from agent.report.kpis import kpi_lines
    from state.store import Store

    st = Store(store_url)
    try:
        lines = [f"goal {res.goal_id}: {res.status} — {res.reason}"]
        for d in st.decisions(res.goal_id):
            if d.kind != "note" or {"fallback", "predicted_negative"} & set(d.data or {}):
                lines.append(f"  [{d.kind}] {d.text}")
        best = st.best_station(res.goal_id)
        if best is not None:
            lines.append(f"best station {best.hash}: restore with `{restore_command(best.hash, store_url, targets)}`")
        lines += kpi_lines(st, res.goal_id)
        if res.state_path:
            lines.append(f"state file: {res.state_path}")
        report = _report(st, res.goal_id)
        if report:
            lines.append(f"report: {report}")
        return "\n".join(lines)
    finally:
        st.close()


def _report(store: Store, goal_id: str) -> str | None:
    """Write the report (agent.report, issue 8) beside the store; its path."""
    from agent.report import write_report

    try:
        return str(write_report(store, goal_id))
    except Exception as e:  # a report failure must not hide the loop's own summary
        return f"(report failed: {e})"


def run(goal: Path = typer.Argument(..., help="goal spec (YAML or JSON)"),
        db: Optional[str] = typer.Option(None, "--db", help="store URL (default $TUNELOOP_DB or sqlite:///.tuneloop/tuneloop.db)"),
        auto_approve: bool = typer.Option(False, "--auto-approve", help="approve every 'ask' step (never 'deny')"),
        llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", envvar="TUNELOOP_LLM_BASE_URL",
                                                   help="OpenAI-compatible endpoint for the LLM planner"),
        llm_model: str = typer.Option("tuneloop-planner", "--llm-model", envvar="TUNELOOP_LLM_MODEL"),
        fault: list[str] = typer.Option([], "--fault", help="inject a simulator fault into the Nth run: N:fault"),
        targets: Optional[Path] = typer.Option(None, "--targets", help="targets YAML (local/ssh engines; sim needs none)"),
        new: bool = typer.Option(False, "--new", help="start a fresh goal even if one with this spec exists"),
        data_dir: list[Path] = typer.Option([], "--data-dir", exists=True, file_okay=False,
                                            help="a data directory (scenarios/, profiles/) whose files the goal may "
                                                 "name, repeatable; a scenario there may replay the user's own "
                                                 "traffic (a dataset or trace beside it, examples/traffic)"),
        require_valid: bool = typer.Option(False, "--require-valid",
                                           help="exit 3 when the goal ends without one valid run (a broken engine, "
                                                "an unreachable target): what `make demo-real` checks"),
        twin: Optional[bool] = typer.Option(None, "--twin/--no-twin",
                                            help="search the goal's twin (a simulator calibrated to the goal's own "
                                                 "runs from its prior profile) and let it lead while it predicts the "
                                                 "runs (on by default; --no-twin or $TUNELOOP_TWIN=off turns it off)"),
        ) -> None:
    """Run the tuning loop for GOAL to a stop (or until a person must approve a step)."""
    from core.datafiles import DataFileError, share_with_children, use_data_dirs
    from state.errors import GoalError
    from state.goal import load_goal

    try:
        if isinstance(data_dir, list):  # called from Python (tuneloop demo) the option object stands for []
            use_data_dirs(data_dir)
            share_with_children(data_dir)  # a local target's load generator resolves the goal's scenario too
        spec = load_goal(goal)
    except (GoalError, DataFileError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    url = db or default_store_url()
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    from state.statefile import register_secrets, url_password

    register_secrets(os.environ.get("TUNELOOP_LLM_API_KEY"), url_password(url))  # redacted by value in STATE.md
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
    kw = dict(auto_approve=auto_approve, planner=planner, faults=faults, on_event=display, targets=tg,
              new_goal=new is True,  # called from Python (tuneloop demo) the option object stands for False
              twin=twin if isinstance(twin, bool) else None)
    try:
        if console.is_terminal:  # the table is re-rendered 4 times a second, so progress moves between events
            with Live(get_renderable=display.table, console=console, refresh_per_second=4) as live:
                display.live = live
                res = run_session(spec, url, **kw)
        else:
            res = run_session(spec, url, **kw)
    finally:
        display.close()
    if res.already_finished:
        typer.echo(res.reason)
        _require_valid(require_valid is True, url, res)
        return
    typer.echo(summary_text(res, url, targets if isinstance(targets, (str, Path)) else None))
    _require_valid(require_valid is True, url, res)
    if res.waiting_for and res.waiting_for.get("kind") == "budget_extension":
        w = res.waiting_for
        typer.echo(f"waiting: grant {w['card_hours']:.2f} card-hours and {w['experiments']} experiment(s) with "
                   f"`tuneloop budget extend {res.goal_id} --card-hours {w['card_hours']:g}"
                   f"{' --db ' + url if db else ''}` (or refuse: `tuneloop budget refuse {res.goal_id} --reason …`), "
                   "then run again")
    elif res.waiting_for:
        typer.echo(f"waiting: approve candidate {res.waiting_for.get('candidate_id')} "
                   f"(card hash {res.waiting_for.get('card_hash')}): `tuneloop approve {res.waiting_for.get('candidate_id')}"
                   f"{' --db ' + url if db else ''}` (or the API), then run again")


def valid_runs(store_url: str, goal_id: str) -> int:
    """How many runs of the goal ended with a valid verdict."""
    from state.store import Store

    st = Store(store_url)
    try:
        return sum(1 for r in st.runs(goal_id) if (res := st.get_result(r.id)) is not None and res.valid)
    finally:
        st.close()


def _require_valid(on: bool, url: str, res: SessionResult) -> None:
    if on and not res.waiting_for and valid_runs(url, res.goal_id) == 0:
        typer.echo(f"goal {res.goal_id}: no run was valid ({res.status}: {res.reason}); the decisions above say "
                   "why each run was not", err=True)
        raise typer.Exit(3)


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
