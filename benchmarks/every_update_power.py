"""What an every-update pass states, and what it refuses to read: its signal fraction, its blindness check and the hand-over check.

Claimed: ρ of the likelihood-ratio score on canaries drawn from exactly the claimed mechanism, what a correct
implementation's ρ is measured against. Catch: at the gate's every-update setting, whether a 10× noise deficit is caught where the canaries carry a
fraction ρ of the claimed signal, by the one-run model (``one_run_catches``, the participation sum) and by
simulated every-update audits (the likelihood-ratio score, the audit's own decision; the share of 14 that
refute, ``dpverify.stats.update_power``). Real implementations: the gate's every-update audit, its verdict,
ρ and the CPU seconds of its power (ρ and the blindness check) beside the whole audit's. Hand-overs: the
reference DP-SGD handing over honestly (with and without its noise), and, adding no noise, a frozen copy of its
initial parameters, another honest run's updates, its first four steps or its weight alone
(tests/test_every_update_handover.py).

    PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/every_update_power.py
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
from dpverify.config import EVERY_UPDATE_SETTING, every_update_config
from dpverify.registry import get_implementation
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.power import LARGEST_DEFICIT, every_update_detection, gdp_mu, measure_power, one_run_catches, separation
from dpverify.stats.scoring import subsampled_gaussian_log_likelihood_ratio
from dpverify.stats.update_power import CATCH_AUDITS, every_update_catches
from tests.test_every_update_handover import ReferenceHandingOver

LEVEL = 1 - 0.05 / 40  # a session of 40 counted audits at 95 %
DELTA = 1e-5
FRACTIONS = (0.1, 0.12, 0.14, 0.15, 0.16, 0.18, 0.2, 0.5, 1.0)
IMPLEMENTATIONS = ("reference-dpsgd", "opacus-ghost", "tf-privacy-keras")
#: (hand-over, noise): honest with and without its noise, and each wrong hand-over by a trainer adding none.
HAND_OVERS = (("honest", 1.0), ("honest", 0.0), ("frozen", 0.0), ("foreign", 0.0), ("first_four_steps", 0.0), ("weight_only", 0.0))


def catch_rows(gate, claim: ClaimedRun) -> list[str]:
    sizes = gate.canaries_per_run
    truth = claim.with_noise(claim.noise_multiplier / LARGEST_DEFICIT)
    rows = []
    for fraction in FRACTIONS:
        one_run = one_run_catches(claim, fraction=fraction, run_sizes=sizes, guess_rule=gate.guess_rule,
                                  claimed_epsilon=claim.epsilon(DELTA), delta=DELTA, confidence=LEVEL)  # fmt: skip
        share = every_update_detection(claim, truth=truth, signal=fraction, run_sizes=sizes, guess_rule=gate.guess_rule,
                                       delta=DELTA, confidence=LEVEL, audits=CATCH_AUDITS,
                                       rng=np.random.default_rng(1))  # fmt: skip
        rows.append(f"| {fraction:g} | {'caught' if one_run else 'not caught'} | {share * CATCH_AUDITS:.0f} of {CATCH_AUDITS} |")
        print(rows[-1], flush=True)
    return rows


def claimed_separation_rows() -> list[str]:
    """ρ of the likelihood-ratio score on 20 000 canaries drawn from exactly the claimed mechanism (σ = 1)."""
    rng, rows = np.random.default_rng(0), []
    for q, steps in ((0.1, 80), (0.1, 20), (0.25, 8), (1.0, 8)):
        run, m = ClaimedRun(noise_multiplier=1.0, sampling_rate=q, steps=steps), 20_000
        bits = rng.choice(np.array([-1, 1]), size=m)
        shown = ((rng.random((m, steps)) < q) & (bits == 1)[:, None]) + rng.standard_normal((m, steps))
        scores = subsampled_gaussian_log_likelihood_ratio(np.ones_like(shown), shown, noise_multiplier=1.0, sampling_rate=q)
        measured = separation(scores, bits)
        rows.append(f"| {q:g} | {steps} | {gdp_mu(run):.3f} | {measured.mu / gdp_mu(run):.3f} ({measured.low / gdp_mu(run):.3f}–{measured.high / gdp_mu(run):.3f}) |")
        print(rows[-1], flush=True)
    return rows


def power_cpu_seconds(result, gate) -> float:
    """The CPU seconds of the audit's power on its own scores, asked as the audit asks it, uncached (an audit
    whose configuration an earlier one shared pays nothing)."""
    every_update_catches.cache_clear()
    started = time.process_time()
    run = ClaimedRun(noise_multiplier=1.0, sampling_rate=gate.hyperparameters.sampling_rate, steps=gate.hyperparameters.steps)
    catches = every_update_catches(run, run_sizes=gate.canaries_per_run, guess_rule=gate.guess_rule, delta=DELTA,
                                   confidence=LEVEL)  # fmt: skip
    low = separation(result.scores, result.membership).low / gdp_mu(run)
    if low > 0:
        catches(low)
    measure_power(run, result.scores, result.membership, catches_largest=catches, expected_signal=0.5)
    return time.process_time() - started


def audit_row(name: str, implementation, gate) -> str:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_audit(implementation, gate)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    power = result.power
    rho = "-" if power is None else f"{power.signal_fraction:.3g} ({power.signal_low:.3g}–{power.signal_high:.3g})"
    spent = "-" if power is None else f"{power_cpu_seconds(result, gate):.1f}"
    note = result.not_run or result.blind or ""
    return f"| {name} | {result.verdict} | {rho} | {spent} | {cpu:.1f} | {wall:.0f} | {note[:300]} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implementations", nargs="*", default=list(IMPLEMENTATIONS))
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "every-update-power.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    gate = every_update_config("quick", {"device": "cpu"}).with_overrides(confidence=LEVEL, seed=0)
    hp = gate.hyperparameters
    claim = ClaimedRun(noise_multiplier=hp.noise_multiplier, sampling_rate=hp.sampling_rate, steps=hp.steps)
    claimed = claimed_separation_rows()
    catch = catch_rows(gate, claim)
    real = []
    for name in args.implementations:
        real.append(audit_row(name, get_implementation(name), gate))
        print(real[-1], flush=True)
    hand_overs = []
    for hand_over, noise in HAND_OVERS:
        label = f"{hand_over}, {'its noise' if noise else 'no noise'}"
        hand_overs.append(audit_row(label, ReferenceHandingOver(hand_over=hand_over, noise=noise), gate))
        print(hand_overs[-1], flush=True)
    lines = [
        "# Every-update audit: its power and the hand-over check",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU; shared with other jobs, so wall "
        "seconds are inflated: CPU seconds are this process's own)",
        f"- date: {datetime.date.today().isoformat()}",
        "- command: `PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/every_update_power.py`",
        f"- the gate's setting: {EVERY_UPDATE_SETTING}, {gate.pooled_runs} runs × {gate.canaries_per_run[0]} Dirac "
        f"canaries, C = {hp.max_grad_norm:g}, per-audit confidence {LEVEL:.5f}, seed 0",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        "## ρ of the claimed mechanism itself (the score's separation over the claim's GDP μ)",
        "",
        "| q | steps | GDP μ (central limit at q < 1) | ρ (95 % interval) |",
        "|---|---|---|---|",
        *claimed,
        "",
        f"## Is a {LARGEST_DEFICIT:g}× noise deficit caught at signal fraction ρ?",
        "",
        "| ρ | one-run model | simulated every-update audits refuting |",
        "|---|---|---|",
        *catch,
        "",
        *_table("The gate's every-update audit of real implementations", "implementation", real),
        *_table("The reference DP-SGD handing its updates over, or not its own", "hand-over", hand_overs),
    ]
    write_table(args.output, lines, started=started)


def _table(title: str, first: str, rows: list[str]) -> list[str]:
    """A section of audit rows (:func:`audit_row`) under ``title``, its first column named ``first``."""
    return [f"## {title}", "", f"| {first} | verdict | ρ (95 % interval) | power CPU s | audit CPU s | audit wall s | note |",
            "|---|---|---|---|---|---|---|", *rows, ""]  # fmt: skip


if __name__ == "__main__":
    main()
