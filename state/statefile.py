"""STATE.md: one short state file per goal (`<runs>/<goal>/STATE.md`), rewritten atomically on every transition.

It says what a person (or the loop after a restart) needs at a glance: the instruction and the
authorisation in force, the best station, the frontier, the running experiment and phase, the
budget, and why the loop waits or stopped. The loop reads back only `instruction` and
`authorisation` (`parse_state`). Nothing secret is ever written: a redaction pass by value runs last.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import make_url

from core.errors import FieldError
from core.goalview import GoalView
from core.ledger import drift_line
from core.records import default_runs_root, write_atomic
from state.db import canon

# structural only: a password in a URL's userinfo (`scheme://user:password@host`) and an HTTP bearer header;
# everything else is redacted by value (the configured tokens, keys and passwords), never by a word pattern
# that could hit an id (a goal named `j16k-ask-…` keeps its name)
_SECRET_PATTERNS = [
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),  # user:password@ in URLs
    re.compile(r"(?i)(?<=\bbearer )[A-Za-z0-9._\-~+/=]{12,}"),
]
_SECRETS: set[str] = set()
MIN_SECRET_LEN = 6  # shorter values would blank out ordinary words


def register_secrets(*values: Any) -> None:
    """Values this process knows to be secret (API tokens, LLM keys, webhook URLs, passwords): never written
    to STATE.md. SecretStr values are unwrapped; None and short strings are ignored."""
    for v in values:
        if v is None:
            continue
        if hasattr(v, "get_secret_value"):
            v = v.get_secret_value()
        v = str(v)
        if len(v) >= MIN_SECRET_LEN:
            _SECRETS.add(v)


def url_password(url: str) -> str | None:
    try:

        return make_url(url).password
    except Exception:  # not a database URL
        return None


def redact(text: str, secrets: Any = ()) -> str:
    """Replace every known secret value (and URL passwords, bearer tokens) with [redacted]."""
    for value in sorted(set(secrets) | _SECRETS, key=len, reverse=True):
        if value and len(value) >= MIN_SECRET_LEN:
            text = text.replace(value, "[redacted]")
    for pat in _SECRET_PATTERNS:
        text = pat.sub("[redacted]", text)
    return text


class StateView(BaseModel):
    """What the loop reads back from STATE.md."""

    model_config = ConfigDict(frozen=True)
    goal_id: str | None
    status: str | None
    instruction: dict[str, Any] | None
    authorisation: dict[str, str]


def _fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _figures(results: dict[str, Any], run_id: str | None, view: GoalView) -> dict[str, Any]:
    res = results.get(run_id) if run_id else None
    summ = res.result.summary if res else None
    if summ is None:
        return {}
    return {
        "n": summ.n_formal,
        "whole": view.objective(summ, "whole"),
        "native": view.objective(summ, "native"),
        "native_n": summ.native.n_requests if summ.native else None,
        "native_s": summ.native.duration if summ.native else None,
    }


def _frozen_stations(store: Any, goal_id: str) -> dict[str, str]:
    """The planner's knobs digest of each run card -> the frozen station hash its run recorded (the first run of
    those knobs names it, as agent.loop.record.frozen_stations does; the card keeps its digest as `knobs_hash`)."""
    cards = {c.id: c.card for c in store.candidates(goal_id)}
    results = {r.run_id: r.station_hash for r in store.results(goal_id)}
    out: dict[str, str] = {}
    for r in store.runs(goal_id):
        h = r.station_hash or results.get(r.id)
        digest = (cards.get(r.candidate_id) or {}).get("knobs_hash")
        if h and digest:
            out.setdefault(digest, h)
    return out


def render_state(store: Any, goal_id: str) -> str:
    """The whole STATE.md text for one goal, from the store alone."""
    goal = store.get_goal(goal_id)
    instr = store.current_instruction(goal_id)
    budget = store.budget(goal_id)
    best = store.best(goal_id)
    results = {r.run_id: r for r in store.results(goal_id)}  # one read for every figure below
    view = goal.spec.view()  # the goal's own figures (core/goalview.py): its objective, each limit, what it reports
    cols = view.columns()
    lines = [f"# tuneloop state: goal {goal.id} ({goal.name})", "",
             "<!-- rewritten atomically on every transition; the loop reads back `instruction` and `authorisation` -->",
             "", f"- status: {goal.status}", f"- why: {goal.status_reason or '-'}"]
    idata = None
    if instr is not None:
        idata = {"kind": instr.kind, "count": instr.count, "remaining": instr.remaining, "knobs": instr.knobs,
                 "restore": instr.restore, "who": instr.who, "id": instr.id}
    lines.append(f"- instruction: {json.dumps(canon(idata), sort_keys=True)}")
    lines.append("- authorisation: " + ", ".join(f"{k}={v}" for k, v in goal.spec.authorisation.items()))
    deadline = budget.deadline.isoformat() if budget.deadline else "-"
    lines.append(f"- budget: {budget.card_hours_used:.3f} of {budget.card_hours_limit:.3f} card-hours used "
                 f"({budget.card_hours_left:.3f} left); experiments {budget.experiments_used} of "
                 f"{budget.experiments_limit} ({budget.experiments_left} left); deadline {deadline}")
    if budget.extended_card_hours or budget.extended_experiments:
        lines.append(f"  - extended by people: +{budget.extended_card_hours:.3f} card-hours, "
                     f"+{budget.extended_experiments} experiments")
    vetoes = store.vetoes(goal_id)
    frozen = _frozen_stations(store, goal_id) if vetoes else {}
    for v in vetoes:
        what = f"{v.knob}={json.dumps(canon(v.value))}" if v.knob else "reference run"
        by = f"rejected by {v.who}" if v.source == "person" else "denied by the authorisation table"
        # a veto keeps the planner's knobs digest of its parent; the line names the frozen station that digest ran
        # as (what /stations/<hash> and `tuneloop restore` take), or says that there is none
        where = (f"station {frozen[v.parent_hash]}" if v.parent_hash in frozen else
                 f"a parent never run (knobs digest {v.parent_hash}: no frozen station yet)")
        lines.append(f"- vetoed: {what} from {where} (candidate {v.candidate_id}), {by}"
                     + (f": {v.reason}" if v.reason else ""))
    running = [r for r in store.runs(goal_id) if r.status in ("pending", "running", "unknown")]
    if running:
        for r in running:
            ph = store.phases(r.id)
            where = f"{ph[-1].phase} ({ph[-1].event}, {ph[-1].status})" if ph else "not started"
            lines.append(f"- running: run {r.id} candidate {r.candidate_id} {r.stage} N={r.n} [{r.status}] phase {where}")
    else:
        lines.append("- running: none")
    if best and best.station_hash:
        st = store.get_station(best.station_hash)
        res = results.get(best.run_id) if best.run_id else None
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(st.knobs.items()))
        lines.append(f"- best station: {st.hash} (run {best.run_id}, {best.kind}); "  # in the goal's own figures
                     + view.figures_words(res.result.summary if res else None))
        lines.append(f"  - knobs: {knobs}")
        lines.append(f"  - restore: tuneloop restore {st.hash}")
    else:
        lines.append("- best station: none yet")
    drifts = [(rid, r.result.evidence.drift) for rid, r in results.items() if r.result.evidence.drift]
    if drifts:  # the latest real run's simulator cross-check (a target with a calibrated profile)
        lines.append(f"- simulator drift (run {drifts[-1][0]}): {drift_line(drifts[-1][1])}")
    lines += ["", "## Frontier (valid stations; whole and native in separate columns, empty = no valid window)", "",
              f"| station | decision | run | N | whole {view.unit} | native {view.unit} | native N | native s | "
              + "".join(f"{c.words} | " for c in cols), "|---|---|---|---|---|---|---|---|" + "---|" * len(cols)]
    for d in store.frontier(goal_id):
        f = _figures(results, d.run_id, view)
        res = results.get(d.run_id) if d.run_id else None
        lines.append(f"| {d.station_hash or ''} | {d.kind} | {d.run_id or ''} | {f.get('n', '')} | {_fmt(f.get('whole'))} "
                     f"| {_fmt(f.get('native'))} | {f.get('native_n') or ''} | {_fmt(f.get('native_s'), 1)} | "
                     + "".join(f"{c.text(res.result.summary if res else None)} | " for c in cols))
    return redact("\n".join(lines) + "\n", filter(None, [url_password(str(getattr(store, "url", "")))]))


def default_path(store: Any, goal_id: str | None = None, runs_root: str | Path | None = None) -> Path:
    """One STATE.md per goal: `<runs>/<goal>/STATE.md` (runs root: the executor's, $TUNELOOP_RUNS_ROOT or
    .tuneloop/runs). Without a goal: beside a SQLite store file, else in the working directory."""
    if goal_id is not None:
        if runs_root is None:
            runs_root = default_runs_root()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}", goal_id):
            raise FieldError("goal_id", f"{goal_id!r} cannot name a folder")
        return Path(runs_root) / goal_id / "STATE.md"
    url = str(store.url)
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return Path(url[len("sqlite:///"):]).parent / "STATE.md"
    return Path("STATE.md")


def write_state(store: Any, goal_id: str, path: str | Path | None = None, *, runs_root: str | Path | None = None) -> Path:
    """Render and replace the goal's STATE.md atomically: readers see the old file or the new one, never a mix."""
    p = Path(path) if path is not None else default_path(store, goal_id, runs_root)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, render_state(store, goal_id))
    return p


_LINE = re.compile(r"^- (status|instruction|authorisation): (.*)$")
_GOAL = re.compile(r"^# tuneloop state: goal (\S+)")


def parse_state(text: str) -> StateView:
    """Read back the fields the loop takes its authority from."""
    goal_id = status = None
    instruction: dict[str, Any] | None = None
    auth: dict[str, str] = {}
    for line in text.splitlines():
        if m := _GOAL.match(line):
            goal_id = m.group(1)
        elif m := _LINE.match(line):
            key, val = m.groups()
            if key == "status":
                status = val.strip()
            elif key == "instruction":
                instruction = json.loads(val)
            else:
                auth = dict(part.strip().split("=", 1) for part in val.split(",") if "=" in part)
    return StateView(goal_id=goal_id, status=status, instruction=instruction, authorisation=auth)


def read_state(path: str | Path) -> StateView:
    return parse_state(Path(path).read_text(encoding="utf-8"))
