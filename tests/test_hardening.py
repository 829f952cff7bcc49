"""Hardening, against a real `tuneloop serve` process: request fields never become server paths, bounded
bodies (refused before they are read, measured on the server's RSS), bounded ids and numbers, one permission
per action, idempotent goal creation, no token in any log, and a full disk as a permanent, named error."""
from __future__ import annotations

import json
import os
import select
import shutil
import socket
import sqlite3
import sys
import threading
from pathlib import Path

import httpx
import pytest
from ports_support import free_port
from test_api_support import (
    PROGRESS_S,
    TOKENS,
    ProcessOutput,
    ServerProcess,
    auth,
    service_env,
    small_goal,
    wait_until,
)

from api import permissions

ROOT = Path(__file__).resolve().parents[1]
MARKER = "MARKER-7f3a-do-not-echo"
BIG_IDS = [str(2**63), str(10**24)]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hard")
    data = tmp / "data"
    (data / "scenarios").mkdir(parents=True)
    (data / "profiles").mkdir()
    shutil.copy(ROOT / "core/scenarios/copy16k-zero-cache.yaml", data / "scenarios/mine-16k.yaml")
    secret = tmp / "svc-config.yaml"  # a server config file: a token and a marker no client may ever see
    secret.write_text(f"name: {MARKER}\ntoken: {TOKENS['admin']}\n")
    (data / "scenarios/evil.yaml").symlink_to(secret)  # a link out of the data directory
    (data / "profiles/evil.yaml").symlink_to(secret)
    (data / "scenarios/huge.yaml").write_text("# " + "x" * (1 << 21) + "\n")
    (tmp / "db").mkdir()
    db = tmp / "db" / "t.db"
    e = service_env(tmp, f"sqlite:///{db}", TUNELOOP_DATA_DIRS=str(data), TUNELOOP_WORKERS="1")
    srv = ServerProcess(tmp, e)
    yield {"tmp": tmp, "db": db, "secret": secret, "srv": srv, "url": srv.url}
    srv.stop()


