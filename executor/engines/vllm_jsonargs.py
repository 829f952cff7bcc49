"""vLLM's JSON-valued flags rendered once per process: the station's keys and a recipe's own merged into one JSON.

vLLM's parser (vllm/utils/argparse_utils.py `FlexibleArgumentParser.parse_args`) takes a dict flag as one full JSON
(`--additional-config '{...}'`) or as dotted keys (`--additional-config.eplb_config.dynamic_eplb true`, merged into one
JSON appended after every other argument); a full JSON given twice is a duplicate argparse resolves by keeping the
last one, and the dotted keys' JSON, appended last, replaces any full JSON. So an adapter that renders
`--additional-config '{"eplb_config":{"expert_map_path":...}}'` (vLLM-Ascend's static expert map) followed by a
recipe's own `--additional-config '{"enable_shared_expert_dp":true}'` (the target's `extra_args`) launches without
the expert map while the station records it as running one. Here every spelling of such a flag in the adapter's part
and in the recipe's is read, merged key by key into one JSON and rendered once, where the adapter's stood; a recipe
key that would change a value the station renders is refused, naming the recipe's field.
"""
from __future__ import annotations

import json
from typing import Any

from core.errors import FieldError

# the dict flags the vLLM adapters render from the station (and the target's PD connector config)
STATION_JSON_FLAGS = ("--additional-config", "--speculative-config", "--kv-transfer-config", "--eplb-config",
                      "--profiler-config")


def _compact(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _name(arg: str) -> str | None:
    """The flag an argument names as vLLM's parser reads it (underscores are dashes before the first '.'), without
    its dotted keys or its '=value'; None for a value."""
    if not arg.startswith("--"):
        return None
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def _value(text: str, flag: str, field: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise FieldError(field, f"{flag} {text!r} is not JSON") from None


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    """`more` merged into `into` key by key (nested objects merged, a later leaf replacing an earlier one)."""
    for k, v in more.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _leaves(obj: dict[str, Any], path: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        p = f"{path}.{k}" if path else k
        out |= _leaves(v, p) if isinstance(v, dict) and v else {p: v}
    return out


def _collect(argv: list[str], flag: str, field: str) -> tuple[list[str], list[int], dict[str, Any]]:
    """(argv without the flag's spellings, the indices in that argv where they stood, their merged JSON)."""
    rest: list[str] = []
    where: list[int] = []
    merged: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if _name(arg) != flag:
            rest.append(arg)
            i += 1
            continue
        head, eq, text = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise FieldError(field, f"{head} has no value")
            text = argv[i + 1]
        i += 1 if eq else 2
        where.append(len(rest))
        keys = head.split(".")[1:]
        if not keys:  # the full JSON
            value = _value(text, flag, field)
            if not isinstance(value, dict):
                raise FieldError(field, f"{flag} {text!r} is not a JSON object")
            _merge(merged, value)
            continue
        if keys[-1].endswith("+"):  # --flag.key+ a,b appends a list (vLLM's own reading)
            keys[-1] = keys[-1][:-1]
            leaf: Any = text.split(",")
        else:
            try:
                leaf = json.loads(text)
            except ValueError:
                leaf = text  # vLLM keeps a dotted value that is not JSON as its string
        for k in reversed(keys):
            leaf = {k: leaf}
        _merge(merged, leaf)
    return rest, where, merged


def one_json_per_flag(own: list[str], recipe: list[str], field: str,
                      flags: tuple[str, ...] = STATION_JSON_FLAGS) -> list[str]:
    """The adapter's argv (`own`) followed by the recipe's (`recipe`, the target's extra_args of this role, refused
    as `field`), with each dict flag of `flags` rendered once: the recipe's keys merged into the adapter's JSON at
    the adapter's place (or, where the adapter renders none, the recipe's spellings merged at the first of them). A
    recipe that spells a flag once, as one full JSON the adapter does not render, is left as written."""
    argv = own + recipe
    for flag in flags:
        mine_rest, mine_at, mine = _collect(own, flag, field)
        theirs_rest, theirs_at, theirs = _collect(recipe, flag, field)
        if not theirs_at:
            continue
        single = len(theirs_at) == 1 and not any(_name(a) == flag and "." in a.split("=", 1)[0] for a in recipe)
        if not mine_at and single:
            continue
        ours = _leaves(mine)
        for path, value in _leaves(theirs).items():
            clash = next((p for p in ours if p == path or p.startswith(path + ".") or path.startswith(p + ".")), None)
            if clash is not None and not (clash == path and ours[clash] == value):
                raise FieldError(field, f"sets {flag} {path} = {_compact(value)}, but the station renders {flag} "
                                 f"{clash} = {_compact(ours[clash])} (a launch keeps one {flag}: the station's "
                                 "settings are not the recipe's to change)")
        _merge(mine, theirs)
        value = [flag, _compact(mine)]
        if mine_at:
            own = mine_rest[:mine_at[0]] + value + mine_rest[mine_at[0]:]
            recipe = theirs_rest
        else:
            own = mine_rest
            recipe = theirs_rest[:theirs_at[0]] + value + theirs_rest[theirs_at[0]:]
        argv = own + recipe
    return argv
