"""JAX-Privacy's own auditor (``jax_privacy.auditing``, 2.0.0) beside ours, on the same scores.

    KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/jax_auditing.py \\
        --implementation test-numpy-dpsgd --seeds 3 --trials 200

Two parts, written to ``benchmarks/results/jax-privacy-auditor.md``:

1. *Real runs*: our default audit (quick profile, pooled runs) of ``--implementation`` at claimed ε 1, 2, 4,
   unmodified and with half the noise under the same claim; every ``CanaryScoreAuditor`` estimator is then
   run on that audit's own scores, split by the secret bits into held-in and held-out.
2. *Soundness by simulation*: scores N(μ, 1) for members and N(0, 1) for the others, each canary a member
   with probability ½, so the true ε at δ is that of μ-GDP. Each estimator's *false-claim rate* is how
   often it states more than the true ε (ours: refutes the true curve), against its nominal level.

``--implementation`` defaults to ``jax-privacy-core``; the numpy test double ``test-numpy-dpsgd``
(tests/doubles.py) is registered here so the benchmark runs before that plugin exists. The table names the
implementation that gave the scores.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Callable

import dp_accounting
import jax_privacy
import numpy as np
from jax_privacy import auditing
from scipy import stats

from dpverify.audits import run_audit
from dpverify.audits.planning import split_confidence
from dpverify.audits.verdict import curve_outcome, guess_and_bound
from dpverify.stats.decision import AuditDecision
from dpverify.config import profile_config
from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest
from dpverify.registry import get_implementation, register_implementation
from dpverify.results import AuditResult
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.scoring import GuessRule
from dpverify.stats.thresholds import roc_hull, threshold_epsilon_lower_bound
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.doubles: the numpy DP-SGD double
from tests.doubles import NumpyDPSGD  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SIGNIFICANCE = 0.05
#: (name, what it states, call on a CanaryScoreAuditor at significance α and δ)
JAX_ESTIMATORS: tuple[tuple[str, str, Callable[[auditing.CanaryScoreAuditor, float, float], float]], ...] = (
    ("jax one-run", "ε lower bound, 95 %", lambda a, alpha, delta: a.epsilon_one_run(alpha, delta)),
    ("jax one-run f-DP", "ε lower bound, 95 %, Gaussian curve", lambda a, alpha, delta: a.epsilon_one_run_fdp(alpha, delta)),
    ("jax Clopper–Pearson", "ε lower bound, 95 %", lambda a, alpha, delta: a.epsilon_clopper_pearson(alpha, delta)),
    ("jax GDP (2.0.0)", "ε estimate, 95 %", lambda a, alpha, delta: a.epsilon_from_gdp(alpha, delta)),
    ("jax raw counts", "point estimate", lambda a, alpha, delta: a.epsilon_raw_counts(50, delta)),
)


@dataclasses.dataclass
class NoiseDeficit(Implementation):
    """``inner`` trained with its noise divided by ``factor`` while it claims what the full noise gives.

    The claim is the one ``inner`` returns when it calibrates σ to the target ε itself; the deficit run is
    asked for σ/``factor`` explicitly. Claims are remembered per request setting, so pooled runs train
    the calibrating run once."""

    inner: Implementation
    factor: float
    info: ImplementationInfo = dataclasses.field(init=False)
    _claims: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.info = dataclasses.replace(
            self.inner.info,
            name=f"{self.inner.info.name}-noise-over-{self.factor:g}",
            expected="violation",
            breaks=f"the noise must have std σ·C for the claimed σ; here it is σ·C/{self.factor:g}",
            detectability="D2",
        )

    def train(self, request: TrainingRequest) -> TrainedModel:
        key = (request.hyperparameters, request.num_records)
        if key not in self._claims:
            self._claims[key] = self.inner.train(request).claim
        claim = self._claims[key]
        hyperparameters = dataclasses.replace(
            request.hyperparameters, noise_multiplier=claim.noise_multiplier / self.factor, target_epsilon=None
        )
        trained = self.inner.train(dataclasses.replace(request, hyperparameters=hyperparameters))
        return dataclasses.replace(trained, claim=claim)


def _implementation(name: str) -> Implementation:
    register_implementation(NumpyDPSGD(), replace=True)
    try:
        return get_implementation(name)
    except KeyError as error:
        raise SystemExit(f"{error.args[0]}\n(the numpy test double is test-numpy-dpsgd)") from None


def _jax_estimates(scores: np.ndarray, members: np.ndarray, delta: float) -> list[float]:
    auditor = auditing.CanaryScoreAuditor(scores[members], scores[~members])
    return [float(estimate(auditor, SIGNIFICANCE, delta)) for _, _, estimate in JAX_ESTIMATORS]


# -- part 1: real runs --------------------------------------------------------------------------------


def real_runs(args: argparse.Namespace) -> list[str]:
    """The per-audit table, then per estimator how many audits state an ε above the claim."""
    base = _implementation(args.implementation)
    rows = []
    for factor in (1.0, *args.deficits):
        implementation = base if factor == 1.0 else NoiseDeficit(base, factor)
        for epsilon in args.epsilons:
            for seed in range(args.seeds):
                config = profile_config("quick", epsilon=epsilon, seed=seed)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = run_audit(implementation, config)
                rows.append(_real_row(base.info.name, factor, seed, result))
                print(rows[-1], flush=True)
    names = [name for name, _, _ in JAX_ESTIMATORS]
    columns = ["implementation", "noise", "claimed ε", "seed", "our verdict", "our ε_L (ε, δ)", "our curve test", *names]
    return _table(columns, [row[:-1] for row in rows]) + ["", *_above_claim(rows, names, args)]


def _real_row(name: str, factor: float, seed: int, result: AuditResult) -> tuple:
    """The table's cells, and last, per estimator (ours: ε_L, curve, verdict) whether it states ε above the claim."""
    if result.verdict == "error":
        raise SystemExit(f"audit of {name} failed: {result.error}")
    members = result.membership > 0
    curve = f"{'refuted' if result.curve_refuted else 'not refuted'} (ε {result.curve_epsilon_lower_bound:.3f})"
    jax = _jax_estimates(result.scores, members, result.delta)
    noise = "as claimed" if factor == 1.0 else f"σ/{factor:g}"
    above = [result.epsilon_lower_bound > result.claimed_epsilon, result.curve_refuted, result.verdict == "violation"]
    above += [value > result.claimed_epsilon for value in jax]
    return (name, noise, result.claimed_epsilon, seed, result.verdict, result.epsilon_lower_bound, curve, *jax, above)


