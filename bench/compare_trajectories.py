"""Compare tuneloop's trajectories in two tuner-efficiency results.json files (the pin of a restructure).

Only the loop's own record is compared, per case and seed: every experiment's card (the space point, stage, N),
what was decided of it (verdict, objective, feasible, improved, incumbent, repeated negative, restart) and its
card-hours (own and cumulative), plus the stop reason and status. The baselines (grid, random, TPE), the oracle
and wall-clock times are not compared. Prints nothing but a one-line "no difference" when the two agree, else
one line per difference; exits 0 when they agree, 1 when not, 2 on unusable input.

    python bench/compare_trajectories.py BEFORE/results.json AFTER/results.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TRIAL_FIELDS = ("knobs", "stage", "n", "verdict", "objective", "feasible", "card_hours", "cum_card_hours",
                "restarted", "incumbent", "improved", "repeated_negative")
RUN_FIELDS = ("stop_reason", "status")


def trajectories(results: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """(case, seed) -> {stop_reason, status, trials: [the compared fields of each experiment]}."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for case in results.get("cases", []):
        for run in case["methods"]["tuneloop"]["runs"]:
            out[(case["name"], run["seed"])] = {
                **{f: run.get(f) for f in RUN_FIELDS},
                "trials": [{f: t.get(f) for f in TRIAL_FIELDS} for t in run["trials"]]}
    return out


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    a, b = trajectories(before), trajectories(after)
    lines = [f"{c} seed {s}: only in before" for c, s in sorted(a.keys() - b.keys())]
    lines += [f"{c} seed {s}: only in after" for c, s in sorted(b.keys() - a.keys())]
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        where = f"{key[0]} seed {key[1]}"
        for f in RUN_FIELDS:
            if x[f] != y[f]:
                lines.append(f"{where}: {f}: {x[f]!r} -> {y[f]!r}")
        if len(x["trials"]) != len(y["trials"]):
            lines.append(f"{where}: {len(x['trials'])} experiments -> {len(y['trials'])}")
        for i, (t, u) in enumerate(zip(x["trials"], y["trials"]), start=1):
            for f in TRIAL_FIELDS:
                if t[f] != u[f]:
                    lines.append(f"{where} experiment {i}: {f}: {t[f]!r} -> {u[f]!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    try:
        before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lines = diff(before, after)
    n = len(trajectories(before))
    if not lines:
        print(f"no difference: {n} tuneloop trajectories (case x seed) identical")
        return 0
    print("\n".join(lines))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
