"""The derived prior's error per coefficient against every library profile (and its perturbed truths).

For each profile that says what its deployment is (`deployment:` - model config, card, engine), the prior derived by
roofline from that description alone (simulator/derive.py, as a real target's is) is set beside the profile's own
coefficients: the ratio derived / profile per step cost (prefill and decode a, b, c; the draft costs; the KV
capacity). `--perturb-truth S` compares against simulator.perturb(profile, S) instead, the truths the bench's
perturbed runs measure. A ratio outside x2 is marked; with --floor each such prefill a / c also says whether the
profile's figure is faster than the card's datasheet allows (its weights read at 100 % of peak bandwidth; its
attention at 100 % of peak), where no roofline can come within x2.

    python bench/derived_prior.py [--perturb-truth 1] [--dense-gpu] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core import profiles  # noqa: E402
from core.cards import card  # noqa: E402
from simulator import perturb  # noqa: E402
from simulator.derive import derive_for_profile, error_table, spec_of  # noqa: E402

GPUS = ("H100", "H200", "H800", "A100", "L40S", "L4")


def floor(prof: profiles.Profile, coef: str) -> float | None:
    """The fastest a prefill a or c can be on the profile's card (None: no floor computed for it)."""
    d = prof.deployment
    assert d is not None
    m, c = spec_of(d), card(d.card)
    r = (prof.decode if prof.mixed else prof.prefill).cards_per_instance * c.devices_per_card
    if coef == "prefill.a" and not prof.mixed:  # a mixed engine's prefill a is a chunk's extra, not a pass
        return m.total_params() * m.weight_bytes / r / (c.mem_bw_gb_s * 1e9)
    if coef == "prefill.c":
        return m.prefill_pair_flops() / (r * c.peak("bf16"))
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--perturb-truth", type=int, default=None, metavar="SEED")
    ap.add_argument("--dense-gpu", action="store_true", help="only the dense GPU profiles")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows, within, total = [], 0, 0
    for name in profiles.names():
        prof = profiles.load(name)
        if prof.deployment is None:
            continue
        moe = any(k in prof.deployment.model for k in ("num_experts", "n_routed_experts"))
        if args.dense_gpu and (moe or prof.deployment.card not in GPUS):
            continue
        truth = prof if args.perturb_truth is None else perturb.perturb(prof, args.perturb_truth)
        d = derive_for_profile(prof)
        for coef, dv, tv, ratio in error_table(d.profile, truth):
            ok = 0.5 <= ratio <= 2.0
            f = floor(prof, coef) if not ok else None
            beyond = f is not None and tv < f
            within += ok
            total += 1
            rows.append({"profile": name, "coefficient": coef, "derived": dv, "truth": tv, "ratio": ratio,
                         "within_x2": ok, "truth_beyond_card": beyond})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'profile':30s} {'coefficient':34s} {'derived':>11s} {'truth':>11s} {'ratio':>7s}")
    for r in rows:
        mark = "" if r["within_x2"] else ("  outside x2: the truth is faster than the card allows"
                                          if r["truth_beyond_card"] else "  outside x2")
        print(f"{r['profile']:30s} {r['coefficient']:34s} {r['derived']:11.4g} {r['truth']:11.4g} "
              f"{r['ratio']:7.2f}{mark}")
    logs = [abs(math.log(r["ratio"])) for r in rows]
    med = sorted(logs)[len(logs) // 2] if logs else 0.0
    print(f"\n{within}/{total} within x2; median |ratio| x{math.exp(med):.2f}"
          + ("" if args.perturb_truth is None else f" (against perturbed truths, seed {args.perturb_truth})"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