def _above_claim(rows: list[tuple], names: list[str], args: argparse.Namespace) -> list[str]:
    """Per estimator and noise, the audits in which it states more than the claimed ε (ours: refutes the claim)."""
    estimators = ["our ε_L (ε, δ) > claim", "our curve test refutes", "our verdict: violation", *(f"{n} > claim" for n in names)]
    noises = sorted({row[1] for row in rows}, key=lambda noise: noise != "as claimed")
    table = []
    for i, estimator in enumerate(estimators):
        cells = []
        for noise in noises:
            flags = [row[-1][i] for row in rows if row[1] == noise]
            cells.append(f"{sum(flags)}/{len(flags)}")
        table.append((estimator, *cells))
    title = f"Audits stating ε above the claim ({args.seeds} seeds × claimed ε {', '.join(f'{e:g}' for e in args.epsilons)}):"
    note = "with the noise as claimed the claim is true (exact at q = 1), so any count there is a false alarm"
    return [title, "", *_table(["estimator", *(f"noise {noise}" for noise in noises)], table), "", note]


# -- part 2: soundness by simulation --------------------------------------------------------------------


def simulation(args: argparse.Namespace) -> list[str]:
    rng = np.random.default_rng(args.simulation_seed)
    steinke_confidence, curve_confidence = split_confidence(0.95)
    rule = GuessRule()
    names = [name for name, _, _ in JAX_ESTIMATORS] + ["our ε_L (ε, δ)", "our curve test"]
    rows = []
    for mu in args.mus:
        true_epsilon = float(dp_accounting.get_epsilon_gaussian(1 / mu, args.delta)) if mu > 0 else 0.0
        # The claim the curve test checks is the truth itself (a barely positive μ for the null): a refutation is false.
        claim = ClaimedRun(noise_multiplier=1 / max(mu, 1e-3), steps=1)
        exceed = np.zeros(len(names), dtype=int)
        medians = [[] for _ in names]
        for _ in range(args.trials):
            members = rng.random(args.canaries) < 0.5
            scores = rng.standard_normal(args.canaries) + mu * members
            bits = np.where(members, 1, -1).astype(np.int8)
            outcome = guess_and_bound(scores, bits, guess_rule=rule, confidence=steinke_confidence, delta=args.delta)
            # Each test at its half of the level whether or not the other could refute: each is measured.
            decision = AuditDecision(claim, (args.canaries,), rule, claim.epsilon(args.delta), args.delta, 0.95,
                                     steinke_confidence, curve_confidence, decidable=True)  # fmt: skip
            curve = curve_outcome(outcome, decision, scores=scores, membership=bits)
            values = [*_jax_estimates(scores, members, args.delta), outcome.epsilon_lower_bound, curve.epsilon]
            claims = [v > true_epsilon + 1e-9 for v in values[:-1]] + [curve.refuted]
            exceed += np.array(claims, dtype=int)
            for store, value in zip(medians, values):
                store.append(value)
        for i, name in enumerate(names):
            low, high = stats.binomtest(int(exceed[i]), args.trials).proportion_ci(0.95, method="exact")
            rows.append((mu, true_epsilon, name, _statement(name), float(np.median(medians[i])),
                         f"{exceed[i]}/{args.trials} = {exceed[i] / args.trials:.1%} [{low:.1%}, {high:.1%}]",
                         _nominal(name)))  # fmt: skip
            print(rows[-1], flush=True)
    columns = ["μ", "true ε", "estimator", "states", "median output", "false claims (95 % CI)", "nominal"]
    return _table(columns, rows)


