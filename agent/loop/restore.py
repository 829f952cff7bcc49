"""'Go back to the best': the one instruction the loop carries out itself, through the executor's restore.

The station is re-deployed from its frozen bytes and checked healthy; the decision log says who asked and
what came back; the instruction then stops being in force (a restart after that does not restore again).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from core.executor_port import ExecutorPort
from state.lifecycle import OutcomeKind

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store


def go_back(store: Store, executor: ExecutorPort, goal_id: str, event: Callable[..., None]) -> str:
    """Restore the best (or the instruction's) station; the stop reason."""
    ins = store.current_instruction(goal_id)
    if ins is None or ins.kind != "restore":  # carried out before a restart
        return "restore already done"
    best = store.best_station(goal_id)
    target = ins.restore or (best.hash if best is not None else None)
    if target is None:
        text = f"go back to the best, asked by {ins.who}: there is no best station yet; nothing restored"
        store.record_decision(goal_id, "restore", text=text, data={"asked_by": ins.who, "station": None})
        store.close_instruction(ins.id, OutcomeKind.REFUSED, "there is no best station yet; nothing restored")
        return text
    event("restore", station=target, asked_by=ins.who)
    try:
        out = executor.restore(target)
    except Exception as e:  # the station cannot be brought back: say so; the loop stops either way
        out = {"station": target, "healthy": False, "error": f"{type(e).__name__}: {e}"}
    ok = bool(out.get("healthy")) and out.get("identical", True) is not False
    text = (f"went back to station {target} as asked by {ins.who}: " +
            ("healthy, identical to the frozen station" if ok else f"FAILED ({out.get('error') or out})"))
    store.record_decision(goal_id, "restore", station_hash=target, text=text,
                          data={"asked_by": ins.who, "station": target, "result": out})
    store.close_instruction(ins.id, OutcomeKind.DONE if ok else OutcomeKind.FAILED, text)
    return text
