"""How fast this machine is right now, for reading a timing beside another one.

The shared 2-core CPU's speed drifts: the same code's main job took 7 min 9 s and then 5 min 46 s half an hour
apart, while this took 24.6-26.8 and then 23.2-20.9 CPU seconds (2026-11-27,
benchmarks/results/main-job-families.md). Run this before and after a timing and state
its seconds with it: one fixed, single-threaded computation of dpverify's own (the k* simulation of the gpu
profile's 25 runs of 10 000 canaries, numpy sorting and the curve test's recursion), whose CPU seconds scale
as the audits' do. Its result must be the same on every run; it prints the CPU seconds.

    .venvs/torch/bin/python benchmarks/machine_speed.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from dpverify.stats.curves import ClaimedRun  # noqa: E402
from dpverify.stats.power import refuted_separation  # noqa: E402
from dpverify.stats.scoring import GuessRule  # noqa: E402

#: The computation and the separation it must find (so that a changed computation is not timed as a speed).
#: At 250 000 canaries the (ε, δ) test cannot refute, so the level rule gives the curve test all of the 0.999:
#: the curve test at the level it had before the rule (half of 0.998), the same separation and CPU seconds
#: (17.7 against 17.1 on 2026-11-28).
RUN, RUN_SIZES, EXPECTED = ClaimedRun(noise_multiplier=1.2, steps=10), (10_000,) * 25, 3.72677996249965


def main() -> None:
    started = time.process_time()
    found = refuted_separation(
        RUN, run_sizes=RUN_SIZES, guess_rule=GuessRule(), claimed_epsilon=RUN.epsilon(1e-5), delta=1e-5, confidence=0.999
    )
    seconds = time.process_time() - started
    if found != EXPECTED:
        raise SystemExit(f"the computation changed (separation {found!r}, expected {EXPECTED!r}): not a speed probe any more")
    print(f"{seconds:.1f} CPU seconds (20.5-29.8 on the 2-core CPU on 2026-11-27)")


if __name__ == "__main__":
    main()