def _statement(name: str) -> str:
    ours = {"our ε_L (ε, δ)": "ε lower bound, 97.5 % (half the audit's 5 %)",
            "our curve test": "refutes the true μ-GDP curve, 97.5 %"}  # fmt: skip
    return ours.get(name) or next(text for jax_name, text, _ in JAX_ESTIMATORS if jax_name == name)


def _nominal(name: str) -> str:
    if name.startswith("our"):
        return "≤ 2.5 %"
    return "none (point estimate)" if name == "jax raw counts" else "≤ 5 %"


#: What each estimator claims and what it rests on, printed above the tables.
READING = """What each states, and on what:

- **our ε_L (ε, δ)**: Steinke, Nasr & Jagielski's Theorem 1 on the audit's declared guess grid (7 counts from
  both ends of the ranking, Bonferroni), at 97.5 % (the audit's 95 % split with the curve test). A lower
  bound for any (ε, δ)-DP mechanism, canaries of one run included.
- **our curve test**: refutes the claimed run's whole trade-off curve (Mahloujifar, Melis & Chaudhuri's
  recursion), 97.5 %, each pooled run on its own and combined (Fisher); its ε is that of the weakest refuted
  member of the claim's family. Sound for the claimed curve, whatever the mechanism.
- **jax one-run**: the same Theorem 1, one-sided guesses above a threshold, the maximum over the scores' ROC
  hull with the level divided by the hull's size (read off the scores, not declared in advance).
- **jax one-run f-DP**: the same recursion on the same thresholds, for μ-GDP curves, reported as the ε of the
  largest refuted μ: a bound on ε only for mechanisms with a Gaussian trade-off curve.
- **jax Clopper–Pearson**: ln((TPR lower bound − δ)/FPR upper bound) per hull threshold, Bonferroni. Its
  intervals treat the canaries as independent trials; the canaries of one training run are not, so on a
  run's scores it has no proof (it has one for scores of separate runs, or iid simulated ones).
- **jax GDP (2.0.0)**: Clopper–Pearson FPR/FNR bounds turned into μ = max |Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)| and
  converted to ε at δ. The absolute value lets a threshold where the attack does worse than chance count as
  evidence (fixed upstream in google-deepmind/jax_privacy#270, after 2.0.0).
- **jax raw counts**: ln(TPR/FPR) at the lowest FPR with ≥ 50 false positives, no confidence: a point estimate.
"""


# -- part 3: which thresholds the correction counts -------------------------------------------------


