"""llama-server's own parser checks what tuneloop renders, and its own /metrics names what tuneloop reads.

Every llama.cpp knob of the catalog is rendered at each of its value classes (min, default, max; both booleans;
every choice) and every flag of the argv must be one that the real binary's `--help` lists; a deliberately
misspelt flag must fail that check and be refused by the binary itself. One station with every knob away from
its default is started for real, and the `llamacpp:*` names tuneloop's evidence reads must be in its /metrics.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from ports_support import free_port
from test_llamacpp_loop import engine  # noqa: F401  (engine: shared fixture)

from core.knobs import catalog
from core.station import Station, full_knobs
from executor import evidence
from executor.engines.llamacpp_cli import help_flags, unknown_flags
from executor.targets import Host, Target
from executor.templates import render

KNOBS = catalog().for_engine("llamacpp")


def _value_classes(knob) -> list:
    if knob.type == "bool":
        return [True, False]
    if knob.type == "enum":
        return list(knob.choices or ())
    vals = [v for v in (knob.min, knob.default, knob.max) if v is not None]
    vals = [int(v) for v in vals] if knob.type == "int" else vals
    return [*dict.fromkeys(vals), *([None] if knob.nullable else [])]


def _argv(binary: str, model: str, port: int, knobs: dict) -> list[str]:
    target = Target(name="l", kind="local", engine="llamacpp", engine_command=(binary,), model=model,
                    hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), port=port),))
    station = Station(engine="llamacpp", knobs=full_knobs(knobs, "llamacpp"), scenario="llamacpp-chat",
                      data_version="d", source_identity="s", target="l")
    return list(render(target, station).services[0].argv)


@pytest.fixture(scope="module")
def known(engine):  # noqa: F811
    out = subprocess.run([engine["bin"], "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    flags = help_flags(out.stdout + out.stderr)
    assert {"--parallel", "--ctx-size", "--no-kv-unified", "--no-cache-prompt", "--metrics"} <= flags
    return flags


def test_catalog_has_the_llamacpp_knobs():
    assert {k.name for k in KNOBS} >= {"parallel", "threads", "batch_size", "ubatch_size", "ctx_size", "kv_unified",
                                       "cache_prompt"}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_value_class_renders_flags_the_binary_knows(engine, known, knob):  # noqa: F811
    flag = knob.engines["llamacpp"]
    for value in _value_classes(knob):
        argv = _argv(engine["bin"], engine["model"], 8080, {knob.name: value})
        assert unknown_flags(argv, known) == [], f"{knob.name}={value!r}: {argv}"
        if isinstance(value, bool):
            assert (flag if value else "--no-" + flag[2:]) in argv
        elif value is not None:
            assert argv[argv.index(flag) + 1] == str(value)


def test_a_misspelt_flag_fails_the_check_and_the_binary_refuses_it(engine, known):  # noqa: F811
    argv = _argv(engine["bin"], engine["model"], free_port(), {"parallel": 2})
    bad = [("--paralel" if a == "--parallel" else a) for a in argv]
    assert unknown_flags(bad, known) == ["--paralel"]
    out = subprocess.run(bad, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--paralel" in out.stdout + out.stderr  # llama-server's own parser agrees


def test_rendered_station_starts_and_exports_the_metric_names_evidence_reads(engine, known, tmp_path):  # noqa: F811
    port = free_port()
    away = {"parallel": 3, "threads": 1, "batch_size": 256, "ubatch_size": 128, "ctx_size": 1024,
            "kv_unified": False, "cache_prompt": False}
    assert set(away) == {k.name for k in KNOBS}, "a new llama.cpp knob: add it here away from its default"
    assert all(away[k.name] != k.default for k in KNOBS)
    argv = _argv(engine["bin"], engine["model"], port, away)
    assert unknown_flags(argv, known) == []
    log = tmp_path / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"llama-server exited {proc.returncode}: {log.read_text()[-1500:]}"
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-1500:]
            time.sleep(0.2)
        props = httpx.get(f"{base}/props", timeout=10).json()
        assert props["total_slots"] == 3  # --parallel 3 reached the server
        r = httpx.post(f"{base}/completion", json={"prompt": "hello", "n_predict": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
        text = httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        proc.terminate()
        proc.wait(30)
    exported = set(re.findall(r"^(llamacpp:[a-z_]+)", text, re.M))
    read = {n for names in (evidence.RUNNING, evidence.WAITING, evidence.BUSY_SLOTS, evidence.KV_USAGE,
                            evidence.SPEC_DRAFTS, evidence.SPEC_ACCEPTED) for n in names if n.startswith("llamacpp:")}
    assert read and read <= exported, f"evidence reads names llama-server does not export: {read - exported}"
    assert "llamacpp:kv_cache_usage_ratio" not in exported  # removed upstream; evidence must not wait for it
    assert "llamacpp:tokens_predicted_total" in exported
    assert float(re.search(r"^llamacpp:tokens_predicted_total (\S+)", text, re.M).group(1)) >= 4
