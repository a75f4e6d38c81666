"""Audit benchmarks: power, bug detection, false alarms and speed, written as markdown tables.

    .venvs/torch/bin/python benchmarks/audits.py power        # ε_L against claimed ε, beside the paper's table
    .venvs/torch/bin/python benchmarks/audits.py profiles     # both tests' ε_L per profile, beside the perfect attacker
        (--implementations opacus-ghost for the committed profiles*.md tables)
    .venvs/torch/bin/python benchmarks/audits.py separation   # the claimed signal the canaries reach, per implementation
    .venvs/torch/bin/python benchmarks/audits.py pooling      # one run of m Dirac canaries against m pooled over 4 runs
    .venvs/torch/bin/python benchmarks/audits.py detection    # every buggy variant × claimed ε × seeds
    .venvs/torch/bin/python benchmarks/audits.py noise-deficit  # smallest noise deficit 1/k caught
    .venvs/torch/bin/python benchmarks/audits.py false-alarms # many audits of correct implementations
    .venvs/torch/bin/python benchmarks/audits.py speed        # seconds per audit, DP overhead, the auditor's share
    .venvs/torch/bin/python benchmarks/audits.py sweep        # ε_L(8) and ε_L(∞) over what the auditor controls
    .venvs/torch/bin/python benchmarks/audits.py guess-grid   # other declared guess grids on the same runs

Each writes ``benchmarks/results/<name>.md`` (``<name>-cuda.md`` when it ran on a GPU) stating the device,
the date and the command. Numbers here are measurements, never test assertions. ``--seeds`` shrinks a
run; ``--profile`` and ``--device`` pick the starting point and where training runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Iterable

from scipy import stats

from dpverify.audits import run_audit
from dpverify.audits.planning import resolve_device
from dpverify.config import PROFILE_NAMES, AuditConfig, profile_config
from dpverify.contract import Implementation, ImplementationInfo, PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.registry import get_implementation, registered_implementations
from dpverify.results import AuditResult

RESULTS = Path(__file__).resolve().parent / "results"
EPSILONS = (1.0, 2.0, 4.0, 8.0, float("inf"))
#: The paper's tab:main_cv, orthogonal canaries with self-comparison (m = 2000) and Gaussian (m = 10⁴).
PAPER = {("orthogonal", 2000): {1.0: 1.089, 8.0: 3.059, float("inf"): 6.449}, ("gaussian", 10_000): {1.0: 0.771, 8.0: 3.780, float("inf"): 7.829}}


class NonPrivateSGD(Implementation):
    """Plain minibatch SGD of the designated model, no clipping and no noise: the yardstick for DP overhead.

    Same model, initialisation, Poisson batches, step count and learning rate as the DP implementations;
    it claims ε = ∞, so it is never audited for a verdict, only timed (and shows ε_L without DP)."""

    info = ImplementationInfo(name="non-private-sgd", library="torch", requires=("torch",), extra="torch")

    def train(self, request: TrainingRequest) -> TrainedModel:
        import torch

        from dpverify.torch import as_tensors, build_mlp, make_predictor, poisson_batches, resolve_device, seeds_for

        hp, device, seeds = request.hyperparameters, resolve_device(request.device), seeds_for(request.seed)
        model = build_mlp(request, device=device)
        optimizer = torch.optim.SGD(model.parameters(), lr=hp.learning_rate)
        features, labels = as_tensors(request, device)
        for batch in poisson_batches(request.num_records, hp.sampling_rate, hp.steps, seed=seeds.sampling):
            if batch.numel():
                batch = batch.to(device)
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(features[batch]), labels[batch]).backward()
                optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        claim = PrivacyClaim(epsilon=math.inf, delta=hp.delta, accountant="none (non-private)", noise_multiplier=0.0,
                             sampling_rate=hp.sampling_rate, steps=hp.steps)
        return TrainedModel(predict_log_proba=make_predictor(model, device), claim=claim, device=device.type)


def _implementation(name: str) -> Implementation:
    return NonPrivateSGD() if name == NonPrivateSGD.info.name else get_implementation(name)


def _profile(args: argparse.Namespace, profile: str | None = None, **overrides) -> AuditConfig:
    """The profile, with ``--pooled-runs R`` (R runs of the profile's own per-run size) when given."""
    name = profile or args.profile
    if args.pooled_runs is not None and "m" not in overrides:
        config = profile_config(name)
        overrides = {"pooled_runs": args.pooled_runs, "m": args.pooled_runs * config.canaries_per_run[0], **overrides}
    return profile_config(name, **overrides)


def _audit(args: argparse.Namespace, name: str, *, seed: int, profile: str | None = None, **overrides) -> AuditResult:
    config = _profile(args, profile, seed=seed, device=args.device, **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_audit(_implementation(name), config)


def _seeded(args: argparse.Namespace, name: str, **settings) -> list[AuditResult]:
    """``name`` audited with ``settings`` on ``args.seeds`` seeds from ``--first-seed`` (default 0)."""
    first = args.first_seed if args.first_seed is not None else 0
    return [_audit(args, name, seed=first + s, **settings) for s in range(args.seeds)]


def _add_row(rows: list[tuple], *cells) -> None:
    """Append a table row and show it at once: the long benchmarks report as they go."""
    rows.append(cells)
    print(cells, flush=True)


def _describe(config: AuditConfig) -> str:
    c, h = config.canaries, config.hyperparameters
    model = "softmax regression" if config.architecture.is_softmax_regression else f"MLP h = {config.architecture.hidden_width}"
    return (f"m = {c.m} {c.mode} canaries in {config.pooled_runs} pooled run(s), d = {c.dimension}, {model}, "
            f"{c.num_classes} classes, clipping C = {h.max_grad_norm:g}, "
            f"q = {h.sampling_rate:g}, {h.steps} steps, lr {h.learning_rate:g}, {config.design} design, "
            f"δ = {h.delta:g}, {config.confidence:.0%} confidence per audit, guess grid of "
            f"{len(config.guess_rule.counts(c.m))} counts with Bonferroni")


def device_line(device: str) -> str:
    """A results file's device: the GPU and torch version, or the CPU's architecture and cores."""
    if resolve_device(device) == "cuda":
        import torch

        return f"cuda ({torch.cuda.get_device_name()}, torch {torch.__version__}; {os.cpu_count()} CPU cores)"
    return f"cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU)"


def separation_over_mu(results: Iterable[AuditResult], mu: float) -> list[float]:
    """Per audit, (mean member score − mean non-member score) / the non-members' standard deviation, over
    the claimed μ: 1 when the black-box scores carry the whole claimed signal."""
    ratios = []
    for r in results:
        members, others = r.scores[r.membership == 1], r.scores[r.membership == -1]
        ratios.append(float((members.mean() - others.mean()) / others.std() / mu))
    return ratios


def _header(title: str, args: argparse.Namespace) -> list[str]:
    return [
        f"# {title}",
        "",
        f"- device: {device_line(args.device)}",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `{args.command}`",
        f"- profile: {args.profile} unless a column says otherwise ({_describe(_profile(args))})",
        "",
    ]


def _table(columns: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    columns = list(columns)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "∞" if value == float("inf") else f"{value:.3f}"
    return str(value)


def _write(name: str, lines: list[str], args: argparse.Namespace) -> None:
    suffix = "-cuda" if resolve_device(args.device) == "cuda" else ""
    directory = Path(args.results_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}{suffix}.md"
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


def power(args: argparse.Namespace) -> list[str]:
    """ε_L of a correct implementation (opacus-ghost) across claimed ε, canary mode, score and m."""
    rows = []
    scores = {"inclusion": ("mean_comparison", "self_comparison", "loss"), "pair": ("self_comparison", "loss")}
    grid = [(m, d, mode, score) for m in args.m for d in args.designs for mode in args.modes for score in scores[d][: args.scores]]
    for m, design, mode, score in grid:
        for epsilon in args.epsilons:
            dimension = args.dimension or m
            results = _seeded(args, "opacus-ghost", m=m, dimension=dimension, mode=mode, score=score, epsilon=epsilon, design=design)
            paper = PAPER.get((mode, m), {}).get(epsilon, "") if design == "pair" else ""
            rows.append(
                (m, dimension, design, mode, score, epsilon, _median(r.library_epsilon for r in results), _median(r.claimed_epsilon for r in results),
                 _median(r.epsilon_lower_bound for r in results), max(r.epsilon_lower_bound for r in results),
                 _median(r.curve_epsilon_lower_bound for r in results), results[0].optimal_epsilon, paper,
                 _median(r.seconds for r in results))
            )
    columns = ("m", "d", "design", "canaries", "score", "target ε", "Opacus ε (add/remove, RDP)", "claimed ε in the design's relation", "median ε_L", "max ε_L",
               "median curve-test ε", "ε_O", "paper ε_L", "s / audit")
    return _header("Auditing power: ε_L of a correct implementation", args) + [
        f"opacus-ghost, {args.seeds} seed(s) per row; the verdict uses both ε_L (Steinke et al.) and the "
        "curve test (Mahloujifar et al., the claimed mechanism's family; its ε at δ of the weakest refuted member). The paper's numbers (pair design, q = 0.1, "
        "its own training set-up) stand beside our pair rows; the pair design's claim is the replace-one ε "
        "of the same run (dpverify's PLD), the inclusion design's the library's add/remove ε.",
        "",
    ] + _table(columns, rows)


def profiles(args: argparse.Namespace) -> list[str]:
    """Both tests' ε_L of correct implementations (``--implementations``) at claimed ε ∈ {1, 2, 4, 8, ∞} for
    every profile, beside what a perfect attacker reaches at the same m under the same verdict rule."""
    import numpy as np

    from curves import perfect_attacker

    rows = []
    for profile in args.profiles:
        config = _profile(args, profile)
        for epsilon in args.epsilons:
            ceiling = perfect_attacker(
                epsilon, config.audit_size, runs=config.pooled_runs, seeds=args.ceiling_seeds, rng=np.random.default_rng(0)
            )
            for name in args.implementations:
                results = [_audit(args, name, seed=s, profile=profile, epsilon=epsilon) for s in range(args.seeds)]
                _add_row(rows, name, profile, f"{config.pooled_runs} × {config.audit_size // config.pooled_runs}", epsilon,
                         _median(r.claimed_epsilon for r in results), _median(r.epsilon_lower_bound for r in results),
                         ceiling[0], _median(r.curve_epsilon_lower_bound for r in results) if math.isfinite(epsilon) else "",
                         ceiling[1] if math.isfinite(epsilon) else "", results[0].optimal_epsilon,
                         sum(r.verdict == "violation" for r in results), _median(r.seconds for r in results))
    columns = ("implementation", "profile", "runs × canaries", "target ε", "claimed ε", "median ε_L",
               "perfect attacker ε_L", "median curve-test ε", "perfect attacker curve ε", "ε_O", "violations", "s / audit")
    return _header("Power of every profile: both tests beside the perfect attacker", args) + [
        f"Correct implementations, {args.seeds} seed(s) per row. The perfect attacker "
        "(benchmarks/curves.py) scores each canary by the exact likelihood ratio of "
        "the μ-GDP mechanism whose ε at δ = 1e-5 is the target, at the same m, the same guess grid and the "
        f"same 95 % split between the two tests ({args.ceiling_seeds} simulated audits, median). A library "
        "whose accountant overstates ε (Opacus' RDP) calibrates runs a little more private than the target: "
        "the ceiling is the attainable for a mechanism exactly at the target.",
        "",
    ] + _table(columns, rows)


def separation(args: argparse.Namespace) -> list[str]:
    """How much of the claimed per-canary signal the profile's canaries reach in each implementation: at
    q = 1 the claimed run is exactly μ-GDP (μ = √steps/σ), so the members' mean score minus the
    non-members', in units of the non-members' spread, is μ for a perfect attacker."""
    rows = []
    steps = profile_config(args.profile).hyperparameters.steps
    for name in args.implementations:
        for mu in (0.5, 1.0, 2.0):
            results = _seeded(args, name, noise_multiplier=math.sqrt(steps) / mu)
            ratios = separation_over_mu(results, mu)
            _add_row(rows, name, mu, min(ratios), _median(ratios), max(ratios), _median(r.seconds for r in results))
    columns = ("implementation", "claimed μ", "min separation / μ", "median", "max", "s / audit")
    return _header("Dirac canaries reach the claimed mechanism", args) + [
        f"{args.seeds} seed(s) per row, σ = √steps/μ given to each implementation (full batch, so the claimed run "
        "is exactly μ-GDP). Separation: (mean member score − mean non-member score) / the non-members' "
        "standard deviation; 1 means the black-box scores carry the whole claimed signal.",
        "",
    ] + _table(columns, rows)


def pooling(args: argparse.Namespace) -> list[str]:
    """Seconds and ε_L of one audit of m = 10⁴ Dirac canaries trained as one run or pooled over 4 runs: a
    run's cost grows with m² (its dimension is m), so pooling buys the same canaries for less time."""
    rows = []
    for name in args.implementations:
        for runs in (1, 4):
            result = _audit(args, name, seed=0, epsilon=2.0, m=10_000, pooled_runs=runs)
            _add_row(rows, name, f"{runs} × {10_000 // runs}", result.verdict, result.epsilon_lower_bound,
                     result.curve_epsilon_lower_bound, result.seconds)
    columns = ("implementation", "runs × canaries", "verdict", "ε_L", "curve-test ε", "s / audit")
    return _header("Pooling runs: the same canaries for less time", args) + [
        "One audit per row at target ε = 2, seed 0, the profile's setting otherwise.", "",
    ] + _table(columns, rows)


def detection(args: argparse.Namespace) -> list[str]:
    """Fraction of seeds on which each buggy variant is caught, per claimed ε."""
    rows = []
    variants = [i for i in registered_implementations() if i.info.expected == "violation" and i.unavailable_reason() is None]
    for implementation in variants:
        if args.only and not any(p in implementation.info.name for p in args.only):
            continue
        for epsilon in [e for e in args.epsilons if math.isfinite(e)]:
            results = _seeded(args, implementation.info.name, epsilon=epsilon)
            caught = sum(r.verdict == "violation" for r in results)
            rows.append((implementation.info.name, implementation.info.bug, implementation.info.detectability, epsilon,
                         f"{caught}/{len(results)}", _median(r.epsilon_lower_bound for r in results),
                         _median(r.seconds for r in results)))
    columns = ("variant", "bug class", "expected", "claimed ε", "caught", "median ε_L", "s / audit")
    return _header("Bug detection: buggy variants caught", args) + _table(columns, rows)


def noise_deficit(args: argparse.Namespace) -> list[str]:
    """Noise scaled by 1/k with the claim kept: the smallest k caught in ≥ 80 % of seeds, against the k*
    that the correct implementation's own audits (k = 1) state they would catch."""
    from dpverify.registry import register_implementation
    from dpverify_opacus import noise_scaled

    import numpy as np

    from curves import perfect_attacker

    config = _profile(args)
    rows = []
    for epsilon in [e for e in args.epsilons if math.isfinite(e)]:
        smallest, stated = None, None
        for k in [1.0, *args.deficits]:
            name = register_implementation(noise_scaled(k), replace=True).info.name
            results = _seeded(args, name, epsilon=epsilon)
            rate = sum(r.verdict == "violation" for r in results) / len(results)
            by_curve = sum(bool(r.curve_refuted) for r in results) / len(results)
            ceiling = perfect_attacker(
                epsilon, config.audit_size, runs=config.pooled_runs, seeds=args.ceiling_seeds,
                rng=np.random.default_rng(0), deficit=k,
            )[2]  # fmt: skip
            if k == 1.0:
                stated = _median(r.power.smallest_deficit for r in results)
            elif smallest is None and rate >= 0.8:
                smallest = k
            _add_row(rows, epsilon, k, f"{rate:.0%}", f"{by_curve:.0%}", f"{ceiling:.0%}",
                     _median(r.epsilon_lower_bound for r in results), _median(r.curve_epsilon_lower_bound for r in results),
                     _median(r.curve_claimed_epsilon for r in results), _median(r.power.signal_fraction for r in results))  # fmt: skip
            if rate == 1.0:
                break  # larger deficits are caught too: the noise only shrinks
        rows.append((epsilon, "smallest k caught ≥ 80 %", smallest or f"none ≤ {max(args.deficits):g}", "", "", "", "", "", ""))
        rows.append((epsilon, "k* stated by the k = 1 audits (median)", stated, "", "", "", "", "", ""))
    columns = ("claimed ε", "k", "caught", "caught by the curve test", "perfect attacker caught", "median ε_L (ε, δ) test",
               "median curve-test ε", "claimed curve's ε", "median ρ")
    return _header("Smallest noise deficit caught, and the k* the audits state", args) + [
        f"opacus-ghost with its noise divided by k and Opacus' claim for σ kept, {args.seeds} seed(s) per row; a "
        "verdict is a violation when either test refutes the claim (the curve test against the claimed "
        "mechanism's exact GDP curve at q = 1, per run and combined over the pooled runs, the (ε, δ) test "
        "against the stated ε), at the audit's 95 % split between them. Rows stop at the first k caught on "
        f"every seed. Perfect attacker: {args.ceiling_seeds} simulated audits of the same m and runs whose "
        "scores are the exact likelihood ratio of the μ-GDP mechanism at the target ε with its noise divided by "
        "k (benchmarks/curves.py), under the same verdict rule; Opacus' accountant overstates ε a little, so "
        "its runs are a little more private than the target and their ceiling a little lower. k = 1 is the "
        "unmodified implementation: its audits state k*, the smallest deficit they predict to catch with "
        "probability ≥ 0.8 from the signal ρ their canaries carried (dpverify.stats.power); the measured "
        "smallest k caught ≥ 80 % should be at or below it.",
        "",
    ] + _table(columns, rows)


def false_alarms(args: argparse.Namespace) -> list[str]:
    """Many audits of correct implementations at 95 %: violations (and those from the curve test) with the
    Clopper–Pearson interval of the rate, over seeds × claimed ε ∈ {1, 2, 4, 8} × both canary designs, and
    Hypothesis-drawn configurations."""
    groups, first = [], args.first_seed if args.first_seed is not None else 1000
    for name in args.implementations:
        for design in ("inclusion", "pair"):
            settings = [dict(epsilon=e, design=design) for e in (1.0, 2.0, 4.0, 8.0)]
            groups.append((f"{name}, {design}", [_audit(args, name, seed=first + s, **kw) for s in range(args.seeds) for kw in settings]))
    configs = _hypothesis_configs(args.hypothesis_examples)
    for name in args.implementations if configs else ():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = [run_audit(_implementation(name), dataclasses.replace(c, seed=2000 + i, device=args.device))
                       for i, c in enumerate(configs)]
        groups.append((f"{name}, Hypothesis configurations", results))
    rows, total_violations, total = [], 0, 0
    for label, results in groups:
        violations = sum(r.verdict == "violation" for r in results)
        total_violations, total = total_violations + violations, total + len(results)
        _add_row(rows, label, len(results), violations, sum(bool(r.curve_refuted) for r in results),
                 sum(r.verdict == "error" for r in results), _median(r.epsilon_lower_bound for r in results),
                 _median(r.curve_epsilon_lower_bound for r in results))
    interval = stats.binomtest(total_violations, total).proportion_ci(0.95, method="exact")
    rows.append(("all", total, total_violations, "", "", f"95 % CI of the rate [{interval.low:.3f}, {interval.high:.3f}]; level 0.05", ""))
    return _header("False alarms: audits of correct implementations", args) + [
        f"{args.seeds} seed(s) × claimed ε ∈ {{1, 2, 4, 8}} per design and implementation, and "
        f"{args.hypothesis_examples} Hypothesis-drawn configurations per implementation (derandomized; C drawn "
        "over 0.01–100). Each audit at 95 %, split between the (ε, δ) test and the curve test.",
        "",
    ] + _table(
        ("implementation", "audits", "violations", "by the curve test", "errors", "median ε_L", "median curve-test ε"), rows
    )


def _hypothesis_configs(count: int) -> list[AuditConfig]:
    """``count`` audit configurations drawn by :func:`dpverify.strategies.audit_configs`, derandomized."""
    if count < 1:
        return []
    from hypothesis import given, settings

    from dpverify.strategies import audit_configs

    drawn: list[AuditConfig] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None)
    @given(audit_configs())
    def collect(config: AuditConfig) -> None:
        drawn.append(config)

    collect()
    return drawn[:count]


def speed(args: argparse.Namespace) -> list[str]:
    """Seconds per audit, DP overhead against non-private SGD of the same run, the auditor's own share
    (canaries, scoring, bound), and growth with m and h."""
    rows = []

    if args.warm_up:  # load the libraries and, on a GPU, create the context and kernels untimed
        _audit(args, "opacus-ghost", seed=0, epsilon=2.0, profile=args.profile)

    def timed(name: str, setting: str, profile: str | None = None, **overrides) -> AuditResult:
        result = _audit(args, name, seed=0, epsilon=2.0, profile=profile, **overrides)
        _add_row(rows, name, setting, result.device, result.seconds, result.auditor_seconds,
                 f"{result.auditor_seconds / result.seconds:.1%}", result.verdict)
        return result

    for name in args.implementations:
        timed(name, args.profile)
    overhead = []
    for profile in args.overhead_profiles:
        private = timed("opacus-ghost", profile, profile=profile)
        plain = timed(NonPrivateSGD.info.name, profile, profile=profile)
        overhead.append((profile, private.seconds, plain.seconds, f"{private.seconds / plain.seconds:.1f}×"))
    for label, overrides in [(f"m = d = {m}", dict(m=m, dimension=m)) for m in args.m] + [
        (f"h = {h}", dict(hidden_width=h)) for h in args.hidden_widths
    ]:
        timed("opacus-ghost", f"{args.profile}, {label}", **overrides)
    lines = _header("Speed of one audit", args) + [
        "One run per row at claimed ε = 2" + (" after one untimed warm-up audit" if args.warm_up else "")
        + "; seconds are the whole audit (canaries, training, queries, scoring, bound)."
        + (" On the shared 2-core CPU they vary by ±30 % between runs." if resolve_device(args.device) == "cpu" else ""),
        "",
    ] + _table(("implementation", "setting", "device", "s / audit", "auditor s", "auditor share", "verdict"), rows)
    if overhead:
        lines += ["", "DP overhead: opacus-ghost against non-private SGD of the same model, batches, steps and "
                  "learning rate (whole audits, auditor included).", ""]
        lines += _table(("profile", "opacus-ghost s", "non-private s", "overhead"), overhead)
    return lines


#: Settings swept by ``sweep``: (label, profile, overrides). What the auditor controls of the MLP audit, one
#: knob at a time from the mlp profile, then the paper's scale where a GPU is lent.
SWEEPS = {
    "cpu": [
        ("mlp", "mlp", {}),
        ("mlp, pair design", "mlp", dict(design="pair")),
        ("mlp, gaussian", "mlp", dict(mode="gaussian")),
        ("mlp, lr 2", "mlp", dict(learning_rate=2.0)),
        ("mlp, lr 10", "mlp", dict(learning_rate=10.0)),
        ("mlp, 50 epochs", "mlp", dict(epochs=50)),
        ("mlp, q = 0.1, lr 0.5", "mlp", dict(sampling_rate=0.1, learning_rate=0.5)),
        ("mlp, h = 4000", "mlp", dict(hidden_width=4000)),
        ("mlp, C = 1000", "mlp", dict(num_classes=1000)),
        ("mlp, feature scale 3", "mlp", dict(feature_scale=3.0)),
        ("mlp, feature scale 30", "mlp", dict(feature_scale=30.0)),
    ],
    "cuda": [
        ("mlp", "mlp", {}),
        ("mlp, h = 10⁴", "mlp", dict(hidden_width=10_000)),
        ("mlp, h = 10⁵", "mlp", dict(hidden_width=100_000)),
        ("mlp, h = 10⁵, C = 1000", "mlp", dict(hidden_width=100_000, num_classes=1000)),
        ("mlp, m = 10⁴, d = 1000, h = 10⁵, C = 1000", "mlp", dict(m=10_000, hidden_width=100_000, num_classes=1000)),
        ("paper", "paper", {}),
        ("paper, pair design, gaussian", "paper", dict(design="pair", mode="gaussian")),
    ],
}


def sweep(args: argparse.Namespace) -> list[str]:
    """ε_L of opacus-ghost at target ε = 8 and without noise, one knob of the profile at a time."""
    rows = []
    for label, profile, overrides in SWEEPS[args.grid]:
        if args.only and not any(p in label for p in args.only):
            continue
        for epsilon in (8.0, float("inf")):
            results = _seeded(args, "opacus-ghost", profile=profile, epsilon=epsilon, **overrides)
            _add_row(rows, label, epsilon, _median(r.claimed_epsilon for r in results), _median(r.epsilon_lower_bound for r in results),
                     results[0].optimal_epsilon, _median(r.seconds for r in results))
    return _header("Sweep: what the auditor controls, against ε_L", args) + [
        f"opacus-ghost, {args.seeds} seed(s) per row. Goals: quick ≤ 30 s on the 2-core CPU with ε_L(8) ≥ 3.06 "
        "and ε_L(∞) ≥ 0.95·ε_O; standard ≤ 5 min with ε_L(8) ≥ 3.78.",
        "",
    ] + _table(("setting", "target ε", "claimed ε in the design's relation", "median ε_L", "ε_O", "s / audit"), rows)


#: Guess grids compared by ``guess-grid``: fractions of m, each declared before any score is seen.
GUESS_GRIDS = {
    "default": (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
    "+0.8, 0.9": (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 1.0),
    "top-heavy": (0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 1.0),
    "coarse": (0.02, 0.1, 0.5, 0.9, 1.0),
}


def guess_grid(args: argparse.Namespace) -> list[str]:
    """ε_L and detection under other declared guess grids (and one-sided guessing), same seeds and runs."""
    cases = [("opacus-ghost", e) for e in (1.0, 2.0, 8.0, float("inf"))] + [
        (name, e) for name in ("opacus-no-clipping", "opacus-batch-clipping", "opacus-unnoised-layer") for e in (2.0, 4.0)
    ]
    grids = [(label, fractions, "two") for label, fractions in GUESS_GRIDS.items()] + [("default, one-sided", GUESS_GRIDS["default"], "one")]
    rows = []
    for name, epsilon in cases:
        for label, fractions, sides in grids:
            results = _seeded(args, name, epsilon=epsilon, guesses=fractions, sides=sides)
            caught = sum(r.verdict == "violation" for r in results)
            _add_row(rows, name, epsilon, label, _median(r.epsilon_lower_bound for r in results), f"{caught}/{len(results)}",
                     results[0].optimal_epsilon)
    return _header("Guess grids: ε_L and detection under other declared grids", args) + [
        f"{args.seeds} seed(s) per row; each row retrains with the same seeds, so rows of one case differ only in "
        "the grid. The Bonferroni correction grows with the grid's size; ε_O is the grid's ceiling.",
        "",
    ] + _table(("implementation", "claimed ε", "grid", "median ε_L", "violations", "ε_O"), rows)


def _median(values: Iterable[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "benchmark", choices=("power", "profiles", "separation", "pooling", "detection", "noise-deficit", "false-alarms", "speed", "sweep", "guess-grid")
    )
    parser.add_argument("--profile", choices=PROFILE_NAMES, default="quick")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--output", help="file name in the results directory, without .md (default: the benchmark's name)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--pooled-runs", type=int, default=None,
                        help="R runs of the profile's own per-run size instead of its number of runs")
    parser.add_argument("--m", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--dimension", type=int, default=None, help="power: feature dimension (default: d = m)")
    parser.add_argument("--designs", nargs="+", choices=("inclusion", "pair"), default=["inclusion", "pair"])
    parser.add_argument("--modes", nargs="+", choices=("orthogonal", "gaussian", "dirac"), default=["orthogonal", "gaussian"])
    parser.add_argument("--scores", type=int, default=3, help="power: the first N scores of each design")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--hidden-widths", type=int, nargs="+", default=[500, 2000, 4000])
    parser.add_argument("--first-seed", type=int, default=None,
                        help="the first audit seed, the others follow it (default 0; false-alarms 1000)")
    parser.add_argument("--deficits", type=float, nargs="+", default=[1.25, 1.5, 2.0, 3.0, 5.0, 10.0],
                        help="noise-deficit: the factors k (noise / k) to try, in increasing order")
    parser.add_argument("--profiles", nargs="+", choices=PROFILE_NAMES, default=["quick", "standard", "mlp"])
    parser.add_argument("--ceiling-seeds", type=int, default=10, help="profiles, noise-deficit: simulated perfect-attacker audits per row")
    parser.add_argument("--overhead-profiles", nargs="*", choices=PROFILE_NAMES, default=["quick", "standard"])
    parser.add_argument("--hypothesis-examples", type=int, default=0,
                        help="false-alarms: also this many Hypothesis-drawn configurations per implementation")
    parser.add_argument("--warm-up", action="store_true", help="speed: one untimed audit first")
    parser.add_argument("--grid", choices=tuple(SWEEPS), default="cpu", help="sweep: which settings")
    parser.add_argument("--only", nargs="*", default=[], help="variants (sweep: settings) whose name contains one of these")
    parser.add_argument(
        "--implementations", nargs="+", default=["opacus-ghost", "reference-dpsgd", "opacus-hooks", "tf-privacy-keras"]
    )
    args = parser.parse_args(argv)
    args.command = "python benchmarks/audits.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    name = args.benchmark.replace("-", "_")
    lines = globals()[name](args)
    lines += ["", f"Total wall time: {time.perf_counter() - started:.0f} s."]
    _write(args.output or args.benchmark, lines, args)


if __name__ == "__main__":
    main()
