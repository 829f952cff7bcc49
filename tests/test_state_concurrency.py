"""Concurrency with real processes, on SQLite and PostgreSQL: the approval race has one winner,
two holders never hold one target, and a replaced holder's writes are refused."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from state.errors import StaleEpoch
from state.goal import load_goal
from state.store import Store

# Children fork from a clean server that has the modules imported but holds no connection:
# nothing is shared but the database.
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["state.store", "state.goal"])


def _race(s, barrier, out, act) -> None:
    """Wait for the others, act once, report ok / conflict / error on the queue, close the store."""
    from state.errors import Conflict

    barrier.wait()
    try:
        out.put(("ok", act()))
    except Conflict as e:
        out.put(("conflict", str(e)))
    except Exception as e:  # anything else fails the test
        out.put(("error", repr(e)))
    finally:
        s.close()


def _approve(url: str, cid: int, h: str, who: str, barrier, out) -> None:
    from state.store import Store

    s = Store(url)
    _race(s, barrier, out, lambda: (s.approve(cid, h, who), who)[1])


def _acquire_once(url: str, holder: str, barrier, out) -> None:
    from state.store import Store

    barrier.wait()  # open together: on a fresh database the migrations race too
    s = Store(url)
    out.put((holder, s.acquire_lease("target-x", holder, 3600)))
    s.close()


def _worker(url: str, holder: str, rounds: int, log: str, barrier) -> None:
    """Take the lease, log enter/exit on the 'target', give it back; repeat."""
    from state.store import Store

    s = Store(url)
    barrier.wait()
    done = 0
    while done < rounds:
        epoch = s.acquire_lease("shared", holder, 3600)
        if epoch is None:
            time.sleep(0.002)  # back off, then ask again (not used as synchronisation)
            continue
        with open(log, "a") as f:
            f.write(f"enter {holder} {epoch}\n")
            f.flush()
        s.record_phase(f"{holder}-{done}", "load", "intent", "started", epoch=epoch, target="shared")
        with open(log, "a") as f:
            f.write(f"exit {holder} {epoch}\n")
            f.flush()
        s.release_lease("shared", holder, epoch)
        done += 1
    s.close()


def _join(procs) -> None:
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"{p.name} exited {p.exitcode}"


def test_two_concurrent_approvals_one_wins(store_url: str):
    s = Store(store_url)
    g = s.create_goal(load_goal("examples/goal-16k.yaml"))
    c = s.add_candidate(g.id, {"knob": "max_prefill_reqs", "value": 2}, status="awaiting_approval")
    n = 4
    barrier, out = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_approve, args=(store_url, c.id, c.card_hash, f"u{i}", barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    _join(procs)
    assert sorted(k for k, _ in got) == ["conflict"] * (n - 1) + ["ok"], got
    winner = next(w for k, w in got if k == "ok")
    assert s.approval(c.id).who == winner and s.get_candidate(c.id).status == "approved"
    s.close()


def test_concurrent_acquire_has_exactly_one_holder(store_url: str):
    Store(store_url).close()  # schema first, so the race is about the lease only
    n = 4
    barrier, out = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_acquire_once, args=(store_url, f"h{i}", barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    _join(procs)
    winners = [(h, e) for h, e in got if e is not None]
    assert len(winners) == 1 and winners[0][1] == 1, got


def test_holders_never_overlap_and_epochs_grow(store_url: str, tmp_path: Path):
    Store(store_url).close()
    log = str(tmp_path / "target.log")
    holders, rounds = 3, 6
    barrier = CTX.Barrier(holders)
    procs = [CTX.Process(target=_worker, args=(store_url, f"w{i}", rounds, log, barrier)) for i in range(holders)]
    for p in procs:
        p.start()
    _join(procs)
    lines = [ln.split() for ln in Path(log).read_text().splitlines()]
    assert len(lines) == 2 * holders * rounds
    epochs = []
    for enter, leave in zip(lines[::2], lines[1::2]):  # strictly alternating: nobody entered while another held
        assert enter[0] == "enter" and leave[0] == "exit" and enter[1:] == leave[1:], (enter, leave)
        epochs.append(int(enter[2]))
    assert epochs == sorted(set(epochs)), "epochs must strictly grow"


def test_replaced_holder_is_refused(store_url: str):
    a = Store(store_url)
    b = Store(store_url)  # a second process's view of the same database
    try:
        ea = a.acquire_lease("t", "a", 0.0)  # a's lease expires at once (a paused past its lease)
        eb = b.acquire_lease("t", "b", 3600)
        assert eb == ea + 1
        with pytest.raises(StaleEpoch):
            a.record_phase("run-a", "load", "intent", "started", epoch=ea, target="t")
        assert not a.renew_lease("t", "a", ea, 3600)
        assert a.acquire_lease("t", "a", 3600) is None
        b.record_phase("run-b", "load", "intent", "started", epoch=eb, target="t")
        assert a.phases("run-a") == [] and len(a.phases("run-b")) == 1
    finally:
        a.close()
        b.close()


def test_processes_open_a_fresh_database_together(tmp_path: Path):
    """Several processes running the migrations on one new SQLite file at once all succeed."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    n = 4
    barrier, out = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_acquire_once, args=(url, f"h{i}", barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    _join(procs)
    assert sum(e is not None for _, e in got) == 1
    assert os.path.exists(tmp_path / "fresh.db")


def _create(url: str, key: str | None, barrier, out) -> None:
    from api.idempotency import create_goal
    from state.goal import load_goal
    from state.store import Store

    s = Store(url)
    spec = load_goal("examples/goal-16k.yaml")
    _race(s, barrier, out, lambda: create_goal(s, spec, "admin1", key).id)


@pytest.mark.parametrize("key", ["k-1", None])
def test_parallel_identical_goals_make_one_goal_with_or_without_an_idempotency_key(store_url, key):
    Store(store_url).close()  # migrate once, before the race
    n = 8
    barrier, out = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_create, args=(store_url, key, barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    got = [out.get(timeout=10) for _ in procs]
    assert not [g for g in got if g[0] == "error"], got
    s = Store(store_url)
    try:
        goals = s.goals()
    finally:
        s.close()
    assert len(goals) == 1
    if key is None:  # one is created, every twin is told which goal already runs
        assert sorted(k for k, _ in got) == ["conflict"] * (n - 1) + ["ok"]
        assert all(goals[0].id in v for k, v in got if k == "conflict")
    else:  # every request gets the same goal
        assert {v for _, v in got} == {goals[0].id}
