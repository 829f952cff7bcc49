"""The default planner's efficiency targets (issue 43), read from `bench/tuner_efficiency.py` runs.

Pass the results.json of each run to judge together (typically one per truth: plain, `--perturb-truth 1`,
`--perturb-truth 2`; and one per set when the sets ran apart); every case of every run counts once per truth:

    python bench/tuner_must_hold.py OUT_PLAIN/results.json OUT_T1/results.json OUT_T2/results.json

Per set (`tune`, `heldout`, no set) it prints, over every case and truth with a feasible point:

* reach: cases where the loop got within 2 % of the exhaustive optimum on at least 2 of 3 seeds (its runs' share);
* the geometric means of the loop's median card-hours to 2 % over TPE's and over grid's (a case where the loop
  did not reach is counted apart and left out of the mean, as tuner_efficiency's own summary does);
* the median over loop runs of the experiments to 2 % after the baseline (not reached: infinitely late);
* sparse cases (at most 20 % of the feasible stations within 2 % of the optimum): none above 1.0 × TPE (one above
  whose floor, below, is above 1.0 × TPE as well is named unreachable by construction);
  denser cases (a random draw lands near the optimum by luck): each within 2 % in at most 2 experiments after the
  baseline (median over its seeds);
* plain cases (the truth is the prior): the median experiments to 2 % after the baseline, at most 1.

and the held-out half's limits (≤ 0.33 × TPE, ≤ 0.2 × grid, median ≤ 3) with the tune half within 1.5 × of the
held-out figure (either way). Beside each geometric mean it prints the loop's floor: each case's first run (the
start station, measured before anything else) plus the cheapest run of a station within 2 % that any of its seeds
made, over the same baseline (what a loop that went from its baseline straight to the optimum would score); where
the tune half's floor alone is outside the band the line says it is unreachable by construction (the halves' spaces
and start stations, not the planner, set it). Each line ends in `holds` or `DOES NOT HOLD`; the exit code is 0 when
every line holds, 1 when one does not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tuners.report import geomean  # noqa: E402
from bench.tuners.scoring import median_or_none  # noqa: E402

SPARSE = 0.20  # near-optimal share of the feasible stations at or below which a case is sparse
REACH = 2 / 3
HELDOUT = {"tpe": 0.33, "grid": 0.20, "median": 3.0}
TUNE_WITHIN = 1.5
DENSE_EXPERIMENTS = 2
PLAIN_MEDIAN = 1


@dataclass
class Row:
    """One case on one truth, as one tuner_efficiency run scored it."""

    name: str
    set: str | None
    truth: str  # "plain" or the perturbation seed
    reached: int
    seeds: int
    tpe: float | None
    grid: float | None
    after: list[float | None]  # experiments to 2 % after the baseline, per loop run
    near_share: float | None
    # the loop's floor over each baseline method's card-hours to 2 % (its total spend where it never reached): its
    # first run (the start station, measured before anything else) plus the cheapest run of a station within 2 %
    # any of its seeds made (none where the start is within 2 %), what a loop that went from its baseline straight
    # to the optimum would score
    floor: dict[str, float | None] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.truth})"

    @property
    def median_after(self) -> float | None:
        return median_or_none(self.after)


def rows_of(results: dict[str, Any], source: str) -> list[Row]:
    """Every case with a feasible point of one tuner_efficiency results.json."""
    if not isinstance(results.get("cases"), list):
        raise ValueError(f"{source}: no `cases` list (not a bench/tuner_efficiency.py results.json)")
    truth = "plain" if results.get("perturb_truth") is None else f"truth {results['perturb_truth']}"
    out = []
    for c in results["cases"]:
        if c.get("no_feasible_point"):
            continue
        loop = c["methods"]["tuneloop"]
        runs = loop["runs"]
        after = [None if r["score"]["experiments_to_target"] is None else r["score"]["experiments_to_target"] - 1
                 for r in runs]
        feasible, near = c.get("feasible_points"), c.get("near_optimal_points")
        floor = {k: _floor(runs, c["methods"].get(k, {}).get("summary")) for k in ("tpe", "grid")}
        out.append(Row(name=c["name"], set=c.get("set"), truth=truth, reached=loop["summary"]["reached"],
                       seeds=loop["summary"]["seeds"], tpe=c["target"]["tpe"]["ratio"],
                       grid=c["target"]["grid"]["ratio"], after=after,
                       near_share=near / feasible if feasible and near is not None else None, floor=floor))
    return out


def _floor(runs: list[dict[str, Any]], method: dict[str, Any] | None) -> float | None:
    """The loop's floor over one baseline method (Row.floor); None where the runs carry no trials or no run
    reached, or the method has no card-hours."""
    if not method or not all(r.get("trials") for r in runs):
        return None
    first = median_or_none([r["trials"][0]["card_hours"] for r in runs])
    there = [0.0 if e == 1 else r["trials"][e - 1]["card_hours"] for r in runs
             if (e := r["score"]["experiments_to_target"]) is not None]
    ref = method["median_card_hours_to_target"] if method.get("median_card_hours_to_target") is not None \
        else method.get("median_card_hours")
    return (first + min(there)) / ref if first is not None and there and ref else None


def _beyond(r: Row) -> str:
    """Words for a sparse case above TPE whose floor is above it too: no loop that measures its start could be under."""
    low = r.floor.get("tpe")
    return "" if low is None or low <= 1.0 else f" (its floor {low:.2f}: unreachable by construction)"


def verdict(ok: bool) -> str:
    return "holds" if ok else "DOES NOT HOLD"


def set_lines(label: str, rows: list[Row]) -> tuple[list[str], dict[str, float | None], bool]:
    """The lines of one set, its figures (geometric means, median) and whether every line of it holds."""
    lines, ok = [f"## {label}: {len(rows)} case x truth"], True
    short = [r for r in rows if r.reached < math.ceil(REACH * r.seeds - 1e-9)]
    good = not short
    ok &= good
    lines.append(f"reach: {len(rows) - len(short)}/{len(rows)} within 2 % on >= 2/3 seeds"
                 + (f"; short: {', '.join(f'{r.label} {r.reached}/{r.seeds}' for r in short)}" if short else "")
                 + f" — {verdict(good)}")
    figs: dict[str, float | None] = {}
    for k in ("tpe", "grid"):
        have = [getattr(r, k) for r in rows if getattr(r, k) is not None]
        figs[k] = geomean(have)
        floor = [r.floor.get(k) for r in rows if getattr(r, k) is not None and r.floor.get(k) is not None]
        figs[f"floor {k}"] = geomean(floor) if len(floor) == len(have) else None
        lines.append(f"card-h to 2 % / {k.upper() if k == 'tpe' else k}: geometric mean "
                     + ("n/a" if figs[k] is None else f"{figs[k]:.3f}") + f" over {len(have)}"
                     + (f" ({len(rows) - len(have)} not reached, left out)" if len(have) < len(rows) else "")
                     + ("" if figs[f"floor {k}"] is None else
                        f"; the loop's floor (its baseline, then straight to a station within 2 %) "
                        f"{figs[f'floor {k}']:.3f}"))
    figs["median"] = median_or_none([a for r in rows for a in r.after])
    lines.append("experiments to 2 % after the baseline: median "
                 + ("not reached" if figs["median"] is None else f"{figs['median']:g}")
                 + f" over {sum(len(r.after) for r in rows)} loop runs")
    sparse = [r for r in rows if r.near_share is not None and r.near_share <= SPARSE]
    over = [r for r in sparse if r.tpe is None or r.tpe > 1.0]
    good = not over
    ok &= good
    lines.append(f"sparse cases (<= {SPARSE:.0%} of the feasible stations within 2 %): {len(sparse) - len(over)}/"
                 f"{len(sparse)} at or below 1.0 x TPE"
                 + ("; above: " + ", ".join(f"{r.label} " + ("not reached" if r.tpe is None else f"{r.tpe:.2f}")
                                           + _beyond(r) for r in over) if over else "") + f" — {verdict(good)}")
    dense = [r for r in rows if r.near_share is not None and r.near_share > SPARSE]
    late = [r for r in dense if r.median_after is None or r.median_after > DENSE_EXPERIMENTS]
    good = not late
    ok &= good
    lines.append(f"denser cases: {len(dense) - len(late)}/{len(dense)} within 2 % in <= {DENSE_EXPERIMENTS} "
                 "experiments after the baseline (median over seeds)"
                 + (f"; later: {', '.join(f'{r.label} ' + ('not reached' if r.median_after is None else f'{r.median_after:g}') for r in late)}"
                    if late else "") + f" — {verdict(good)}")
    plain = [a for r in rows if r.truth == "plain" for a in r.after]
    if plain:
        m = median_or_none(plain)
        good = m is not None and m <= PLAIN_MEDIAN
        ok &= good
        lines.append(f"plain cases (prior = truth): median experiments to 2 % after the baseline "
                     + ("not reached" if m is None else f"{m:g}") + f" over {len(plain)} loop runs (<= {PLAIN_MEDIAN})"
                     + f" — {verdict(good)}")
    return lines, figs, ok


def judge(rows: list[Row]) -> tuple[list[str], bool]:
    lines, ok = [], True
    figs: dict[str, dict[str, float | None]] = {}
    for s, label in (("tune", "set tune"), ("heldout", "set heldout"), (None, "no set")):
        mine = [r for r in rows if r.set == s]
        if not mine:
            continue
        ls, figs[label], good = set_lines(label, mine)
        lines += ls + [""]
        ok &= good
    held = figs.get("set heldout")
    if held is not None:
        lines.append("## the held-out half's limits")
        for k in ("tpe", "grid"):
            v = held[k]
            good = v is not None and v <= HELDOUT[k]
            ok &= good
            lines.append(f"held-out / {k.upper() if k == 'tpe' else k}: "
                         + ("n/a" if v is None else f"{v:.3f}") + f" (<= {HELDOUT[k]}) — {verdict(good)}")
        m = held["median"]
        good = m is not None and m <= HELDOUT["median"]
        ok &= good
        lines.append("held-out median experiments after the baseline: " + ("not reached" if m is None else f"{m:g}")
                     + f" (<= {HELDOUT['median']:g}) — {verdict(good)}")
        tune = figs.get("set tune")
        if tune is not None:
            for k in ("tpe", "grid"):
                a, b = tune[k], held[k]
                good = a is not None and b is not None and max(a, b) / min(a, b) <= TUNE_WITHIN
                ok &= good
                low = tune.get(f"floor {k}")
                # where the tune half's start stations alone already cost more than the band allows, no planner
                # could hold the line: its spaces and starts, not its planning, set the figure
                floor = "" if good or low is None or b is None or low <= TUNE_WITHIN * b else (
                    f"; unreachable by construction: the tune half's floor (each case's baseline, then straight to "
                    f"a station within 2 %) is {low:.3f}, x{low / b:.2f} of the held-out figure")
                lines.append(f"tune vs held-out / {k.upper() if k == 'tpe' else k}: "
                             + ("n/a" if a is None or b is None else f"{a:.3f} vs {b:.3f}, x{max(a, b) / min(a, b):.2f}")
                             + f" (within x{TUNE_WITHIN}){floor} — {verdict(good)}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="results.json of bench/tuner_efficiency.py runs")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    for p in args.results:
        try:
            rows += rows_of(json.loads(Path(p).read_text()), p)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {p}: {e!r}" if not isinstance(e, ValueError) else f"error: {e}", file=sys.stderr)
            return 2
    if not rows:
        print("error: no case with a feasible point in the results given", file=sys.stderr)
        return 2
    for r in sorted(rows, key=lambda r: (str(r.set), r.name, r.truth)):
        print(f"{str(r.set or '-'):8} {r.label:58} reached {r.reached}/{r.seeds}  vs TPE "
              + ("  n/a" if r.tpe is None else f"{r.tpe:5.2f}") + "  vs grid "
              + ("  n/a" if r.grid is None else f"{r.grid:5.2f}") + "  after the baseline "
              + " ".join("-" if a is None else f"{a:g}" for a in r.after)
              + ("" if r.near_share is None else f"  near-optimal {r.near_share:.0%}"))
    print()
    lines, ok = judge(rows)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
