"""What a new user meets first (issue 56 item 7), each as they met it: a start knob outside the goal's search space is
refused naming the field; an unknown profile's error lists every known name whole; a knob typo is answered "did you
mean"; chat `aprove 5` is offered `approve 5` and nothing is done; no `--help` line shows a `<bool>` for a flag; the
dashboard's font stacks carry CJK fallbacks and /favicon.ico is an icon; `tuneloop instruct` without `--db` names
the store it searched."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import pytest
import yaml
from fastapi.testclient import TestClient
from test_api import settings
from test_api_support import auth, small_goal
from typer.main import get_command
from typer.testing import CliRunner

from api.app import create_app
from api.chat import ACTING, parse
from core import datafiles
from state.errors import GoalError
from state.goal import parse_goal

TUNELOOP = Path(sys.executable).with_name("tuneloop")
ROOT = Path(__file__).resolve().parents[1]


def _goal() -> dict:
    return yaml.safe_load((ROOT / "examples" / "goal-16k.yaml").read_text())


def _refusal(g: dict) -> dict[str, str]:
    with pytest.raises(GoalError) as e:
        parse_goal(g)
    return dict(e.value.errors)


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with TestClient(create_app(settings(tmp_path, TUNELOOP_WORKERS="0"))) as c:
        yield c


def test_a_start_knob_outside_the_search_space_is_refused_naming_the_field(client):
    g = small_goal("outside")
    space = g["search_space"]["concurrency"]
    off = next(v for v in range(1, 1000) if v not in space)
    g["start_knobs"]["concurrency"] = off
    errors = _refusal(g)
    assert set(errors) == {"start_knobs.concurrency"}, errors
    assert errors["start_knobs.concurrency"].startswith(f"{off} is not one of the search space's values for "
                                                        "concurrency")
    r = client.post("/goals", json=g, headers=auth("admin"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "start_knobs", "concurrency"], r.text
    g["start_knobs"]["concurrency"] = space[-1]  # inside it: taken
    assert client.post("/goals", json=g, headers=auth("admin")).status_code == 201


def test_an_unknown_profiles_error_lists_every_known_name_whole(client):
    g = small_goal("typo-profile")
    g["sim_profile"] = "llama70b-h100-p2d3"
    reason = _refusal(g)["sim_profile"]
    known = datafiles.builtin_names("profiles")
    assert len(", ".join(map(repr, known))) > 400  # longer than the excerpt a message is otherwise cut to
    assert all(repr(name) in reason for name in known) and "…" not in reason, reason
    r = client.post("/goals", json=g, headers=auth("admin"))
    (err,) = r.json()["detail"]
    assert r.status_code == 422 and err["loc"] == ["body", "sim_profile"] and err["msg"] == reason, r.text


def test_a_knob_typo_is_answered_did_you_mean():
    g = _goal()
    g["start_knobs"]["max_num_seq"] = 64
    assert "did you mean 'max_num_seqs'?" in _refusal(g)["start_knobs.max_num_seq"]
    g = _goal()
    g["start_knobs"]["warp_drive"] = 1  # nothing near it: no guess
    assert "did you mean" not in _refusal(g)["start_knobs.warp_drive"]


@pytest.mark.parametrize("said,meant", [("aprove 5", "approve 5"), ("Aprove 5", "approve 5"), ("pasue", "pause"),
                                        ("resme", "resume")])
def test_a_misspelt_command_word_is_offered_the_command_and_does_nothing(said, meant):
    got = parse(said)
    assert got.kind == "refused" and got.kind not in ACTING and got.suggest == meant, got
    assert "did you mean" in got.reason and f"send exactly '{meant}'" in got.reason
    assert parse(got.suggest).kind in ACTING  # the offer is itself exactly a command


def test_a_misspelt_word_with_a_negation_or_a_question_is_offered_no_more_than_before():
    assert parse("dont aprove 5").suggest is None  # a negation: nothing the person may have meant the opposite of
    assert parse("aprove 5?").suggest == "approve 5" and "question" in parse("aprove 5?").reason
    assert parse("step").kind == "unknown" and parse("shop").kind == "unknown"  # no command word is near enough


def _helps(cmd: click.Command, path: tuple[str, ...] = ()) -> dict[str, click.Command]:
    out = {" ".join(path) or "tuneloop": cmd}
    for name, sub in getattr(cmd, "commands", {}).items():
        out |= _helps(sub, path + (name,))
    return out


def test_no_help_line_shows_a_bool_metavar_for_a_flag():
    from tuneloop_cli import build_app

    app = build_app()
    runner = CliRunner()
    helps = _helps(get_command(app))
    assert {"run", "restore", "sim run", "load run", "instruct", "exec run"} <= set(helps)
    flags = 0
    for path in helps:
        res = runner.invoke(app, [*path.split()[path == "tuneloop":], "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, (path, res.output)
        flags += len(re.findall(r"--no-[a-z-]+|--json|--auto-approve|--frontier", res.output))
    assert flags > 5
    run = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "<path>" in run and "--db" in run  # an option that takes a value still shows its type


def test_the_dashboard_has_cjk_font_fallbacks_and_a_favicon(client):
    page = client.get("/").text
    css = page[page.index("<style>"):page.index("</style>")]
    stacks = re.findall(r"font(?:-family)?\s*:\s*([^;{}]+);", css)
    families = [s for s in stacks if "inherit" not in s]
    assert len(families) >= 2 and all(re.search(r"CJK|YaHei|PingFang", s) for s in families), stacks
    assert re.search(r"input, button, select \{ font: inherit; \}", css)  # the chat box takes the page's stack
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert ET.fromstring(r.content).tag == "{http://www.w3.org/2000/svg}svg"


def test_instruct_without_db_names_the_store_it_searched(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    proc = subprocess.run([str(TUNELOOP), "instruct", "no-such-goal", "pause"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    store = tmp_path.resolve() / ".tuneloop" / "tuneloop.db"
    assert f"in the store sqlite:///{store}" in proc.stderr and "--db or $TUNELOOP_DB" in proc.stderr, proc.stderr
    other = f"sqlite:///{tmp_path / 'o.db'}"
    named = subprocess.run([str(TUNELOOP), "instruct", "no-such-goal", "pause", "--db", other],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert named.returncode == 1 and "o.db" in named.stderr and "--db or" not in named.stderr, named.stderr
