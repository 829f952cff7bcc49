"""The loop's best station on the real llama.cpp server vs the best of an exhaustive sweep, in one run.

Same machine, same scenario, same SLO, same discretised knobs (the goal's search space): first the
exhaustive sweep (every combination, one run each at the goal's confirm N, the N at which the loop
confirms its best), then the loop from the goal's start station, then both best stations once more,
back to back at confirm N (on a shared CPU host the machine's speed drifts between the sweep and the
loop; the head-to-head pair is the like-for-like figure). Prints both bests (throughput, mean TPOT,
knobs), experiments, wall time and the device time the executor charged (restart + load seconds).
The body is bench/engine_sweep.py's, shared with bench/vllm_vs_sweep.py.
Run: .venv/bin/python bench/llamacpp_vs_sweep.py [--goal examples/goal-llamacpp.yaml] [--out DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--goal", default="examples/goal-llamacpp.yaml")
    ap.add_argument("--out", default=".tuneloop/bench-llamacpp")
    args = ap.parse_args()

    from engine_sweep import in_fresh_dir
    from executor.engines.llamacpp_cli import stop

    out = Path(args.out).resolve()
    in_fresh_dir(out, stop, lambda: run(args, out))


def run(args: argparse.Namespace, out: Path) -> None:
    from engine_sweep import compare, write
    from executor.engines.llamacpp_cli import prepare
    from executor.targets import load_targets
    from state.goal import load_goal

    goal = load_goal(args.goal)
    info = prepare(out, goal.scenario)
    write(compare(goal, load_targets(info["targets"]), out, info["model_sha256"]), out)


if __name__ == "__main__":
    main()
