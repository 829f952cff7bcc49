"""The chat grammar's `parse` is linear in the message (issue 44): the time to parse messages of growing size.

Three shapes at each size, each the worst of its kind for a grammar that looks for commands inside free text:
a long run of command words and candidates ("approve 7 and 8 …"), a long reason after `reject N because`, and a
long run of punctuation with no space (what an anchored regular expression can make quadratic). Prints the best of
--repeat CPU timings per size (--wall: wall-clock) and the ratio to the smallest size: linear means the ratio
tracks the size ratio.

    .venv/bin/python bench/chat_parse.py [--sizes 12500,25000,50000,100000] [--repeat 5] [--wall]
Target: a 100 KB message parses in under 50 ms.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from api.chat import parse  # noqa: E402 (the checkout's own code)

SHAPES = {
    "command words": lambda n: ("approve 7 and 8 don’t stop 批准 ７ 吗？ " * (n // 36 + 1))[:n],
    "long reason": lambda n: ("reject 7 because " + "TPOT is too close to the SLO, " * (n // 30 + 1))[:n],
    "punctuation": lambda n: "approve 7" + "." * (n - 10) + "x",
}


def best(text: str, repeat: int, clock=time.process_time) -> float:
    """The fastest of `repeat` parses by `clock`: CPU time by default, which a machine shared with other work
    (other processes' time slices) does not inflate; --wall measures wall time."""
    times = []
    for _ in range(repeat):
        t0 = clock()
        parse(text)
        times.append(clock() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="12500,25000,50000,100000", help="message sizes in characters")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of CPU time")
    a = ap.parse_args()
    clock = time.perf_counter if a.wall else time.process_time
    print(f"{'wall' if a.wall else 'CPU'} time of parse, best of {a.repeat}; load average {os.getloadavg()[0]:.1f}")
    sizes = [int(s) for s in a.sizes.split(",")]
    print(f"{'shape':<15}" + "".join(f"{s:>12}" for s in sizes) + "   ratio (largest/smallest; sizes x"
          f"{sizes[-1] / sizes[0]:g})")
    worst = 0.0
    for name, make in SHAPES.items():
        ms = [best(make(s), a.repeat, clock) * 1000 for s in sizes]
        worst = max(worst, ms[-1])
        print(f"{name:<15}" + "".join(f"{m:>10.2f}ms" for m in ms) + f"   {ms[-1] / ms[0]:.1f}")
    print(f"largest message ({sizes[-1]} characters): {worst:.1f} ms at worst (target < 50 ms): "
          + ("met" if worst < 50 else "NOT met"))


if __name__ == "__main__":
    main()