def post_goal(url: str, goal: dict, role: str = "admin", **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/goals", json=goal, headers=auth(role) | headers, timeout=60)


def _all_files_text(tmp: Path, but: Path) -> str:
    """Every file the server (and its log reader) wrote under tmp: logs, store, STATE.md, runs, reports."""
    return "".join(p.read_text(errors="replace") for p in tmp.rglob("*")
                   if p.is_file() and not p.is_symlink() and p != but and p.stat().st_size < (1 << 20))


# -- 1. data files by name only ------------------------------------------------------------------------------
def test_goal_data_files_resolve_by_name_inside_the_data_directories_only(env):
    url, db, secret = env["url"], env["db"], env["secret"]
    before = [post_goal(url, small_goal(f"early-{i}", experiments=1)) for i in range(2)]
    assert [r.status_code for r in before] == [201, 201]
    ok = small_goal("own-data")
    ok["scenario"] = "mine-16k"  # a file of the configured data directory, by name
    assert post_goal(url, ok).status_code == 201
    bodies = []
    for field in ("scenario", "sim_profile"):
        for value in (str(db), str(db.relative_to(env["tmp"])), f"../db/{db.name}", str(secret), "/etc/passwd",
                      str(env["tmp"]), "evil", f"..{os.sep}..{os.sep}etc{os.sep}passwd", "huge", "mine-16k.yaml"):
            g = small_goal("bad-path")
            g[field] = value
            r = post_goal(url, g)
            bodies.append(r.text)
            assert r.status_code == 422, (field, value, r.text)
            assert ["body", field] in [e["loc"] for e in r.json()["detail"]], r.text
    assert all(MARKER not in b and TOKENS["admin"] not in b for b in bodies)
    # the store's own file was never opened: a second SQLite client finds every goal and leaves the WAL alone
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        names = {n for (n,) in c.execute("SELECT name FROM goals")}
    finally:
        c.close()
    assert {"early-0", "early-1", "own-data"} <= names
    assert Path(f"{db}-wal").exists() and Path(f"{db}-shm").exists()  # still the live server's
    assert post_goal(url, small_goal("after-probes", experiments=1)).status_code == 201  # new connections work
    goals = httpx.get(f"{url}/goals", headers=auth("viewer"), timeout=30).json()
    assert {"early-0", "early-1", "own-data", "after-probes"} <= {g["name"] for g in goals}
    report = "".join(httpx.get(f"{url}/goals/{g['id']}/state", headers=auth("viewer"), timeout=60).text for g in goals)
    assert MARKER not in report + env["srv"].text()


def test_a_scenario_of_the_users_traffic_is_named_like_any_other_and_reads_only_a_file_beside_it(env):
    """A goal names a replayed trace by name, as any scenario; the file its YAML names must lie beside it in the data
    directory: a link out of it or a path up is refused naming the field, never quoting what it points at."""
    url, data = env["url"], env["tmp"] / "data" / "scenarios"
    shutil.copy(ROOT / "examples/traffic/scenarios/mooncake-sample.jsonl", data / "trace.jsonl")
    (data / "trace.yaml").write_text("name: trace\nversion: 1\nsource: {file: trace.jsonl, format: mooncake}\n")
    (data / "leak.jsonl").symlink_to(env["secret"])
    (data / "leak.yaml").write_text("name: leak\nversion: 1\nsource: {file: leak.jsonl, format: mooncake}\n")
    (data / "up.yaml").write_text("name: up\nversion: 1\nsource: {file: ../../svc-config.yaml, format: mooncake}\n")
    g = small_goal("own-trace", experiments=1)
    g["scenario"] = "trace"
    g["constraints"].pop("output_len")  # each request's own, from the trace
    assert post_goal(url, g).status_code == 201
    for name in ("leak", "up"):
        g["scenario"] = name
        r = post_goal(url, g)
        assert r.status_code == 422 and ["body", "scenario"] in [e["loc"] for e in r.json()["detail"]], r.text
        assert "source.file" in r.text and MARKER not in r.text and TOKENS["admin"] not in r.text


# -- 2. bounded bodies, authentication first -----------------------------------------------------------------
def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _push(port: int, path: str, total: int, *, token: str | None, chunked: bool) -> tuple[int, int]:
    """Send a POST with a `total`-byte body as fast as the server takes it; (status, bytes the client got
    out before the server answered or closed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    head += ["Transfer-Encoding: chunked"] if chunked else [f"Content-Length: {total}"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    piece = b"[" + b"1," * ((1 << 20) // 2 - 1) + b"1"  # 1 MiB of (the start of) valid JSON
    sent, answer = 0, b""
    try:
        while sent < total:
            if select.select([s], [], [], 0)[0]:
                break  # the server answered: stop sending
            chunk = piece[: total - sent]
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            sent += len(chunk)
        select.select([s], [], [], 60)
        answer = s.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        try:
            answer = answer or s.recv(65536)
        except OSError:
            pass
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 "), f"no HTTP answer after {sent} bytes: {answer[:200]!r}"
    return int(answer.split()[1]), sent


def test_a_100_mb_body_is_refused_before_it_is_read_and_the_server_stays_small(env):
    srv = env["srv"]
    pid, port = srv.proc.pid, srv.port
    rss0 = _rss_kb(pid)
    mb100 = 100 * (1 << 20)
    codes = {
        "declared, no token": _push(port, "/goals", mb100, token=None, chunked=False),
        "chunked, no token": _push(port, "/goals", mb100, token=None, chunked=True),
        "chunked, bad token": _push(port, "/goals", mb100, token="x" * 20, chunked=True),
        "declared, admin": _push(port, "/goals", mb100, token=TOKENS["admin"], chunked=False),
        "chunked, admin": _push(port, "/goals", mb100, token=TOKENS["admin"], chunked=True),
        "chunked, viewer": _push(port, "/goals/g/chat", mb100, token=TOKENS["viewer"], chunked=True),
    }
    grew_mb = (_rss_kb(pid) - rss0) / 1024
    print(f"server RSS {rss0 / 1024:.1f} MB -> grew {grew_mb:.1f} MB; (status, client bytes out): {codes}")
    assert codes["declared, no token"][0] == 413 and codes["declared, admin"][0] == 413
    assert codes["chunked, no token"][0] == 401 and codes["chunked, bad token"][0] == 401
    assert codes["chunked, admin"][0] == 413 and codes["chunked, viewer"][0] == 413
    assert all(sent < 40 * (1 << 20) for _, sent in codes.values())  # nobody took the whole upload
    assert grew_mb < 20
    assert httpx.get(f"{srv.url}/health", timeout=30).status_code == 200
    r = httpx.post(f"{srv.url}/goals/x/chat", json={"text": "status " * 20}, headers=auth("viewer"), timeout=30)
    assert r.status_code == 404  # a small body still gets through


def _bomb(levels: int = 9) -> str:
    """The 1.7 KB YAML alias bomb: each level an anchor whose list repeats the level before nine times."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_deep_nesting_and_an_alias_bomb_are_4xx_naming_the_limit_in_a_bounded_reply(env):
    """A JSON body nested 959 deep, a YAML goal nested 476 deep in flow style and a 1.7 KB alias bomb in
    start_knobs.concurrency each get a 4xx naming the limit, in a reply of at most 64 KB; the same connection
    then answers the next request."""
    url = env["url"]
    goal_yaml = "\n".join(f"{k}: {json.dumps(v)}" for k, v in small_goal("bomb").items() if k != "start_knobs")
    bomb = _bomb()
    assert len(bomb.encode()) < 2048
    bodies = {
        "json 959": ("application/json", ("[" * 959 + "]" * 959).encode()),
        "json in a decision": ("application/json", b'{"card_hash": "' + b"0" * 16 + b'", "reason": '
                               + b"[" * 959 + b"]" * 959 + b"}"),
        "yaml flow 476": ("application/yaml", (goal_yaml + "\nstart_knobs: {concurrency: " + "[" * 476
                                                + "]" * 476 + "}\n").encode()),
        "yaml alias bomb": ("application/yaml", (bomb + goal_yaml + "\nstart_knobs: {concurrency: *a8}\n").encode()),
    }
    with httpx.Client(timeout=60) as c:  # one connection: a refusal must not reset it
        for what, (kind, body) in bodies.items():
            path = "/candidates/1/reject" if what == "json in a decision" else "/goals"
            r = c.post(f"{url}{path}", content=body, headers=auth("admin") | {"Content-Type": kind})
            assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:300])
            assert len(r.content) <= 64 * 1024, (what, len(r.content))
            assert "at most" in r.text and ("levels deep" in r.text or "aliases are expanded" in r.text), (what, r.text)
            assert c.get(f"{url}/health").status_code == 200, what
    # a report image name past the file system's 255 characters is a 404, not a 500
    r = httpx.get(f"{url}/goals/none/images/{'x' * 300}.png", headers=auth("viewer"), timeout=30)
    assert r.status_code == 404, r.text[:200]


