"""A key repeated in one mapping is refused (issue 44): JSON and YAML parsers keep the last value silently, so a
goal saying `hot: ask` then `hot: auto` would run `auto` while a reviewer reading top-down sees `ask`. A goal
posted as JSON or YAML, a goal file, and any other JSON body get a refusal naming the key and its line."""
from __future__ import annotations

import json

import pytest
import yaml
from test_api_support import auth, small_goal
from test_chat import client  # noqa: F401  (client: the API with a sqlite store)

from core.bounded import RepeatedKey, load_json, load_yaml
from state.goal import GoalError, load_goal


def _goal_yaml_with_a_repeat() -> tuple[str, int, int]:
    """The small goal as YAML with `hot: auto` added after `hot: ask` in its authorisation (line found, not assumed)."""
    text = yaml.safe_dump(small_goal(), sort_keys=False)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "hot: ask")
    lines.insert(at + 1, lines[at].replace("hot: ask", "hot: auto"))
    return "\n".join(lines) + "\n", at + 1, at + 2


def _goal_json_with_a_repeat() -> tuple[str, int]:
    text = json.dumps(small_goal(), indent=1)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == '"hot": "ask",')
    lines.insert(at + 1, lines[at].replace('"ask"', '"auto"'))
    return "\n".join(lines), at + 2


def test_a_posted_goal_that_repeats_a_key_is_a_422_naming_the_key_and_its_line(client):  # noqa: F811
    text, first, second = _goal_yaml_with_a_repeat()
    r = client.post("/goals", content=text, headers=auth("admin") | {"Content-Type": "application/yaml"})
    assert r.status_code == 422 and f"key 'hot' is repeated at line {second} (first at line {first})" in r.text, r.text
    body, line = _goal_json_with_a_repeat()
    r = client.post("/goals", content=body, headers=auth("admin") | {"Content-Type": "application/json"})
    assert r.status_code == 422 and f"key 'hot' is repeated at line {line}" in r.text, r.text
    assert client.get("/goals", headers=auth("viewer")).json() == []  # neither was created


def test_any_json_body_that_repeats_a_key_is_refused_before_a_route_reads_it(client):  # noqa: F811
    gid = client.post("/goals", json=small_goal(ask=False, experiments=1), headers=auth("admin")).json()["id"]
    r = client.post(f"/goals/{gid}/chat", content='{"text": "status",\n "text": "stop"}',
                    headers=auth("approver") | {"Content-Type": "application/json"})
    assert r.status_code == 422 and "key 'text' is repeated at line 2 (first at line 1)" in r.text, r.text
    assert client.get(f"/goals/{gid}/instructions", headers=auth("viewer")).json() == []


@pytest.mark.parametrize("text,key,line", [
    ('{"a": 1, "b": {"c": 1,\n "c": 2}}', "c", 2), ('{"a": [{"k": 1, "k": 2}]}', "k", 1),
    ('{"h\\u006ft": 1,\n"hot": 2}', "hot", 2), ('{"a": {"x": 1}, "b": {"x": 1},\n\n "a": 3}', "a", 3)])
def test_json_repeats_at_any_depth_name_the_key_and_line(text, key, line):
    with pytest.raises(RepeatedKey, match=f"key '{key}' is repeated at line {line} "):
        load_json(text)


def test_json_and_yaml_without_repeats_load_as_before():
    assert load_json('{"a": [{"k": 1}, {"k": 2}], "k": 3}') == {"a": [{"k": 1}, {"k": 2}], "k": 3}
    assert load_yaml("base: &b {x: 1}\nd:\n  <<: *b\n  x: 2\n") == {"base": {"x": 1}, "d": {"x": 2}}  # a merge key


@pytest.mark.parametrize("text,key,line", [("a: 1\nb:\n  c: 1\n  c: 2\n", "c", 4), ("{a: 1, a: 2}", "a", 1),
                                           ("- {k: 1}\n- x: 1\n  x: 2\n", "x", 3), ("1: a\n1: b\n", "1", 2)])
def test_yaml_repeats_at_any_depth_name_the_key_and_line(text, key, line):
    with pytest.raises(RepeatedKey, match=f"key '{key}' is repeated at line {line} "):
        load_yaml(text)


def test_a_goal_file_that_repeats_a_key_is_refused_naming_it(tmp_path):
    text, _, second = _goal_yaml_with_a_repeat()
    (tmp_path / "goal.yaml").write_text(text)
    with pytest.raises(GoalError, match=f"key 'hot' is repeated at line {second}"):
        load_goal(tmp_path / "goal.yaml")
