"""The benchmark's outputs: a Markdown table per case and a best-so-far vs device-hours plot."""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from bench.tuners.scoring import LABELS, METHODS, TWIN_OFF, median_or_none

COLUMNS = ("method", "reached", "device-h to 2 %", "experiments to 2 %", "final gap", "invalid runs",
           "repeated negatives", "device-h spent", "experiments")


def fmt_hours(v: float | None) -> str:
    return "not reached" if v is None else f"{v:.2f}"


def fmt_count(v: float | None) -> str:
    return "not reached" if v is None else f"{v:g}"


def row(method: str, s: dict[str, Any]) -> list[str]:
    return [method, f"{s['reached']}/{s['seeds']}", fmt_hours(s["median_card_hours_to_target"]),
            fmt_count(s["median_experiments_to_target"]), f"{100 * s['median_final_gap']:.2f} %",
            str(s["invalid_runs"]), str(s["repeated_negatives"]), f"{s['median_card_hours']:.2f}",
            f"{s['median_experiments']:g}"]


def truth_line(case: dict[str, Any]) -> str | None:
    t = case.get("truth")
    if not t:
        return None
    fs = ", ".join(f"{k} x{v:.3f}" for k, v in t["factors"].items())
    return (f"Truth: `{t['name']}` (`{t['base']}` perturbed, seed {t['seed']}; the loop's goal names `{t['base']}`): "
            f"{fs}.")