def test_a_value_repeated_in_a_validation_error_is_an_excerpt(env):
    """A 600 KB string where a number belongs: the 422 names the field and repeats at most an excerpt."""
    goal = small_goal("long") | {"start_knobs": {"concurrency": "9" * (600 * 1024)}}
    r = post_goal(env["url"], goal)
    assert r.status_code == 422 and len(r.content) <= 64 * 1024, len(r.content)
    assert any(e["loc"][:3] == ["body", "start_knobs", "concurrency"] for e in r.json()["detail"]), r.text[:500]
    r = httpx.post(f"{env['url']}/goals/x/instructions", json={"kind": "pause", "text": "y" * (600 * 1024)},
                   headers=auth("approver"), timeout=30)
    assert r.status_code == 422 and len(r.content) <= 64 * 1024, len(r.content)


# -- 3. bounded ids and numbers ------------------------------------------------------------------------------
BODIES = {"/approve": {"card_hash": "0" * 16}, "/reject": {"card_hash": "0" * 16, "reason": "no"},
          "/instructions": {"kind": "pause"}, "/chat": {"text": "status"}, "/goals": small_goal("x")}


@pytest.mark.parametrize("big", BIG_IDS)
def test_ids_beyond_64_bits_on_every_id_route_and_in_chat_are_404_or_422(env, big):
    url = env["url"]
    seen = 0
    for (method, path), _ in sorted(permissions.ROUTES.items()):
        if "{" not in path:
            continue
        concrete = path.replace("{name}", f"{big}.png")
        for param in ("goal_id", "candidate_id", "run_id", "station_hash"):
            concrete = concrete.replace("{" + param + "}", big)
        body = next((b for suffix, b in BODIES.items() if path.endswith(suffix)), None)
        r = httpx.request(method, url + concrete, json=body, headers=auth("admin"), timeout=60)
        assert r.status_code in (404, 422), f"{method} {concrete} -> {r.status_code}: {r.text[:200]}"
        seen += 1
    assert seen >= 25
    gid = post_goal(url, small_goal(f"ids-{big[:4]}", experiments=1)).json()["id"]
    for text in (f"why was {big} rejected?", f"approve {big}", f"reject {big} because no", f"为什么拒绝了 {big}"):
        r = httpx.post(f"{url}/goals/{gid}/chat", json={"text": text}, headers=auth("admin"), timeout=60)
        assert r.status_code in (404, 422), f"{text!r} -> {r.status_code}: {r.text[:200]}"


