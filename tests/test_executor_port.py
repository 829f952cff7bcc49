"""The executor's edge (issue 58, item 5): the loop and the planner see `core.executor_port`, never the class, and
ask its capabilities through methods (a calibrated profile, a twin, a quality evaluation), never getattr/hasattr."""
from __future__ import annotations

import re
from pathlib import Path

from core import profiles
from core.executor_port import ExecutorPort, StationSimulator
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, Target, builtin_sim
from state.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _executor(tmp_path: Path, *targets: Target) -> Executor:
    return Executor(Store(f"sqlite:///{tmp_path / 'state.db'}"), {t.name: t for t in targets},
                    ExecSettings(runs_root=tmp_path / "runs", holder="t"))


def test_the_executor_is_the_port_the_loop_holds_and_the_simulator_the_prescreen_asks(tmp_path):
    ex = _executor(tmp_path)
    assert isinstance(ex, ExecutorPort) and isinstance(ex, StationSimulator)
    assert ex.runs_root == tmp_path / "runs"


def test_calibrated_says_whether_a_target_can_be_simulated_and_predict_station_agrees(tmp_path):
    cal = Target(name="simcal", kind="sim", engine="sim", profile="llama70b-h100-p2d2",
                 calibrated_profile="llama70b-h100-p2d2", run_root=str(tmp_path / "tgt"))
    ex = _executor(tmp_path, cal)
    assert ex.calibrated("simcal") and not ex.calibrated("sim") and not ex.calibrated("no-such-target")
    knobs = profiles.load("llama70b-h100-p2d2").knobs({}, start=True)
    assert ex.predict_station("sim", "chat2k", knobs, 16) is None
    got = ex.predict_station("simcal", "chat2k", knobs, 16)
    assert got is not None and got["summary"] is not None


def test_bind_sim_profile_rebinds_a_simulator_target_to_the_goals_profile_and_nothing_else(tmp_path):
    other = Target(name="loc", kind="local", engine="sim", run_root=str(tmp_path / "loc"),
                   hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8000),))
    ex = _executor(tmp_path, builtin_sim(), other)
    ex.bind_sim_profile("sim", "llama70b-h100-p2d2")
    assert ex.targets["sim"].profile == "llama70b-h100-p2d2"
    ex.bind_sim_profile("sim", None)  # a goal without a profile: the target as defined
    assert ex.targets["sim"].profile == "llama70b-h100-p2d2"
    ex.bind_sim_profile("loc", "llama70b-h100-p2d2")  # not a simulator: left alone
    assert ex.targets["loc"] == other
    ex.bind_sim_profile("no-such-target", "llama70b-h100-p2d2")
    assert "no-such-target" not in ex.targets


def test_no_executor_is_typed_any_or_probed_with_getattr_in_the_agent():
    probed, untyped = [], []
    for p in sorted((ROOT / "agent").rglob("*.py")):
        text = p.read_text()
        probed += [f"{p.relative_to(ROOT)}: {m}" for m in
                   re.findall(r"(?:get|has)attr\((?:self\.)?(?:executor|simulator)\b[^)]*\)", text)]
        untyped += [f"{p.relative_to(ROOT)}: {m}" for m in re.findall(r"\b(?:executor|simulator): Any\b", text)]
    assert not probed and not untyped, probed + untyped
