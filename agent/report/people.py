"""What people decided about a goal, for the report: every approval and rejection a person gave, every budget
extension granted or refused, every instruction, with who, where (the `who` strings carry "name (via)": api,
chat, cli, slack, feishu), when and why. The loop's own approvals (the authorisation table's `auto`, or
--auto-approve) are counted apart: they are no person's decision, and listing them as one would hide who decided.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.planner import change_words
from agent.report.blocks import Block, Cell, Heading, Para, Table

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

_VIA = re.compile(r"^(?P<name>.*\S) \((?P<via>[a-z][a-z0-9_-]*)\)$")  # "alice (slack)"; not "(--auto-approve)"


@dataclass(frozen=True)
class PersonDecision:
    when: datetime
    who: str
    via: str  # api | chat | cli | slack | feishu, or "" where the record does not say
    kind: str  # approve | reject | budget extension | budget extension refused | instruction: <kind>
    subject: str  # the card (candidate id and its change), the extension, the instruction's arguments
    reason: str
    outcome: str = ""  # what became of an instruction


def split_who(who: str) -> tuple[str, str]:
    """("alice", "slack") from "alice (slack)"; (who, "") where no channel is named."""
    m = _VIA.match(who or "")
    return (m["name"], m["via"]) if m else (who, "")


def _card(cid: int, card: dict[str, Any]) -> str:
    what = change_words(card, "→") or "measure the parent station (a reference)"
    return f"candidate {cid}: {card.get('stage', '?')} N={card.get('n', '?')}, {what}"


def gather_people(store: Store, goal_id: str, cards: dict[int, dict[str, Any]]) -> tuple[list[PersonDecision], int]:
    """Every person's decision on the goal in time order, and how many approvals the loop gave itself."""
    out: list[PersonDecision] = []
    auto = 0
    for cid, card in cards.items():
        ap = store.approval(cid)
        if ap is None:
            continue
        if ap.automatic:  # the approval's own column (state.snapshots.Approval), never its words
            auto += 1
            continue
        name, via = split_who(ap.who)
        out.append(PersonDecision(ap.created_at, name, via, ap.decision, _card(cid, card), ap.reason or ""))
    for x in store.extensions(goal_id):
        name, via = split_who(x.who)
        if x.decision == "grant":
            out.append(PersonDecision(x.created_at, name, via, "budget extension",
                                      f"+{x.card_hours:g} card-hours, +{x.experiments} experiment(s)", x.reason or ""))
        else:
            out.append(PersonDecision(x.created_at, name, via, "budget extension refused", "the goal stops",
                                      x.reason or ""))
    for i in store.instructions(goal_id):
        name, via = split_who(i.who)
        args = [f"{i.count} round(s)"] * bool(i.count) + [f"station {i.restore}"] * bool(i.restore)
        args += [", ".join(f"{k}={v}" for k, v in i.knobs.items())] * bool(i.knobs)
        out.append(PersonDecision(i.created_at, name, via, f"instruction: {i.kind}", "; ".join(args) or "the goal",
                                  i.text or "", i.outcome or ("in force" if i.active else "")))
    return sorted(out, key=lambda d: d.when), auto


def section(people: list[PersonDecision], auto: int) -> list[Block]:
    out: list[Block] = [Heading(2, "People's decisions", "people"),
                        Para("Every approval, rejection, budget extension, refusal and instruction a person gave, "
                             "with who, where (api, chat, cli, slack, feishu as recorded), when (UTC) and why.",
                             "muted")]
    if people:
        out.append(Table(("when (UTC)", "who", "where", "decision", "about", "why", "outcome"),
                         tuple((Cell(f"{d.when:%Y-%m-%d %H:%M:%S}", "when"), Cell(d.who, "who"),
                                Cell(d.via or "not recorded", "via"), Cell(d.kind, "kind"), Cell(d.subject, "about"),
                                Cell(d.reason, "reason"), Cell(d.outcome, "outcome")) for d in people),
                         "people", tuple(f"{d.kind}|{i}" for i, d in enumerate(people, 1))))
    else:
        out.append(Para("No person has decided anything on this goal yet.", "people none"))
    if auto:
        out.append(Para(f"{auto} card(s) approved by the loop itself (the authorisation table's auto, or "
                        "--auto-approve): no person was asked.", "people auto"))
    return out
