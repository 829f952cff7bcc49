"""Drift check: a real run of a target with a calibrated profile is also predicted by the simulator at the same
station; predicted and measured output throughput (whole window) and mean TPOT are recorded with the run's
evidence, with the whole predicted Summary (the run's SLOs) from which a reader shows the goal's own figures, and a
drift beyond the target's threshold (default 15 %) is flagged with a re-calibration to run."""
from __future__ import annotations

from typing import Any

from core.evidence_parts import Drift
from core.ledger import drift_line  # noqa: F401  (the one wording, re-exported)
from core.summary import Summary
from core.trial import TrialSpec
from executor.targets import Target
from executor.transports.sim import predict_station

FIGURES = ("output_tok_s", "tpot_mean_ms")


def drift_check(target: Target, spec: TrialSpec, summary: Summary | None, run_dir: str) -> Drift | None:
    """The drift record of one measured run, or None when the target has no calibrated profile (or is the sim)."""
    if target.kind == "sim" or not target.calibrated_profile or summary is None:
        return None
    base = {"profile": target.calibrated_profile, "threshold": target.drift_threshold}
    try:
        pred = predict_station(target.calibrated_profile, spec.scenario, spec.knobs, spec.n, warmup=spec.warmup,
                               seed=spec.seed, slos=spec.slos)
    except Exception as e:  # a profile that cannot predict this station: said, never a silent pass
        return Drift.model_validate(base | {"error": f"{type(e).__name__}: {e}", "flagged": True,
                                            "suggestion": "the calibrated profile cannot predict this station: "
                                                          "re-calibrate"})
    measured = {"output_tok_s": summary.whole.output_tok_s if summary.whole else None,
                "tpot_mean_ms": summary.tpot_ms.mean}
    drift = {k: (pred[k] / measured[k] - 1.0) if pred.get(k) is not None and measured[k] else None for k in FIGURES}
    worst = max((abs(v) for v in drift.values() if v is not None), default=None)
    flagged = worst is None or worst > target.drift_threshold
    out = base | {"predicted": {k: pred.get(k) for k in FIGURES}, "measured": measured, "drift": drift,
                  "worst": worst, "flagged": flagged, "knobs_not_modelled": pred.get("knobs_not_modelled", []),
                  "summary": pred["summary"]}
    if flagged:
        out["suggestion"] = (f"the simulator's prediction is off by {worst:.0%} (limit {target.drift_threshold:.0%}): "
                             if worst is not None else "no figure to compare: ") + \
            f"re-calibrate, e.g. tuneloop sim calibrate {run_dir} --base {target.calibrated_profile} --out PROFILE.yaml"
    return Drift.model_validate(out)
