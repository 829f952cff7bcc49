"""`tuneloop serve` as supervised processes (issue 18): the API process SIGKILLed while a goal runs leaves the worker
process running it to the end and the restarted API shows the result; a goal run while readers hammer the API makes
the decisions it makes without them; the read cache never hides a client's own write."""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
from test_api_support import ServerProcess, auth, service_env, small_goal, wait_until


def children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`: {pid: command line}."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out[int(p.name)] = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    return out


def health(url: str) -> dict | None:
    try:
        r = httpx.get(url + "/health", timeout=10)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def get(url: str, path: str) -> object:
    return httpx.get(url + path, headers=auth("viewer"), timeout=30).json()


def decisions(url: str, gid: str) -> list[tuple]:
    """The decision log without what differs between two stores anyway (ids, timestamps)."""
    return [(d["kind"], d["changed"], d["station_hash"], d["text"].replace(gid, "G"))
            for d in get(url, f"/goals/{gid}/decisions")]


def finished(url: str, gid: str) -> bool:
    """The loop reached its end for now: done, stopped, or waiting for a person (here: its experiments used up)."""
    g = get(url, f"/goals/{gid}")
    return g["status"] in ("done", "stopped", "waiting") and g["worker_state"] == "idle"


def test_sigkill_of_the_api_process_leaves_the_goal_running_and_the_restarted_api_shows_it(tmp_path):
    srv = ServerProcess(tmp_path, service_env(tmp_path, f"sqlite:///{tmp_path / 't.db'}"))
    try:
        kids = children(srv.proc.pid)
        workers = [p for p, cmd in kids.items() if " worker" in cmd]
        api_pid = health(srv.url)["pid"]
        assert len(workers) == 1 and api_pid in kids and api_pid != srv.proc.pid  # two processes under serve
        gid = httpx.post(f"{srv.url}/goals", json=small_goal("killed-api", ask=False, experiments=4),
                         headers=auth("admin")).json()["id"]
        wait_until(lambda: get(srv.url, f"/goals/{gid}/experiments"), what="the first experiment")
        os.kill(api_pid, signal.SIGKILL)
        srv.wait_for(r"api process \d+ ended \(signal 9\)")
        back = wait_until(lambda: (h := health(srv.url)) and h["pid"] != api_pid and h, what="the restarted API")
        assert back["pid"] in children(srv.proc.pid)
        wait_until(lambda: finished(srv.url, gid), what="the goal to finish")
        assert workers[0] in children(srv.proc.pid)  # the same worker process ran it throughout
        assert "worker process" not in "".join(x for x in srv.lines if " ended (" in x)  # never restarted
        exps = get(srv.url, f"/goals/{gid}/experiments")
        assert len(exps) == 4 and all(e["verdict"] == "valid" for e in exps)  # its whole budget
        for e in exps:  # each experiment ran its load once: nothing was repeated for the API's death
            phases = get(srv.url, f"/experiments/{e['id']}/phases")
            assert sum(1 for p in phases if p["phase"] == "load" and p["event"] == "intent") == 1
        assert get(srv.url, f"/goals/{gid}/decisions")[-1]["kind"] in ("stop", "ask")
    finally:
        srv.stop()
    assert not children(srv.proc.pid)  # a stopped serve leaves no process behind


def run_goal(tmp: Path, readers: int) -> list[tuple]:
    tmp.mkdir()
    srv = ServerProcess(tmp, service_env(tmp, f"sqlite:///{tmp / 't.db'}"))
    stop = threading.Event()
    served = [0]
    failed: list[str] = []
    try:
        gid = httpx.post(f"{srv.url}/goals", json=small_goal("same-under-load", ask=False, experiments=4),
                         headers=auth("admin")).json()["id"]
        paths = ["/goals", f"/goals/{gid}", f"/goals/{gid}/candidates", f"/goals/{gid}/decisions",
                 f"/goals/{gid}/experiments", "/health", "/metrics"]

        def reader(i: int) -> None:
            # a thread's exception reaches pytest only as a warning: every answer that is not a 200, and anything the
            # reader raised, is kept here and asserted in the test's own thread
            try:
                with httpx.Client(headers=auth("viewer"), timeout=60) as c:
                    while not stop.is_set():
                        path = paths[(i + served[0]) % len(paths)]
                        r = c.get(srv.url + path)
                        if r.status_code != 200:
                            failed.append(f"GET {path} -> {r.status_code}: {r.text[:200]}")
                        served[0] += 1
            except Exception as e:
                failed.append(f"reader {i}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
        for t in threads:
            t.start()
        wait_until(lambda: finished(srv.url, gid), what="the goal to finish")
        stop.set()
        for t in threads:
            t.join(60)
        assert not [t for t in threads if t.is_alive()], "a reader never returned"
        assert not failed, failed[:10]
        assert readers == 0 or served[0] > 0
        # the worker process commits the stop; this API process's read cache may answer the decision log with what it
        # computed up to read_cache_s (1 s) before (api/readcache.py): read it once that answer has caught up with the
        # finished goal, i.e. once it ends in the loop's last decision
        return wait_until(lambda: (d := decisions(srv.url, gid)) and d[-1][0] in ("stop", "ask") and d,
                          what="the decision log to end in the loop's last decision")
    finally:
        stop.set()
        srv.stop()


def test_a_goal_under_read_load_makes_the_same_decisions_as_without_it(tmp_path):
    quiet = run_goal(tmp_path / "quiet", readers=0)
    loaded = run_goal(tmp_path / "loaded", readers=8)
    assert len(quiet) >= 5 and quiet[-1][0] in ("stop", "ask")
    assert loaded == quiet


def test_a_write_is_read_back_at_once_through_the_cache_and_an_idle_keep_alive_connection_stays_open(tmp_path):
    srv = ServerProcess(tmp_path, service_env(tmp_path, f"sqlite:///{tmp_path / 't.db'}", TUNELOOP_WORKERS="0",
                                              TUNELOOP_READ_CACHE_S="30"))
    try:
        with httpx.Client(headers=auth("admin"), timeout=30) as c:
            for i in range(3):
                before = c.get(srv.url + "/goals").json()  # cached for up to 30 s ...
                assert c.get(srv.url + "/goals").json() == before
                gid = c.post(srv.url + "/goals", json=small_goal(f"cached-{i}")).json()["id"]
                assert [g["id"] for g in c.get(srv.url + "/goals").json()] == [g["id"] for g in before] + [gid]
                ins = c.post(f"{srv.url}/goals/{gid}/pause").json()
                assert [x["id"] for x in c.get(f"{srv.url}/goals/{gid}/instructions").json()] == [ins["id"]]
        # a keep-alive connection left idle past uvicorn's default 5 s (= httpx's own keep-alive expiry: the race
        # behind the resets under load) is still served on reuse
        req = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
            sock.sendall(req)
            assert _response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(6)  # idle, as a client's pooled connection between polls (not a timing assertion)
            sock.sendall(req)
            assert _response(sock).startswith(b"HTTP/1.1 200")
    finally:
        srv.stop()


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response (headers, then Content-Length bytes of body): a single recv may return the
    headers alone, and the body would then be read as the next response."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body
