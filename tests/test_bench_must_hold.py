"""bench/tuner_must_hold.py judges tuner_efficiency results as issue 43's targets read: per set and truth, the
reach on 2 of 3 seeds, the geometric means against TPE and grid, the sparse / dense split, the plain cases' median,
and the held-out limits with the tune half within 1.5 x; bad input is named."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import tuner_must_hold as mh

ROOT = Path(__file__).resolve().parents[1]


def case(name: str, set_: str | None, to_target: list[int | None], tpe: float | None, grid: float | None,
         near: int = 10, feasible: int = 100) -> dict:
    runs = [{"score": {"experiments_to_target": t}} for t in to_target]
    return {"name": name, "set": set_, "feasible_points": feasible, "near_optimal_points": near,
            "methods": {"tuneloop": {"runs": runs, "summary": {"reached": sum(t is not None for t in to_target),
                                                                "seeds": len(to_target)}}},
            "target": {"tpe": {"ratio": tpe}, "grid": {"ratio": grid}}}


def results(cases: list[dict], truth: int | None = None) -> dict:
    return {"perturb_truth": truth, "cases": cases}


def test_a_set_whose_cases_reach_cheaply_holds_and_each_miss_is_named():
    good = [case("a", "heldout", [2, 2, 3], 0.2, 0.1), case("b", "heldout", [2, 3, 2], 0.3, 0.15, near=50)]
    tune = [case("c", "tune", [2, 2, 2], 0.25, 0.12), case("d", "tune", [2, 2, 4], 0.3, 0.14)]
    rows = mh.rows_of(results(good + tune), "plain") + mh.rows_of(results(good + tune, 1), "t1")
    lines, ok = mh.judge(rows)
    assert ok, "\n".join(lines)
    assert any("held-out / TPE: 0.245" in x for x in lines)  # sqrt(0.2 * 0.3), both truths
    assert any(x.startswith("plain cases") and "median experiments to 2 % after the baseline 1 " in x for x in lines)

    # a case short of 2/3 seeds, a sparse case above TPE, a dense case reached late, the tune half far better
    bad = [case("a", "heldout", [2, None, None], 0.2, 0.1), case("s", "heldout", [2, 2, 2], 1.4, 0.15),
           case("late", "heldout", [5, 5, 2], 0.3, 0.15, near=50)]
    tune = [case("c", "tune", [2, 2, 2], 0.05, 0.02)]
    lines, ok = mh.judge(mh.rows_of(results(bad + tune), "plain"))
    text = "\n".join(lines)
    assert not ok
    assert "short: a (plain) 1/3 — DOES NOT HOLD" in text
    assert "above: s (plain) 1.40 — DOES NOT HOLD" in text
    assert "later: late (plain) 4 — DOES NOT HOLD" in text
    assert "tune vs held-out / TPE" in text and "(within x1.5) — DOES NOT HOLD" in text


def test_the_script_prints_every_row_and_exits_by_the_verdict(tmp_path):
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(results([case("a", "heldout", [2, 2, 2], 0.2, 0.1)])))
    proc = subprocess.run([sys.executable, "bench/tuner_must_hold.py", str(ok)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a (plain)" in proc.stdout and "held-out / grid: 0.100 (<= 0.2) — holds" in proc.stdout
    miss = tmp_path / "miss.json"
    miss.write_text(json.dumps(results([case("a", "heldout", [None, None, 2], None, None)], 2)))
    proc = subprocess.run([sys.executable, "bench/tuner_must_hold.py", str(miss)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "a (truth 2) 1/3" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"quick": False}))
    proc = subprocess.run([sys.executable, "bench/tuner_must_hold.py", str(bad)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "no `cases` list" in proc.stderr


def test_a_tune_half_whose_floor_is_outside_the_band_is_named_unreachable_by_construction():
    # the floor: the loop's first run plus its cheapest run within 2 %, over the baseline method's card-hours
    def costed(name: str, set_: str, ratio: float, first: float, reach: float, grid: float) -> dict:
        c = case(name, set_, [2, 2, 2], 0.2, ratio)
        c["methods"]["tuneloop"]["runs"] = [{"score": {"experiments_to_target": 2},
                                             "trials": [{"card_hours": first}, {"card_hours": reach}]}] * 3
        c["methods"]["grid"] = {"summary": {"median_card_hours_to_target": grid, "median_card_hours": grid}}
        c["methods"]["tpe"] = {"summary": {"median_card_hours_to_target": None, "median_card_hours": 10.0}}
        return c

    held = [costed("h", "heldout", 0.05, 1.0, 1.0, 50.0)]
    dear = [costed("t", "tune", 0.5, 2.0, 1.0, 6.0)]  # its baseline and one run are already 0.5 x grid
    lines, ok = mh.judge(mh.rows_of(results(held + dear), "plain"))
    text = "\n".join(lines)
    assert not ok
    assert "straight to a station within 2 %) 0.500" in text and "straight to a station within 2 %) 0.040" in text
    assert "unreachable by construction" in text and "is 0.500, x10.00 of the held-out figure" in text
    # a tune half outside the band whose floor is inside it: the planner's, not the construction's
    cheap = [costed("t", "tune", 0.5, 0.1, 0.1, 6.0)]
    lines, ok = mh.judge(mh.rows_of(results(held + cheap), "plain"))
    assert not ok and "unreachable" not in "\n".join(lines)
    # a sparse case above TPE whose baseline and one run already cost more than TPE's median to 2 %
    lucky = costed("x", "heldout", 0.05, 3.0, 5.0, 50.0)
    lucky["target"]["tpe"]["ratio"] = 2.0
    lucky["methods"]["tpe"]["summary"] = {"median_card_hours_to_target": 5.5, "median_card_hours": 200.0}
    lines, ok = mh.judge(mh.rows_of(results([lucky]), "plain"))
    assert not ok and "above: x (plain) 2.00 (its floor 1.45: unreachable by construction)" in "\n".join(lines)