NUMBERS = ["constraints.tpot_mean_ms_lt", "constraints.ttft_mean_ms_lt", "constraints.output_len",
           "constraints.cards", "constraints.min_cache_hit", "protocol.screen_n", "protocol.confirm_n",
           "protocol.warmup", "protocol.native_min_requests", "protocol.native_min_seconds", "budget.card_hours",
           "budget.experiments", "stop.max_without_improvement", "stop.min_gain_pct"]


def test_infinity_1e309_and_10e20_in_each_numeric_goal_field_are_422_naming_the_field(env):
    url = env["url"]
    for field in NUMBERS:
        for literal in ("Infinity", "1e309", "100000000000000000000"):
            g = small_goal("numbers")
            node = g
            *parents, leaf = field.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = "@NUM@"
            text = json.dumps(g).replace('"@NUM@"', literal)  # the literal as a JSON client writes it
            r = httpx.post(f"{url}/goals", content=text, timeout=60,
                           headers=auth("admin") | {"Content-Type": "application/json"})
            assert r.status_code == 422, (field, literal, r.text)
            errs = {".".join(map(str, e["loc"])): e["msg"] for e in r.json()["detail"]}
            assert f"body.{field}" in errs, (field, literal, errs)
            assert " in [" in errs[f"body.{field}"] or " in (" in errs[f"body.{field}"], errs  # names the range
    assert not [g for g in httpx.get(f"{url}/goals", headers=auth("viewer")).json() if g["name"] == "numbers"]


