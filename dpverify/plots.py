"""Per-audit pictures: member and non-member score histograms (a two-world audit's: the D and D′ runs'
scores and the threshold its (ε, δ) test chose) under the audit's power (ρ, k*), and ε_L against the
number of guesses."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpverify._text import deficit_text  # noqa: E402
from dpverify.results import AuditResult  # noqa: E402


def save_audit_plots(result: AuditResult, directory: str | Path) -> Path:
    """Write ``<implementation>-seed<seed>.png`` into ``directory`` and return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    figure, (histogram, curve) = plt.subplots(1, 2, figsize=(11, 4))
    two_world = result.design == "two_world"
    if result.scores is not None and result.membership is not None:
        bins = np.histogram_bin_edges(result.scores, bins=50)
        labels = ("runs on D′ (+1)", "runs on D (−1)") if two_world else ("members (S = +1)", "non-members (S = −1)")
        for bit, label in zip((1, -1), labels):
            histogram.hist(result.scores[result.membership == bit], bins=bins, alpha=0.6, label=label)
        if two_world and result.threshold is not None:
            histogram.axvline(result.threshold, color="black", linestyle="--", label="threshold of the (ε, δ) test")
        histogram.set_xlabel("score")
        histogram.set_ylabel("runs" if two_world else "canaries")
        histogram.legend()
    histogram.set_title(f"{result.implementation}: {result.design} design\n{_power(result)}")
    if result.bound_by_guesses:
        counts, _, bounds = zip(*result.bound_by_guesses)
        curve.plot(counts, bounds, marker="o", label="ε_L")
        curve.set_xscale("log")
    curve.axhline(result.claimed_epsilon, color="red", linestyle="--", label=f"claimed ε ({result.relation})")
    curve.axhline(result.optimal_epsilon, color="grey", linestyle=":", label="ε_O")
    if result.curve_epsilon_lower_bound is not None and np.isfinite(result.curve_epsilon_lower_bound):
        curve.axhline(result.curve_epsilon_lower_bound, color="green", linestyle="-.",
                      label="curve test: ε of the weakest refuted member")
    curve.set_xlabel("number of guesses")
    curve.set_ylabel("ε")
    # Two lines: on one, the curve test's p-value ran past the figure's edge.
    curve.set_title(f"verdict: {result.verdict} (ε_L = {result.epsilon_lower_bound:.3f})\n{_curve_outcome(result)}")
    curve.legend()
    figure.tight_layout()
    path = directory / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', result.implementation)}-seed{result.seed}.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _power(result: AuditResult) -> str:
    """The signal the canaries carried and the smallest noise deficit the audit catches, in a few words."""
    power = result.power
    if power is None:
        return "no noise-deficit power stated"
    if not power.deficit_asked:
        return f"signal ρ = {power.signal_fraction:.2f}; claim refuted, noise deficit k* not asked"
    if power.smallest_deficit is None:
        return f"signal ρ = {power.signal_fraction:.2f}; noise deficit k* not stated"
    deficit = "none ≤ 10×" if not np.isfinite(power.smallest_deficit) else f"{deficit_text(power.smallest_deficit)}×"
    return f"signal ρ = {power.signal_fraction:.2f}; catches a noise deficit k* = {deficit}"


def _curve_outcome(result: AuditResult) -> str:
    """The curve test in a few words: whether it refuted the claimed curve, and at which p-value."""
    if result.curve_p_value is None:
        return "no curve test"
    verb = "refutes" if result.curve_refuted else "does not refute"
    return f"curve test {verb} the claim, p = {result.curve_p_value:.2g}"