def case_table(case: dict[str, Any]) -> str:
    if case.get("no_feasible_point"):
        return "\n".join(x for x in [
            f"### {case['name']}", "", f"{case['description']}".strip(), truth_line(case),
            f"profile `{case['profile']}`, scenario `{case['scenario']}`, constraints {case['constraints']}; space "
            f"{case['space_size']} points.", "",
            "**No point of the space meets the constraints**: no optimum, nothing to find; no method was run.", ""]
            if x is not None) + "\n"
    opt = case["optimum"]
    lines = [f"### {case['name']}", "",
             f"{case['description']}".strip(), truth_line(case),
             f"profile `{case['profile']}`, scenario `{case['scenario']}`, objective {case['objective']}, "
             f"constraints {case['constraints']}; space {case['space_size']} points ({case['feasible_points']} feasible, "
             f"{case.get('near_optimal_points', '?')} within 2 % of the optimum); "
             f"optimum {opt['value']:.2f} at {opt['point']}; seeds {case['seeds']} (loop), "
             f"{case.get('baseline_seeds', case['seeds'])} (baselines).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for m in METHODS + tuple(x for x in case["methods"] if x not in METHODS):  # + the loop without its twin
        lines.append("| " + " | ".join(row(m, case["methods"][m]["summary"])) + " |")
    t = case["target"]
    verdict = "HOLDS" if t["holds"] else "DOES NOT HOLD"
    lines += ["", f"Target (tuneloop within 2 % using <= 1/3 of TPE's and <= 1/10 of grid's median device-hours): "
                  f"**{verdict}** — vs TPE {t['tpe']['ratio']} (limit {t['tpe']['limit']}, {t['tpe']['basis']}), "
                  f"vs grid {t['grid']['ratio']} (limit {t['grid']['limit']}, {t['grid']['basis']})."]
    if case.get("notes"):
        lines += [""] + [f"* {n}" for n in case["notes"]]
    return "\n".join(x for x in lines if x is not None) + "\n"


def write_table(results: dict[str, Any], path: Path) -> str:
    head = ["# Tuner efficiency (issue 9)", "",
            "Medians over seeds. device-h = simulated card-hours charged by the executor's rules (restart, weight "
            "load, warm-up, relayout, load). A method's progress is the oracle figure of the station it would deploy "
            "(its incumbent); 'to 2 %' = first experiment after which that figure is within 2 % of the exhaustive "
            "optimum. Repeated negatives = re-runs of an identical station and N that had already been a negative.",
            f"Mode: {'quick' if results['quick'] else 'full'}.", ""]
    if results.get("perturb_truth") is not None:
        head += [f"Truth: every case's profile perturbed by `simulator.perturb` with seed {results['perturb_truth']} "
                 "(step costs, MTP acceptance, expert imbalance); the oracle, the baselines and the simulated target "
                 "measure the truth, the loop's goal names the unperturbed profile (its prior).", ""]
    text = "\n".join(head) + "\n" + "\n".join(case_table(c) for c in results["cases"])
    text += "\n" + "\n".join(summary_lines(results["cases"])) + "\n"
    path.write_text(text)
    return text


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


def set_summary(label: str, cases: list[dict[str, Any]]) -> str:
    """One set's line: geometric means of the card-hour ratios, the worst case against TPE, experiments to 2 %."""
    run = [c for c in cases if not c.get("no_feasible_point")]
    skipped = len(cases) - len(run)
    parts = [f"**{label}** ({len(cases)} case{'s' * (len(cases) != 1)}"
             + (f", {skipped} with no feasible point left out" if skipped else "") + ")"]
    for k, name in (("tpe", "TPE"), ("grid", "grid")):
        ratios = [c["target"][k]["ratio"] for c in run]
        have = [r for r in ratios if r is not None]
        g = geomean(have)
        miss = len(ratios) - len(have)
        parts.append(f"geometric mean card-h ratio tuneloop / {name} "
                     + (f"{g:.3f}" if g is not None else "n/a") + f" over {len(have)} case(s)"
                     + (f" ({miss} where tuneloop did not reach left out)" if miss else ""))
    off = [c["target"][TWIN_OFF] for c in run if TWIN_OFF in c["target"]]
    if off:  # --twin both: the loop without its twin, judged by the same yardsticks in the same run
        g = {k: geomean([t[k]["ratio"] for t in off if t[k]["ratio"] is not None]) for k in ("tpe", "grid")}
        parts.append("twin off: geometric mean card-h ratio / TPE " + (f"{g['tpe']:.3f}" if g["tpe"] else "n/a")
                     + ", / grid " + (f"{g['grid']:.3f}" if g["grid"] else "n/a")
                     + f" ({sum(t['tuneloop_reached'] for t in off)}/{len(off)} case(s) reached)")
    if run:
        unreached = [c["name"] for c in run if c["target"]["tpe"]["ratio"] is None]
        if unreached:
            parts.append(f"worst vs TPE: `{unreached[0]}` (tuneloop did not reach)")
        else:
            w = max(run, key=lambda c: c["target"]["tpe"]["ratio"])
            parts.append(f"worst vs TPE: `{w['name']}` {w['target']['tpe']['ratio']:.3f}")
        after = [None if r["score"]["experiments_to_target"] is None else r["score"]["experiments_to_target"] - 1
                 for c in run for r in c["methods"]["tuneloop"]["runs"]]
        med = median_or_none(after)
        parts.append("median experiments to 2 % after the baseline "
                     + ("not reached" if med is None else f"{med:g}") + f" ({len(after)} loop runs)")
    return "; ".join(parts) + "."


def summary_lines(cases: list[dict[str, Any]]) -> list[str]:
    """The table's last lines: per set (tune, heldout, no set) and over all cases."""
    groups = [(f"set {s}" if s else "no set", [c for c in cases if c.get("set") == s]) for s in ("tune", "heldout", None)]
    groups = [(g, cs) for g, cs in groups if cs]
    if len(groups) > 1:
        groups.append(("all cases", list(cases)))
    return ["## Summary", "", "Ratios are tuneloop's median card-h to within 2 % over the baseline's (TPE's, grid's; "
            "a baseline that never reached counts its total spend); experiments after the baseline = the loop's "
            "experiment count to 2 % minus its baseline, median over runs (not reached = infinitely late).", ""] + \
        [f"* {set_summary(g, cs)}" for g, cs in groups]


def plot(results: dict[str, Any], path: Path) -> None:
    """Best-so-far (oracle figure of the incumbent / optimum) against device-hours, one panel per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in results["cases"] if not c.get("no_feasible_point")]
    if not cases:
        return
    fig, axes = plt.subplots(len(cases), 1, figsize=(8, 3.2 * len(cases)), squeeze=False)
    colours = {"tuneloop": "tab:red", "grid": "tab:blue", "random": "tab:green", "tpe": "tab:purple"}
    for ax, case in zip(axes[:, 0], cases):
        opt = case["optimum"]["value"]
        for m in METHODS:
            for i, run in enumerate(case["methods"][m]["runs"]):
                xs, ys = [0.0], [0.0]
                for t in run["trials"]:
                    xs.append(t["cum_card_hours"])
                    ys.append((t["incumbent_true"] or 0.0) / opt)
                ax.step(xs, ys, where="post", color=colours[m], alpha=0.8 if i == 0 else 0.35,
                        label=LABELS[m] if i == 0 else None)
        ax.axhline(0.98, color="grey", ls="--", lw=0.8, label="98 % of optimum")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_ylim(0, 1.05)
        ax.set_title(case["name"], fontsize=10)
        ax.set_xlabel("device-hours (card-h, simulated)")
        ax.set_ylabel("best-so-far / optimum")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