# -- 4. one permission per action: restore ---------------------------------------------------------------------
def test_restore_is_admins_on_every_path_and_only_for_a_station_of_that_goal(env):
    url = env["url"]
    a = post_goal(url, small_goal("restore-a", ask=False, experiments=1)).json()["id"]
    b = post_goal(url, small_goal("restore-b", experiments=1)).json()["id"]
    wait_until(lambda: httpx.get(f"{url}/goals/{a}", headers=auth("viewer")).json()["status"] == "done",
               PROGRESS_S, "goal a to finish")
    station = httpx.get(f"{url}/goals/{a}/best", headers=auth("viewer")).json()["hash"]
    for body in ({"kind": "restore", "restore": station}, {"kind": "restore"}):
        r = httpx.post(f"{url}/goals/{a}/instructions", json=body, headers=auth("approver"))
        assert r.status_code == 403 and "station.restore needs admin" in r.json()["detail"]
    r = httpx.post(f"{url}/goals/{a}/chat", json={"text": "go back to the best"}, headers=auth("approver"))
    assert r.status_code == 403
    assert httpx.post(f"{url}/stations/{station}/restore", headers=auth("approver")).status_code == 403
    r = httpx.post(f"{url}/goals/{b}/instructions", json={"kind": "restore", "restore": station}, headers=auth("admin"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "restore"]
    assert f"was not run by goal {b}" in r.json()["detail"][0]["msg"]
    assert not [i for i in httpx.get(f"{url}/goals/{b}/instructions", headers=auth("viewer")).json()
                if i["kind"] == "restore"]
    r = httpx.post(f"{url}/goals/{a}/instructions", json={"kind": "restore", "restore": station}, headers=auth("admin"))
    assert r.status_code == 201 and r.json()["who"] == "admin1 (api)"  # where it came from, recorded
    # pause stays an approver's action on both paths
    assert httpx.post(f"{url}/goals/{b}/instructions", json={"kind": "pause"}, headers=auth("approver")).status_code == 201


# -- 5. idempotent goal creation ---------------------------------------------------------------------------------
def test_parallel_posts_with_one_idempotency_key_make_one_goal_and_a_running_twin_gets_409(env):
    url = env["url"]
    goal = small_goal("idem", experiments=1)
    go = threading.Barrier(10)
    out: list[httpx.Response] = []

    def one() -> None:
        with httpx.Client(timeout=120) as c:
            go.wait()
            out.append(c.post(f"{url}/goals", json=goal, headers=auth("admin") | {"Idempotency-Key": "k-123"}))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in out] == [201] * 10, [r.text for r in out]
    assert len({r.json()["id"] for r in out}) == 1
    assert [g["name"] for g in httpx.get(f"{url}/goals", headers=auth("viewer")).json()].count("idem") == 1
    r = post_goal(url, goal, **{"Idempotency-Key": "k-456"})  # a new key, the same spec, still running
    assert r.status_code == 409 and out[0].json()["id"] in r.json()["detail"]
    assert post_goal(url, goal).status_code == 409
    for other in (small_goal("idem", experiments=2), small_goal("idem-renamed", experiments=1)):
        r = post_goal(url, other, **{"Idempotency-Key": "k-123"})  # another spec, another name: refused, not made
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"], r.text
    assert "idem-renamed" not in [g["name"] for g in httpx.get(f"{url}/goals", headers=auth("viewer")).json()]


# -- 6. no secret in any log -------------------------------------------------------------------------------------
def test_a_token_in_a_query_string_or_a_path_appears_in_no_log_file(env):
    url, tok = env["url"], TOKENS["admin"]
    for path in (f"/goals?token={tok}", f"/goals?access_token={tok}&x=1", f"/health?key={tok}", f"/goals/{tok}",
                 f"/candidates/1?auth={tok}"):
        r = httpx.get(url + path, timeout=30)
        assert r.status_code in (200, 401, 404)
    httpx.get(f"{url}/goals?token={tok}", headers=auth("viewer"), timeout=30)
    wait_until(lambda: "/goals?[redacted]" in env["srv"].text(), 30, "the access log lines")
    text = _all_files_text(env["tmp"], but=env["secret"])
    assert "serve.log" in {p.name for p in env["tmp"].iterdir()} and "GET /goals" in text
    assert all(t not in text for t in TOKENS.values())


