"""`tuneloop report GOAL`: write the HTML report and its Markdown twin for a goal in the store."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer

if TYPE_CHECKING:  # the store is only annotated here (its import is deferred to the commands)
    from state.store import Store


def report(goal: str = typer.Argument(..., help="goal id in the store, or the goal's spec file (its latest goal)"),
           db: Optional[str] = typer.Option(None, "--db", envvar="TUNELOOP_DB",
                                            help="store URL (default sqlite:///.tuneloop/tuneloop.db)"),
           out: Optional[Path] = typer.Option(None, "--out", help="output folder (default beside the store)"),
           base: Optional[Path] = typer.Option(None, "--base", help="folder the loop ran in (relative run "
                                                                     "directories; default: the current folder)")) -> None:
    """Write report.html (self-contained) and report.md for GOAL; prints their paths."""
    from agent.report import default_dir, render_report

    with goal_in_store(goal, db) as (store, gid):
        paths = render_report(store, gid, out or default_dir(store.url, gid), base=base)
    typer.echo(f"report: {paths.html}")
    typer.echo(f"markdown: {paths.markdown}")


@contextmanager
def goal_in_store(goal: str, db: Optional[str]) -> Iterator[tuple[Store, str]]:
    """(the store, the goal's id) for a command about one goal (`tuneloop report`, `tuneloop best`): a store that
    is not there, a goal it does not hold (or a spec file none of its goals ran) end the command naming the store."""
    from agent.cli.steer import store_name
    from state.errors import GoalError
    from state.store import Store, default_url

    url = db or default_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise typer.BadParameter(f"no store at {store_name(url)}", param_hint="--db")
    store = Store(url)
    try:
        gid = _goal_id(store, goal)
        if gid is None:
            known = [g.id for g in store.goals()]
            raise typer.BadParameter(f"{goal!r}: no such goal in the store {store_name(url)} (known: {known})",
                                     param_hint="GOAL")
        yield store, gid
    except GoalError as e:
        raise typer.BadParameter(str(e), param_hint="GOAL") from None
    finally:
        store.close()


def _goal_id(store: object, goal: str) -> str | None:
    """A goal id as stored, or a spec file whose latest goal (same spec hash) is meant."""
    ids = {g.id: g for g in store.goals()}  # type: ignore[attr-defined]
    if goal in ids:
        return goal
    p = Path(goal)
    if p.is_file():
        from state.goal import load_goal

        h = load_goal(p).spec_hash()
        same = [g for g in ids.values() if g.spec_hash == h]
        return same[-1].id if same else None
    return None
