"""tuneloop's own trajectories on the tuner-efficiency cases, without the oracle and the baselines.

The same `run_loop(goal, profile, space)` call `bench/tuner_efficiency.py` makes per case and seed, written as a
results.json of the same shape for the tuneloop runs only (`cases[].methods.tuneloop.runs[]`: seed, stop
reason, status, trials), so `bench/compare_trajectories.py` reads either. The full bench spends most of its time
on the exhaustive oracle and the grid / random / TPE baselines, none of which the loop's trajectory depends on:
this is the pin of a behaviour-preserving change in minutes instead of hours (issue 37).

    python bench/loop_trajectories.py --out .pin/before          # all cases, the file's seeds
    python bench/compare_trajectories.py .pin/before/results.json .pin/after/results.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tuners.cases import CaseError, load_cases  # noqa: E402
from bench.tuners.loop import run_loop  # noqa: E402
from core import profiles  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=str(ROOT / "bench" / "scenarios.yaml"), help="case file (YAML)")
    ap.add_argument("--only", action="append", default=[], help="run only this case (repeatable)")
    ap.add_argument("--out", required=True, help="output folder (results.json)")
    args = ap.parse_args(argv)
    try:
        cf = load_cases(args.cases)
    except CaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"loop_only": True, "settings": cf.settings.model_dump(), "cases": []}
    t0 = time.perf_counter()
    for case in (c for c in cf.cases if not args.only or c.name in args.only):
        runs = []
        for seed in cf.settings.seeds:
            goal = case.goal_spec(False, seed)
            loop = run_loop(goal, profiles.load(goal.sim_profile), case.space_for(False))
            runs.append({"seed": seed, "stop_reason": loop["stop_reason"], "status": loop["status"],
                         "charging_check": loop["charging_check"],
                         "trials": [t.model_dump(mode="json") for t in loop["trials"]]})
            print(f"{case.name} seed {seed}: {loop['status']}, {len(loop['trials'])} experiments "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        results["cases"].append({"name": case.name, "methods": {"tuneloop": {"runs": runs}}})
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out / 'results.json'} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