# -- 7. a full disk ------------------------------------------------------------------------------------------------
def test_a_full_disk_stops_the_goal_with_a_named_permanent_error_and_leaves_nothing_half_written(tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a private tmpfs for this test")
    mnt = tmp_path / "small"
    mnt.mkdir()
    db = f"sqlite:///{tmp_path / 'db' / 't.db'}"
    port = free_port()
    e = service_env(tmp_path, db, TUNELOOP_RUNS_ROOT=str(mnt / "runs"))
    script = (f"mount -t tmpfs -o size=256k tmpfs {mnt} && mkdir {mnt}/runs && "
              f"(dd if=/dev/zero of={mnt}/.filler bs=4k 2>/dev/null; true) && "
              f"exec {sys.executable} -m tuneloop_cli serve --port {port}")
    proc = ProcessOutput(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], tmp_path, e,
                         tmp_path / "serve.log")
    try:
        proc.wait_for(r"Uvicorn running on")
        url = f"http://127.0.0.1:{port}"
        gid = post_goal(url, small_goal("full-disk", ask=False, experiments=2)).json()["id"]
        g = wait_until(lambda: (x := httpx.get(f"{url}/goals/{gid}", headers=auth("viewer")).json())["status"]
                       in ("stopped", "failed", "done") and x, PROGRESS_S, "the goal to stop")
        assert g["status"] in ("stopped", "failed"), g
        assert "StorageFull (ENOSPC): No space left on device writing" in g["status_reason"], g["status_reason"]
        wait_until(lambda: httpx.get(f"{url}/goals/{gid}", headers=auth("viewer")).json()["worker_state"] == "idle",
                   PROGRESS_S, "the worker to give the goal back (no retry)")
        runs = httpx.get(f"{url}/goals/{gid}/experiments", headers=auth("viewer")).json()
        assert len(runs) == 1 and "StorageFull (ENOSPC)" in runs[0]["status_reason"]  # one try, never repeated
        seen = Path(f"/proc/{proc.proc.pid}/root") / str(mnt).lstrip("/")  # the server's own view of its tmpfs
        assert (seen / ".filler").is_file() and (seen / "runs").is_dir()  # really the full tmpfs
        # the run's folder, and the goal's own folder for its STATE.md (one per goal, under the runs root); in the first:
        assert {p.name for p in (seen / "runs").iterdir()} <= {runs[0]["id"], gid}
        assert runs[0]["id"] in {p.name for p in (seen / "runs").iterdir()}
        assert not (seen / "runs" / runs[0]["id"] / "spec.json").exists()  # the spec it could not write
        files = [p for p in seen.rglob("*") if p.is_file() and p.name != ".filler"]
        assert not [p for p in files if p.name.endswith(".tmp")], files  # no temporary file left behind
        for p in files:  # whatever is there is whole
            if p.suffix == ".json":
                json.loads(p.read_text())
    finally:
        proc.stop()


def test_a_refused_field_is_the_errors_loc_and_no_message_is_split_into_one():
    """A FieldError's field is the 422's `loc` as data (its reason may hold ': ' of its own); any other ValueError is
    the body's, its words whole: nothing reads a field back out of a message."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from api.app import _errors
    from core.errors import FieldError
    from core.knobs import KnobError, KnobErrorKind

    app = FastAPI()
    _errors(app)

    @app.post("/field")
    def field() -> None:
        raise FieldError("budget.card_hours", "must be a number: got 'lots'")

    @app.post("/knob")
    def knob() -> None:
        raise KnobError("max_num_seqs", "must be >= 1", KnobErrorKind.VALUE)

    @app.post("/plain")
    def plain() -> None:
        raise ValueError("target: words that only look like a field")

    with TestClient(app) as c:
        got = [c.post(f"/{p}").json()["detail"] for p in ("field", "knob", "plain")]
    assert got[0] == [{"loc": ["body", "budget", "card_hours"], "msg": "must be a number: got 'lots'",
                       "type": "value_error"}]
    assert got[1][0]["loc"] == ["body", "max_num_seqs"] and got[1][0]["msg"] == "must be >= 1"
    assert got[2] == [{"loc": ["body"], "msg": "target: words that only look like a field", "type": "value_error"}]