def null_families(args: argparse.Namespace) -> list[str]:
    """Null scores only, many trials, the one-run bound: Bonferroni over the hull (jax's default), over
    every top-r rule (our ``family="every_threshold"``), and jax's ``Split`` strategy (threshold chosen on
    half the canaries, bound on the other half)."""
    rng = np.random.default_rng(args.simulation_seed + 1)
    counts = {"jax one-run, Bonferroni() over the hull": 0, "ours, Bonferroni over every threshold": 0, "jax one-run, Split()": 0}
    hull_sizes = []
    for _ in range(args.null_trials):
        members = rng.random(args.canaries) < 0.5
        scores = rng.standard_normal(args.canaries)
        auditor = auditing.CanaryScoreAuditor(scores[members], scores[~members])
        every = threshold_epsilon_lower_bound(
            scores[members], scores[~members], method="steinke", delta=args.delta, family="every_threshold"
        )
        split = auditing.Split(seed=int(rng.integers(2**31)))
        stated = [
            auditor.epsilon_one_run(SIGNIFICANCE, args.delta),
            every.epsilon,
            auditor.epsilon_one_run(SIGNIFICANCE, args.delta, threshold_strategy=split),
        ]
        for name, value in zip(counts, stated):
            counts[name] += value > 0
        hull_sizes.append(roc_hull(scores[members], scores[~members]).thresholds.size)
    rows = []
    for name, count in counts.items():
        low, high = stats.binomtest(count, args.null_trials).proportion_ci(0.95, method="exact")
        rows.append((name, f"{count}/{args.null_trials} = {count / args.null_trials:.1%} [{low:.1%}, {high:.1%}]", "≤ 5 %"))
    note = (f"The hull had a median of {np.median(hull_sizes):g} vertices (of m + 1 = {args.canaries + 1} possible "
            "thresholds); it is drawn with the membership labels, so dividing the level by its size counts the "
            "thresholds after choosing them by their outcome.")  # fmt: skip
    return _table(["one-run ε bound at 95 %", "states ε > 0 on null scores (95 % CI)", "nominal"], rows) + ["", note]


# -- output -------------------------------------------------------------------------------------------


def _table(columns: list[str], rows: list[tuple]) -> list[str]:
    def cell(value: object) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(cell(c) for c in row) + " |" for row in rows
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--implementation", default="jax-privacy-core", help="registered implementation whose runs give the scores")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--seeds", type=int, default=3, help="audits per claimed ε and noise")
    parser.add_argument("--deficits", type=float, nargs="*", default=[2.0], help="noise divided by these factors, claim kept")
    parser.add_argument("--trials", type=int, default=200, help="simulated audits per μ")
    parser.add_argument("--mus", type=float, nargs="+", default=[0.0, 1.0, 2.0])
    parser.add_argument("--canaries", type=int, default=2000, help="simulated canaries per audit")
    parser.add_argument("--null-trials", type=int, default=4000, help="simulated null audits of part 3")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the simulation")
    parser.add_argument("--simulation-seed", type=int, default=0)
    parser.add_argument("--output", default=str(RESULTS / "jax-privacy-auditor.md"))
    args = parser.parse_args(argv)
    command = "KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/jax_auditing.py " + " ".join(argv or sys.argv[1:])
    config = profile_config("quick")
    header = [
        "# JAX-Privacy's auditor beside ours, on the same scores",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU)",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='minutes')}",
        f"- command: `{command.strip()}`",
        f"- jax-privacy {jax_privacy.__version__}, numpy {np.__version__}; every jax estimator at significance "
        f"{SIGNIFICANCE} with its default Bonferroni() threshold strategy; raw counts with min_count 50",
        f"- runs: quick profile, m = {config.audit_size} Dirac canaries in {config.pooled_runs} pooled runs; the "
        "jax estimators see the pooled scores as one set of held-in and held-out canaries",
        "",
    ]
    lines = header + [READING, "## 1. The same audits' scores, every estimator", ""] + real_runs(args)
    lines += ["", f"## 2. False-claim rates: {args.trials} simulated audits per μ, m = {args.canaries}, δ = {args.delta:g}", ""]
    lines += simulation(args)
    lines += ["", f"## 3. Which thresholds the correction counts: {args.null_trials} null audits, m = {args.canaries}, δ = {args.delta:g}", ""]
    lines += null_families(args)
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
