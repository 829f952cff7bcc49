"""The benchmark's outputs: a Markdown table per case and a best-so-far vs device-hours plot."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.tuners.scoring import LABELS, METHODS

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


def case_table(case: dict[str, Any]) -> str:
    opt = case["optimum"]
    lines = [f"### {case['name']}", "",
             f"{case['description']}".strip(),
             f"profile `{case['profile']}`, scenario `{case['scenario']}`, objective {case['objective']}, "
             f"constraints {case['constraints']}; space {case['space_size']} points ({case['feasible_points']} feasible, "
             f"{case.get('near_optimal_points', '?')} within 2 % of the optimum); "
             f"optimum {opt['value']:.2f} at {opt['point']}; seeds {case['seeds']}.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for m in METHODS:
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
    text = "\n".join(head) + "\n" + "\n".join(case_table(c) for c in results["cases"])
    path.write_text(text)
    return text


def plot(results: dict[str, Any], path: Path) -> None:
    """Best-so-far (oracle figure of the incumbent / optimum) against device-hours, one panel per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
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
