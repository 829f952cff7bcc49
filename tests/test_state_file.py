"""STATE.md: rendered from the store, read back by the loop, rewritten atomically, never holding secrets."""
from __future__ import annotations

import threading
from pathlib import Path

from core.station import Station as ExecStation
from core.trial import TrialSpec
from state.goal import load_goal
from state.statefile import default_path, parse_state, read_state, redact, register_secrets, render_state, write_state
from state.store import Store


def _station(mpr: int) -> ExecStation:
    return ExecStation(engine="sim", knobs={"max_prefill_reqs": mpr, "concurrency": 128}, scenario="copy16k-zero-cache",
                       data_version="d1", source_identity="sim@1", target="sim")


def _setup(store: Store, make_result):
    g = store.create_goal(load_goal("examples/goal-16k.yaml"))
    base, best = store.put_station(_station(1)), store.put_station(_station(2))
    for rid, st, res in (("r0", base, make_result("r0", native=None, whole=180.0)),
                         ("r1", best, make_result("r1", native=236.8, whole=230.1))):
        store.create_run(TrialSpec(run_id=rid, goal_id=g.id, target="sim", scenario="copy16k-zero-cache", knobs={},
                                   n=640, stage="confirm"))
        store.set_run_status(rid, "running")
        store.set_run_status(rid, "done")
        store.record_result(res)
    store.record_decision(g.id, "baseline", run_id="r0", station_hash=base.hash)
    store.record_decision(g.id, "new_best", run_id="r1", station_hash=best.hash, changed=True)
    return g, base, best


def test_render_shows_what_a_person_needs(store: Store, make_result):
    g, base, best = _setup(store, make_result)
    store.create_run(TrialSpec(run_id="r2", goal_id=g.id, target="sim", scenario="copy16k-zero-cache", knobs={}, n=320))
    e = store.acquire_lease("sim", "exec", 60)
    store.record_phase("r2", "load", "intent", "started", epoch=e, target="sim")
    store.add_instruction(g.id, "one_more_round", "alice", count=1, knobs={"concurrency": 90})
    text = render_state(store, g.id)
    assert f"- best station: {best.hash}" in text and f"tuneloop restore {best.hash}" in text
    assert "native 236.80 / whole 230.10 tok/s/card at N=640" in text
    assert "run r2 candidate None screen N=320 [pending] phase load (intent, started)" in text
    assert "experiments 3 of 8 (5 left)" in text
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines()
            if ln.startswith(f"| {base.hash}") or ln.startswith(f"| {best.hash}")}
    assert rows[base.hash][4] == "180.00" and rows[base.hash][5] == ""  # no valid native window: empty cell
    assert rows[best.hash][5] == "236.80"
    view = parse_state(text)
    assert view.goal_id == g.id and view.status == "running"
    assert view.instruction["kind"] == "one_more_round" and view.instruction["remaining"] == 1
    assert view.instruction["knobs"] == {"concurrency": 90}
    assert view.authorisation == g.spec.authorisation


def test_no_instruction_and_no_best_yet(store: Store):
    g = store.create_goal(load_goal("examples/goal-128k.yaml"))
    view = parse_state(render_state(store, g.id))
    assert view.instruction is None and view.authorisation["rebuild"] == "deny"
    assert "- best station: none yet" in render_state(store, g.id)


def test_secrets_never_reach_the_file(store: Store):
    """Redacted by value (the configured secrets), never by a word pattern that can hit an id."""
    g = store.create_goal(load_goal("examples/goal-16k.yaml"), goal_id="j16k-ask-1234abcd")
    register_secrets("sk-live1234567890abcdef", "tok-abcdefghijklmnop")
    store.set_goal_status(g.id, "stopped", "ssh://ops:hunter2@10.0.0.5 refused; api_key=sk-live1234567890abcdef; "
                                           "task-12345678 disk-abcdefgh risk-00000000")
    store.add_instruction(g.id, "pause", "tok-abcdefghijklmnop")
    text = render_state(store, g.id)
    for secret in ("hunter2", "sk-live1234567890abcdef", "tok-abcdefghijklmnop"):
        assert secret not in text
    assert "[redacted]" in text and "refused" in text
    # ids that merely contain "ask", "task", "risk", "disk" or "token" keep their names
    assert "# tuneloop state: goal j16k-ask-1234abcd (" in text
    assert "task-12345678 disk-abcdefgh risk-00000000" in text
    assert redact("token: abc123456 and password=x") == "token: abc123456 and password=x"
    assert redact("Authorization: Bearer abcdefghijklmnopq") == "Authorization: Bearer [redacted]"


def test_one_state_file_per_goal_under_the_runs_root(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        a = store.create_goal(load_goal("examples/goal-16k.yaml"), goal_id="j16k-ask")
        b = store.create_goal(load_goal("examples/goal-128k.yaml"))
        pa, pb = write_state(store, a.id, runs_root=tmp_path / "runs"), write_state(store, b.id, runs_root=tmp_path / "runs")
        assert (pa, pb) == (tmp_path / "runs" / "j16k-ask" / "STATE.md", tmp_path / "runs" / b.id / "STATE.md")
        assert read_state(pa).goal_id == "j16k-ask" and read_state(pb).goal_id == b.id
        assert read_state(pb).authorisation["rebuild"] == "deny"
    finally:
        store.close()


def test_rewrite_is_atomic_under_a_concurrent_reader(tmp_path: Path, make_result):
    store = Store(f"sqlite:///{tmp_path / 'db' / 'state.db'}")
    g, _, _ = _setup(store, make_result)
    path = write_state(store, g.id, runs_root=tmp_path / "runs")
    assert path == default_path(store, g.id, tmp_path / "runs") == tmp_path / "runs" / g.id / "STATE.md"
    written = {path.read_text()}
    seen: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            seen.append(path.read_text())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(40):  # every rewrite changes the file (a second round while one is pending is refused, so
            # a pause and a round take turns, each replacing the other)
            if i % 2:
                store.add_instruction(g.id, "one_more_round", f"user{i}", count=i + 1)
            else:
                store.add_instruction(g.id, "pause", f"user{i}")
            write_state(store, g.id, path)
            written.add(path.read_text())
    finally:
        done.set()
        t.join()
    assert seen and all(s in written for s in seen), "a reader saw a partly written STATE.md"
    assert read_state(path).instruction["count"] == 40
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    store.close()
