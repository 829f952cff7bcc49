"""`tuneloop sim calibrate`: a profile recovered from the simulator's own runs at several stations has every step-time
coefficient within 5 % of the true one; what the runs cannot separate is kept and said so; bad input is named."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core import profiles
from simulator import engine

TUNELOOP = Path(sys.executable).with_name("tuneloop")
LLAMA = "llama70b-h100-p2d2"
STATIONS = [("chat2k", {"max_num_seqs": 32}), ("chat2k", {"max_num_seqs": 64, "concurrency": 160}),
            ("copy16k-zero-cache", {"max_num_seqs": 16, "concurrency": 64}),
            ("chat2k", {"speculative_method": "mtp", "num_speculative_tokens": 2}),
            ("copy16k-zero-cache", {"max_num_seqs": 64, "speculative_method": "mtp", "num_speculative_tokens": 3})]


def _runs(tmp: Path, stations=STATIONS, n: int = 200) -> list[Path]:
    p = profiles.load(LLAMA)
    out = []
    for i, (sc, knobs) in enumerate(stations):
        d = tmp / f"run{i}"
        engine.write_run_dir(engine.simulate(p, sc, p.knobs(knobs, start=True), n=n, seed=i + 1), d)
        out.append(d)
    return out


def _calibrate(dirs: list[Path], out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(TUNELOOP), "sim", "calibrate", *map(str, dirs), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600)


def test_a_profile_recovered_from_its_own_runs_is_within_five_percent(tmp_path):
    dirs = _runs(tmp_path)
    proc = _calibrate(dirs, tmp_path / "cal.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    truth = profiles.load(LLAMA)
    coeffs = {c["name"]: c for c in got["coefficients"]}
    assert len(coeffs) == 10 and all(c["note"] != "kept: no breakdown" for c in coeffs.values())
    for name, c in coeffs.items():
        role, k = name.split(".")
        true = getattr(truth.prefill_cost if role == "prefill" else truth.decode_cost, k)
        assert c["value"] == pytest.approx(true, rel=0.05), name
        if c["note"] == "fitted":
            assert 0 < c["stderr"] < 0.05 * c["value"], name  # the Jacobian's uncertainty is reported, and small
    assert [r["run"] for r in got["runs"]] == [str(d) for d in dirs]
    for r in got["runs"]:  # the residuals per run: the simulator's own 1 % step jitter, no bias
        assert r["decode"]["rms"] < 0.02 and abs(r["decode"]["mean"]) < 0.005 and r["decode"]["steps"] > 100
        assert r["prefill"]["rms"] < 0.03 and r["prefill"]["steps"] > 10
    prof = profiles.load(str(tmp_path / "cal.yaml"))  # the written profile is a valid profile that runs
    assert prof.name == f"{LLAMA}-calibrated" and prof.decode.instances == truth.decode.instances
    assert prof.decode_cost.a == pytest.approx(coeffs["decode.a"]["value"])
    assert prof.calibration["from_runs"] == [str(d) for d in dirs]
    run = engine.simulate(prof, "chat2k", prof.knobs({}, start=True), n=40)
    assert run.truth["whole_tok_s"] > 0
    # re-calibrated from that profile (what the drift check suggests): named and described as calibrated once
    proc = _calibrate(dirs[:2], tmp_path / "again.yaml", "--base", str(tmp_path / "cal.yaml"))
    assert proc.returncode == 0, proc.stderr
    again = profiles.load(str(tmp_path / "again.yaml"))
    assert again.name == f"{LLAMA}-calibrated" and again.description.count("step times calibrated from") == 1
    assert again.description.endswith("calibrated from 2 run(s)") and again.calibration["base_profile"] == prof.name


def test_the_draft_costs_are_kept_without_a_speculative_run_and_the_text_says_why(tmp_path):
    dirs = _runs(tmp_path, STATIONS[:3], n=120)
    proc = _calibrate(dirs, tmp_path / "cal.yaml", "--name", "llama-cal")
    assert proc.returncode == 0, proc.stderr
    truth = profiles.load(LLAMA)
    prof = profiles.load(str(tmp_path / "cal.yaml"))
    assert prof.name == "llama-cal"
    assert prof.decode_cost.a_draft == truth.decode_cost.a_draft and prof.decode_cost.b_draft == truth.decode_cost.b_draft
    assert "a_draft" in proc.stdout and "no run with speculative decoding" in proc.stdout
    assert prof.decode_cost.c == pytest.approx(truth.decode_cost.c, rel=0.05)
    for d in dirs:
        assert str(d) in proc.stdout  # a residual line per run


def test_bad_input_is_named_and_nothing_is_written(tmp_path):
    proc = _calibrate([tmp_path / "missing"], tmp_path / "cal.yaml", "--base", LLAMA)
    assert proc.returncode == 2 and "missing: no run.json" in proc.stderr
    empty = tmp_path / "empty"
    (empty).mkdir()
    (empty / "run.json").write_text(json.dumps({"scenario": "chat2k", "scenario_version": 1, "n": 1,
                                                "concurrency": 1, "request_rate": 1.0, "output_len": 8}))
    (empty / "requests.jsonl").write_text("")
    proc = _calibrate([empty], tmp_path / "cal.yaml")
    assert proc.returncode == 2 and "--base" in proc.stderr
    proc = _calibrate([empty], tmp_path / "cal.yaml", "--base", LLAMA)
    assert proc.returncode == 2 and "no finished request" in proc.stderr
    assert not (tmp_path / "cal.yaml").exists()
