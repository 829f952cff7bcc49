"""How a person steers a goal from the command line: `tuneloop approve`, `tuneloop instruct`, `tuneloop budget`.

Each writes to the store and wakes the goal, so a running `tuneloop serve` on the same store carries it out
within its poll interval (or the next `tuneloop run` does). The commands defer their imports (the store and
its drivers) so `tuneloop --help` stays light.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Optional

import typer

from agent.loop.session import default_store_url

if TYPE_CHECKING:  # the store is only annotated here
    from state.workqueue import QueueStore

DbOpt = typer.Option(None, "--db", help="store URL (default $TUNELOOP_DB or sqlite:///.tuneloop/tuneloop.db)")


@contextmanager
def steering_store(db: Optional[str], what: str, errors: tuple[type[BaseException], ...]) -> Iterator[QueueStore]:
    """The store for one steering command; an error it names ends the command with exit 1 and the reason. A thing
    it does not find (no such goal, no such candidate) names the store it searched and how to name another."""
    from state.errors import NotFound
    from state.workqueue import QueueStore

    url = db or default_store_url()
    st = QueueStore(url)
    try:
        yield st
    except errors as e:
        where = ""
        if isinstance(e, NotFound):
            how = "" if db else " (the default: --db or $TUNELOOP_DB names another)"
            where = f" in the store {store_name(url)}{how}"
        typer.echo(f"{what}: {e}{where}", err=True)
        raise typer.Exit(1) from None
    finally:
        st.close()


def store_name(url: str) -> str:
    """A store URL as a person may read it: its password hidden, a SQLite file's path made absolute."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        u = u.set(database=str(Path(u.database).resolve()))
    return u.render_as_string(hide_password=True)


def approve(candidate: int = typer.Argument(..., help="candidate id (shown when the loop waits)"),
            db: Optional[str] = DbOpt,
            who: str = typer.Option(os.environ.get("USER") or "cli", "--who", help="who approves (recorded)"),
            reject: bool = typer.Option(False, "--reject", help="reject instead of approving (give --reason)"),
            reason: Optional[str] = typer.Option(None, "--reason")) -> None:
    """Approve (or reject) a candidate the loop is waiting for. A running `tuneloop serve` on the same store picks
    it up within its poll interval; otherwise the next `tuneloop run` goes on from there."""
    from state.errors import Conflict, NotFound, Stale

    from state.reasons import reason_problem

    if (why := reason_problem(reason)) is not None and (reject or reason is not None):
        raise typer.BadParameter(why, param_hint="--reason")
    with steering_store(db, f"candidate {candidate}", (Conflict, NotFound, Stale, LookupError, ValueError)) as st:
        cand = st.check_waiting(candidate)  # refused unless its goal waits for this card
        (st.reject if reject else st.approve)(candidate, cand.card_hash, f"{who} (cli)", reason)
        st.wake(cand.goal_id, who)  # a serving worker claims it at its next poll
    typer.echo(f"candidate {candidate} {'rejected' if reject else 'approved'} by {who}")


def instruct(goal: str = typer.Argument(..., help="goal id"),
             kind: str = typer.Argument(..., help="pause | resume | stop | one_more_round"),
             count: Optional[int] = typer.Option(None, "--count", min=1, help="rounds (one_more_round; default 1)"),
             knob: list[str] = typer.Option([], "--knob", help="KNOB=VALUE for one_more_round, e.g. concurrency=90"),
             who: str = typer.Option(os.environ.get("USER") or "cli", "--who", help="who instructs (recorded)"),
             db: Optional[str] = DbOpt,
             ) -> None:
    """Give a goal an instruction ("one more round at C90": `one_more_round --knob concurrency=90`); a running
    `tuneloop serve` on the same store carries it out within its poll interval, or the next `tuneloop run`."""
    import yaml

    from state.errors import NotFound

    knobs = {}
    for kv in knob:
        name, sep, value = kv.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{kv!r}: expected KNOB=VALUE, e.g. concurrency=90", param_hint="--knob")
        knobs[name] = yaml.safe_load(value)
    with steering_store(db, f"goal {goal}", (NotFound, ValueError)) as st:
        ins = st.add_instruction(goal, kind, f"{who} (cli)", count=count, knobs=knobs or None, text=f"cli: {kind}")
        st.wake(goal, who)
    at = ", ".join(f"{k}={v}" for k, v in knobs.items())
    typer.echo(f"goal {goal}: {kind}{' at ' + at if at else ''} recorded (instruction {ins.id} by {who})")


budget_app = typer.Typer(help="A goal's budget: grant or refuse the extension the loop asks for.", no_args_is_help=True)


@budget_app.command("extend")
def budget_extend(goal: str = typer.Argument(..., help="goal id"),
                  card_hours: float = typer.Option(..., "--card-hours", min=0, help="card-hours to add"),
                  experiments: Optional[int] = typer.Option(None, "--experiments", min=0,
                                                            help="experiments to add (default: as many as the loop asked for)"),
                  reason: Optional[str] = typer.Option(None, "--reason"),
                  who: str = typer.Option(os.environ.get("USER") or "cli", "--who", help="who grants it (recorded)"),
                  db: Optional[str] = DbOpt,
                  ) -> None:
    """Grant the budget extension the loop asks for; the waiting loop (serve, or the next `tuneloop run`) goes on."""
    from state.errors import Conflict, NotFound

    with steering_store(db, f"goal {goal}", (Conflict, NotFound, ValueError)) as st:
        ext = st.answer_extension(goal, "grant", f"{who} (cli)", reason, card_hours=card_hours, experiments=experiments)
        st.wake(goal, who)
    typer.echo(f"goal {goal}: budget extended by {ext.card_hours:g} card-hours and {ext.experiments} experiment(s) "
               f"by {who} (extension {ext.id})")


@budget_app.command("refuse")
def budget_refuse(goal: str = typer.Argument(..., help="goal id"),
                  reason: str = typer.Option(..., "--reason", help="why (the goal stops with it)"),
                  who: str = typer.Option(os.environ.get("USER") or "cli", "--who", help="who refuses (recorded)"),
                  db: Optional[str] = DbOpt,
                  ) -> None:
    """Refuse the extension the loop asks for: the goal stops with the reason."""
    from state.errors import Conflict, NotFound

    with steering_store(db, f"goal {goal}", (Conflict, NotFound, ValueError)) as st:
        ext = st.answer_extension(goal, "refuse", f"{who} (cli)", reason)
        st.wake(goal, who)
    typer.echo(f"goal {goal}: budget extension refused by {who} (extension {ext.id})")
