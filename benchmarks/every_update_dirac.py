"""The every-update Dirac audit at q < 1: its reach against a perfect attacker, what it catches, its cost.

Reach: at q = 0.01 (1 epoch, 100 steps) and q = 0.1 (the gate's 8 epochs, 80 steps), σ 1 and the gate's
runs and canaries, the audit's two lower bounds on
reference-dpsgd's real run beside the same statistic on ideal scores (every canary shows at each step
s_t = 1{sampled} + σZ, c_t = 1, scored against the claim: the perfect attacker of this observation model),
over the same seeds. Detection: the share of simulated audits of the gate's setting that the audit's own
decision refutes when the run was not the one claimed (too few steps accounted, a q four times too small,
half the noise; the session's per-audit level of a 40-audit plan), and the gate's audit of real
implementations (opacus-accountant-steps and opacus-accountant-rate must be refuted, the others pass). Time: wall and CPU seconds of
one gate audit per implementation.

    PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/every_update_dirac.py --seeds 3 --audits 20
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import numpy as np

from _tables import write_table

from dpverify.audits import run_audit
from dpverify.audits.verdict import curve_outcome, guess_and_bound
from dpverify.config import EVERY_UPDATE_SETTING, every_update_config
from dpverify.registry import get_implementation
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.decision import audit_decision
from dpverify.stats.power import every_update_detection
from dpverify.stats.scoring import subsampled_gaussian_log_likelihood_ratio

LEVEL = 1 - 0.05 / 40  # a session of 40 counted audits at 95 %
DELTA = 1e-5


def ideal_bounds(config, claim: ClaimedRun, rng: np.random.Generator) -> tuple[float, float]:
    """The audit's (ε, δ) and curve lower bounds on ideal scores of ``claim`` at ``config``'s size."""
    sizes = config.canaries_per_run
    bits = [rng.choice(np.array([-1, 1], dtype=np.int8), size=m) for m in sizes]
    scores = []
    for m, b in zip(sizes, bits):
        shown = ((rng.random((m, claim.steps)) < claim.sampling_rate) & (b == 1)[:, None]) + claim.noise_multiplier * rng.standard_normal((m, claim.steps))
        scores.append(subsampled_gaussian_log_likelihood_ratio(np.ones_like(shown), shown, noise_multiplier=claim.noise_multiplier,
                                                              sampling_rate=claim.sampling_rate))  # fmt: skip
    scores, membership = np.concatenate(scores), np.concatenate(bits)
    decision = audit_decision(claim, run_sizes=sizes, guess_rule=config.guess_rule, claimed_epsilon=claim.epsilon(DELTA),
                              delta=DELTA, confidence=config.confidence)  # fmt: skip
    outcome = guess_and_bound(scores, membership, guess_rule=config.guess_rule, confidence=decision.reported_confidences[0], delta=DELTA)
    tested = curve_outcome(outcome, decision, scores=scores, membership=membership)
    return outcome.epsilon_lower_bound, tested.epsilon


def timed_audit(name: str, config) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_audit(get_implementation(name), config)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--audits", type=int, default=20, help="simulated audits per detection cell")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "every-update-dirac.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    gate = every_update_config("quick", {"device": "cpu"}).with_overrides(confidence=LEVEL)
    hp = gate.hyperparameters
    reach = []
    for q, epochs in ((0.01, 1), (0.1, hp.epochs)):
        config = gate.with_overrides(sampling_rate=q, epochs=epochs)
        claim = ClaimedRun(noise_multiplier=hp.noise_multiplier, sampling_rate=q, steps=config.hyperparameters.steps)
        rng = np.random.default_rng(0)
        for seed in range(args.seeds):
            result, wall, cpu = timed_audit("reference-dpsgd", config.with_overrides(seed=seed))
            ideal = ideal_bounds(config, claim, rng)
            reach.append(f"| {q:g} | {claim.steps} | {claim.epsilon(DELTA):.2f} | {seed} | {result.epsilon_lower_bound:.2f} | "
                         f"{result.curve_epsilon_lower_bound:.2f} | {ideal[0]:.2f} | {ideal[1]:.2f} | {result.verdict} | {wall:.0f} |")  # fmt: skip
            print(reach[-1], flush=True)
    claim = ClaimedRun(noise_multiplier=hp.noise_multiplier, sampling_rate=hp.sampling_rate, steps=hp.steps)
    wrong = {
        "as claimed (null)": claim,
        "1 step in 4 accounted": ClaimedRun(noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate, steps=-(-claim.steps // 4)),
        "q four times too small": ClaimedRun(noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate / 4, steps=claim.steps),
        "half the noise": claim,
    }  # fmt: skip
    detection = []
    for case, stated in wrong.items():
        truth = claim.with_noise(claim.noise_multiplier / 2) if case == "half the noise" else claim
        share = every_update_detection(stated, truth=truth, run_sizes=gate.canaries_per_run, guess_rule=gate.guess_rule,
                                       delta=DELTA, confidence=LEVEL, audits=args.audits,
                                       rng=np.random.default_rng(1))  # fmt: skip
        detection.append(f"| {case} | σ {stated.noise_multiplier:g}, q {stated.sampling_rate:g}, {stated.steps} steps | {share:.0%} |")
        print(detection[-1], flush=True)
    timing = []
    for name in ("reference-dpsgd", "opacus-ghost", "opacus-hooks", "opacus-accountant-steps", "opacus-accountant-rate"):
        for seed in range(args.seeds):
            result, wall, cpu = timed_audit(name, gate.with_overrides(seed=seed))
            timing.append(f"| {name} | {seed} | {result.verdict} | {result.epsilon_lower_bound:.2f} | {result.curve_epsilon_lower_bound:.2f} | "
                          f"{result.curve_p_value:.2g} | {result.claimed_epsilon:.2f} | {wall:.1f} | {cpu:.1f} |")  # fmt: skip
            print(timing[-1], flush=True)
    lines = [
        "# Every-update Dirac audit at q < 1",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU; shared with other jobs, so wall "
        "seconds are inflated: CPU seconds are this process's own)",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `python benchmarks/every_update_dirac.py --seeds {args.seeds} --audits {args.audits}`",
        f"- the gate's setting: {EVERY_UPDATE_SETTING}, {gate.pooled_runs} runs × {gate.canaries_per_run[0]} Dirac "
        f"canaries, C = {hp.max_grad_norm:g}, learning rate {hp.learning_rate:g}, per-audit confidence {LEVEL:.5f}",
        "",
        __doc__.split("\n\n")[0].replace("\n", " "),
        "",
        "## Reach: reference-dpsgd against the perfect attacker (same statistic, ideal scores)",
        "",
        "| q | steps | claimed ε (PLD) | seed | ε_L (ε, δ) | curve ε_L | ideal ε_L (ε, δ) | ideal curve ε_L | verdict | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *reach,
        "",
        f"## Detection in simulation ({args.audits} audits per row, the gate's setting)",
        "",
        "| the run's claim | stated | refuted |",
        "|---|---|---|",
        *detection,
        "",
        "## The gate's audit of real implementations",
        "",
        "| implementation | seed | verdict | ε_L | curve ε_L | curve p | claimed ε | wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
        *timing,
        "",
    ]
    write_table(args.output, lines, started=started)


if __name__ == "__main__":
    main()
