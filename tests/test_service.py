"""The service as real processes: `tuneloop serve` killed while it waits for an approval, concurrent
approvals of one card, secrets kept out of logs / responses / STATE.md, and `tuneloop worker`
processes sharing one PostgreSQL across two targets."""
from __future__ import annotations

import threading

import httpx
import pytest
from test_api_support import TOKENS, ServerProcess, auth, service_env, small_goal, wait_until, worker_process

from state.workqueue import QueueStore


def awaiting(url: str, gid: str) -> list[dict]:
    return httpx.get(f"{url}/goals/{gid}/candidates?awaiting=true", headers=auth("viewer"), timeout=10).json()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_double_approval_race_gives_one_200_and_one_409(tmp_path, request, backend):
    db = f"sqlite:///{tmp_path / 't.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    srv = ServerProcess(tmp_path, service_env(tmp_path, db))
    try:
        gid = httpx.post(f"{srv.url}/goals", json=small_goal(), headers=auth("admin")).json()["id"]
        card = wait_until(lambda: awaiting(srv.url, gid), what="a card awaiting approval")[0]
        go = threading.Barrier(2)
        codes: list[int] = []

        def approve(role: str) -> None:
            with httpx.Client(timeout=30) as c:
                go.wait()
                codes.append(c.post(f"{srv.url}/candidates/{card['id']}/approve", headers=auth(role),
                                    json={"card_hash": card["card_hash"]}).status_code)

        threads = [threading.Thread(target=approve, args=(r,)) for r in ("approver", "admin")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [200, 409]
        ap = httpx.get(f"{srv.url}/candidates/{card['id']}/approval", headers=auth("viewer")).json()
        assert ap["decision"] == "approve" and ap["card_hash"] == card["card_hash"]
    finally:
        srv.stop()


def test_killed_while_waiting_restart_approve_runs_the_card_once_and_no_secret_leaks(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    env = service_env(tmp_path, db)
    srv = ServerProcess(tmp_path, env)
    bodies: list[str] = []
    gid = httpx.post(f"{srv.url}/goals", json=small_goal(experiments=2), headers=auth("admin")).json()["id"]
    card = wait_until(lambda: awaiting(srv.url, gid), what="a card awaiting approval")[0]
    srv.kill()  # SIGKILL while the loop waits for a person
    srv = ServerProcess(tmp_path, env, "serve2.log")
    try:
        assert [c["id"] for c in awaiting(srv.url, gid)] == [card["id"]]  # the restarted service still waits on it
        # the worker runs in a process of its own: /health of the API process counts it through the store (the
        # killed service's worker ages out after a claim's TTL: one worker alive)
        health = wait_until(lambda: (h := httpx.get(f"{srv.url}/health").json())["workers"] == 1 and h,
                            what="the one live worker process to show in /health")
        assert health["workers_in_this_process"] == 0 and len(health["worker_names"]) == 1, health
        r = httpx.post(f"{srv.url}/candidates/{card['id']}/approve", headers=auth("approver"),
                       json={"card_hash": card["card_hash"]})
        assert r.status_code == 200
        bodies.append(r.text)

        def next_stop() -> bool:
            g = httpx.get(f"{srv.url}/goals/{gid}", headers=auth("viewer")).json()
            pend = awaiting(srv.url, gid)
            return g["status"] in ("done", "stopped") or any(c["id"] != card["id"] for c in pend)

        wait_until(next_stop, what="the loop to run the approved card and reach its next stop")
        exps = httpx.get(f"{srv.url}/goals/{gid}/experiments", headers=auth("viewer")).json()
        bodies.append(str(exps))
        mine = [e for e in exps if e["candidate_id"] == card["id"]]
        assert len(mine) == 1 and mine[0]["verdict"] == "valid"
        phases = httpx.get(f"{srv.url}/experiments/{mine[0]['id']}/phases", headers=auth("viewer")).json()
        assert sum(1 for p in phases if p["phase"] == "load" and p["event"] == "intent") == 1
        for path in ("/health", f"/goals/{gid}", f"/goals/{gid}/decisions", f"/goals/{gid}/state", f"/goals/{gid}/report"):
            bodies.append(httpx.get(srv.url + path, headers=auth("admin")).text)
        bodies.append(httpx.post(f"{srv.url}/goals/{gid}/chat", json={"text": "status"}, headers=auth("admin")).text)
    finally:
        srv.stop()
    texts = bodies + [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()
                      and (p.suffix in (".log", ".md", ".json", ".jsonl") or p.name == "STATE.md")]
    assert any("STATE" in str(p) for p in tmp_path.rglob("STATE*.md"))
    for secret in TOKENS.values():
        assert not any(secret in t for t in texts), "a token leaked into a log, a response or the state file"


def test_four_workers_first_sessions_on_a_fresh_database_all_get_their_checkpointer(pg_url):
    """What four workers' first loop sessions do at once on a fresh PostgreSQL: open the checkpointer (its
    setup migrates the tables). All finish: no duplicate-type race, no lock-wait deadlock (a statement blocked
    on an advisory lock is an old snapshot that CREATE INDEX CONCURRENTLY waits for: it hung worker starts)."""
    import psycopg

    from agent.loop.graph import checkpointer

    go = threading.Barrier(4)
    done: list[str] = []
    errors: list[BaseException] = []

    def setup(i: int) -> None:
        go.wait()
        try:
            with checkpointer(pg_url) as saver:
                assert saver.get_tuple({"configurable": {"thread_id": f"none-{i}"}}) is None
            done.append(f"setup {i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=setup, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)  # a bound on a hang, not an expectation
    assert not errors and len(done) == 4, f"finished {done}, errors {errors}"
    url = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        names = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
    assert "checkpoints_thread_id_idx" in names


TARGETS = "targets:\n  - {name: sim-a, kind: sim}\n  - {name: sim-b, kind: sim}\n"


def _intervals(store: QueueStore, gid: str) -> list[tuple[object, object, str]]:
    out = []
    for r in store.runs(gid):
        ph = store.phases(r.id)
        start = next(p.at for p in ph if p.phase == "lock" and p.event == "outcome")
        end = [p.at for p in ph if p.phase == "release" and p.event == "outcome"][-1]
        out.append((start, end, r.target))
    return out


def activity(pg_url: str) -> str:
    import psycopg

    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://").split("?")[0]) as conn:
        rows = conn.execute("SELECT pid, state, wait_event_type, wait_event, now() - xact_start, left(query, 120) "
                            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                            "AND state <> 'idle' ORDER BY xact_start").fetchall()
    return "\n".join(" | ".join(str(x) for x in r) for r in rows) or "(nothing active)"


def test_two_workers_two_goals_two_targets_one_postgresql_third_worker_waits(tmp_path, pg_url):
    (tmp_path / "targets.yaml").write_text(TARGETS)
    env = service_env(tmp_path, pg_url, TUNELOOP_TARGETS=str(tmp_path / "targets.yaml"))
    st = QueueStore(pg_url)
    from state.goal import parse_goal

    goals = {name: st.create_goal(parse_goal(small_goal(name, target=t, ask=False, experiments=3)))
             for name, t in (("goal-a", "sim-a"), ("goal-b", "sim-b"), ("goal-c", "sim-a"))}
    procs = []
    try:
        for name, target in (("w1", "sim-a"), ("w2", "sim-b"), ("w3", "sim-a")):
            procs.append(worker_process(tmp_path, env, name, target))
        for p in procs:  # each says so once its threads claim: an event from the process, bounded generously
            try:
                p.wait_for(r"claiming goals")
            except AssertionError as e:  # say what the database was doing (a lock held elsewhere, a stuck DDL)
                raise AssertionError(f"{e}\n-- pg_stat_activity:\n{activity(pg_url)}") from None
        for g in goals.values():
            st.wake(g.id, "test")
        def ended(g) -> bool:  # done, or asking a person for the budget its promising screen's confirm needs
            x = st.get_goal(g.id)
            return x.status == "done" or x.status == "waiting" and x.status_reason.startswith("waiting for a budget")

        wait_until(lambda: all(ended(g) for g in goals.values())
                   and all(w.state == "idle" for w in st.work_items()), what="all three goals to finish")
        iv = {name: _intervals(st, g.id) for name, g in goals.items()}
        assert all(len(v) == 3 for v in iv.values())
        # no overlap on any target: lease intervals of one target are disjoint
        for target in ("sim-a", "sim-b"):
            spans = sorted((s, e) for v in iv.values() for s, e, t in v if t == target)
            assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), f"overlap on {target}"
        # goals A and B progressed at the same time on their two targets
        span = {n: (min(s for s, _, _ in v), max(e for _, e, _ in v)) for n, v in iv.items()}
        assert span["goal-a"][0] < span["goal-b"][1] and span["goal-b"][0] < span["goal-a"][1]
        # the third worker, pointed at busy sim-a, waited: the two sim-a goals ran one after the other
        a, c = span["goal-a"], span["goal-c"]
        assert a[1] <= c[0] or c[1] <= a[0]
        workers = {r.spec.get("target"): None for g in goals.values() for r in st.runs(g.id)}
        assert set(workers) == {"sim-a", "sim-b"}
    finally:
        for p in procs:
            p.proc.terminate()
        for p in procs:
            p.stop()
        st.close()
