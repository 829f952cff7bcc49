"""Simulator speed: one 640-request 16K->1K dsv4 run must simulate in < 2 s wall on one core, and the goal's twin
searches a space by simulating its stations, so requests per wall second decide how much of it a proposal can cover
(issues 38 and 43 ask >= 20 k requests per wall second).

Prints simulated seconds per wall second and requests per wall second (best of a few repeats), and each run's wall
and CPU milliseconds (best and median): on a shared host the CPU figure is the one to compare, run against run.
"""
from __future__ import annotations

import argparse
import statistics
import time

from core import profiles
from simulator import engine

TARGET_RPS = 20_000.0  # issues 38 and 43


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="dsv4-flash-910c-p8d8")
    ap.add_argument("--scenario", default="copy16k-zero-cache")
    ap.add_argument("--n", type=int, default=640)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--knob", action="append", default=["max_prefill_reqs=2"])
    args = ap.parse_args()
    prof = profiles.load(args.profile)
    knobs = prof.knobs(dict(k.split("=", 1) for k in args.knob), start=True)
    if args.repeat < 1:
        ap.error(f"--repeat: must be >= 1, got {args.repeat}")
    best, walls, cpus = None, [], []
    for i in range(args.repeat):
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        run = engine.simulate(prof, args.scenario, knobs, n=args.n, seed=i)
        wall = (time.perf_counter_ns() - t0) / 1e9
        walls.append(wall)
        cpus.append((time.process_time_ns() - c0) / 1e9)
        if best is None or wall < best[0]:
            best = (wall, run)
    wall, run = best
    sim_s = max(r.chunk_times[-1] for r in run.records)
    print(f"profile {prof.name} scenario {args.scenario} n={args.n} knobs {args.knob}")
    print(f"wall per run (best of {args.repeat}):   {wall:.3f} s   (target < 2 s)")
    print(f"simulated seconds:            {sim_s:.1f} s")
    print(f"simulated s per wall s:       {sim_s / wall:.1f}")
    print(f"requests per wall s:          {args.n / wall:.1f}   (target >= {TARGET_RPS:.0f})")
    print(f"output tokens per wall s:     {sum(r.n_out for r in run.records) / wall:.0f}")
    print(f"per run, ms (best / median of {args.repeat}): wall {min(walls) * 1e3:.1f} / "
          f"{statistics.median(walls) * 1e3:.1f}, CPU {min(cpus) * 1e3:.1f} / {statistics.median(cpus) * 1e3:.1f}")


if __name__ == "__main__":
    main()
