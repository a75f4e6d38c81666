"""Language-model audit benchmarks of the Dirac token design (the LM audit's quick default).

    .venvs/torch/bin/python benchmarks/language_dirac.py separation    # the claimed μ the canaries reach
    .venvs/torch/bin/python benchmarks/language_dirac.py reach         # both tests' ε_L beside a perfect attacker
    .venvs/torch/bin/python benchmarks/language_dirac.py detection     # LM variants and a 2x noise deficit caught
    .venvs/torch/bin/python benchmarks/language_dirac.py false-alarms  # many audits of the correct LM paths
    .venvs/torch/bin/python benchmarks/language_dirac.py embedding-leak  # is the un-noised embedding a real leak?

Each writes ``benchmarks/results/language-<name>.md`` (``-cuda`` on a GPU) stating the device, the date and
the command. Numbers here are measurements, never test assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

from audits import _add_row, _median, _table, _write, device_line, separation_over_mu  # benchmarks/ is the script's directory
from curves import perfect_attacker

from dpverify.audits.language import REPEATED_TOKEN_BASELINE, LanguageAuditConfig, run_language_audit
from dpverify.audits.planning import resolve_device
from dpverify.contract import Implementation
from dpverify.results import AuditResult
from dpverify_opacus import language_implementations, noise_scaled


def _implementation(name: str) -> Implementation:
    """A registered Opacus LM implementation, or ``opacus-lm-noise-div-<k>`` (Opacus' noise divided by k)."""
    prefix = "opacus-lm-noise-div-"
    if name.startswith(prefix):
        return noise_scaled(float(name[len(prefix) :]), task="language")
    return next(i for i in language_implementations() if i.info.name == name)


def _audit(args: argparse.Namespace, name: str, *, seed: int, base: LanguageAuditConfig | None = None, **overrides) -> AuditResult:
    config = (base or LanguageAuditConfig()).with_overrides(seed=seed, device=args.device, **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_language_audit(_implementation(name), config)
    if result.error:
        raise RuntimeError(f"{name}, seed {seed}: {result.error}")
    return result


def _seeded(args: argparse.Namespace, name: str, **overrides) -> list[AuditResult]:
    return [_audit(args, name, seed=args.first_seed + s, **overrides) for s in range(args.seeds)]


def describe(config: LanguageAuditConfig) -> str:
    """One line of what a language audit designates, for a results file's header."""
    c, a, h = config.canaries, config.architecture, config.hyperparameters
    return (
        f"m = {c.m} {c.mode} token canaries of {c.prefix_length} + {c.suffix_length} tokens in {config.pooled_runs} "
        f"pooled run(s), vocabulary {c.base_vocab_size} + {c.new_tokens} a run; transformer {a.layers} block(s), "
        f"width {a.width}, {a.heads} heads, init {a.init}; q = {h.sampling_rate:g}, {h.steps} steps, "
        f"lr {h.learning_rate:g}, clip {h.max_grad_norm:g}; {config.design} design, δ = {h.delta:g}, "
        f"{config.confidence:.0%} confidence per audit, guess grid of {len(config.guess_rule.counts(c.m))} counts "
        "with Bonferroni"
    )


def _header(title: str, args: argparse.Namespace) -> list[str]:
    return [
        f"# {title}",
        "",
        f"- device: {device_line(args.device)}",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `{args.command}`",
        f"- configuration: LanguageAuditConfig() (the LM quick default) unless a row says otherwise: "
        f"{describe(LanguageAuditConfig())}",
        "",
    ]


def separation(args: argparse.Namespace) -> list[str]:
    """Members' separation over the claimed μ at q = 1 (σ = √steps/μ), per implementation, with UniAud's
    repeated-token canaries beside them."""
    rows = []
    settings = [(name, "dirac (default)", None) for name in args.implementations]
    settings.append(("opacus-lm", "repeated-token baseline", REPEATED_TOKEN_BASELINE))
    for name, canaries, base in settings:
        steps = (base or LanguageAuditConfig()).hyperparameters.steps
        for mu in (0.5, 1.0, 2.0):
            results = [_audit(args, name, seed=args.first_seed + s, base=base, noise_multiplier=math.sqrt(steps) / mu) for s in range(args.seeds)]
            ratios = separation_over_mu(results, mu)
            _add_row(rows, name, canaries, mu, min(ratios), _median(ratios), max(ratios), _median(r.seconds for r in results))
    columns = ("implementation", "canaries", "claimed μ", "min separation / μ", "median", "max", "s / audit")
    return _header("Dirac token canaries reach the claimed mechanism", args) + [
        f"{args.seeds} seed(s) per row from seed {args.first_seed}, σ = √steps/μ given to each implementation (full "
        "batch, so the claimed run is exactly μ-GDP). Separation: (mean member score − mean non-member score) / "
        "the non-members' standard deviation; 1 means the black-box scores carry the whole claimed signal. The "
        "baseline row is REPEATED_TOKEN_BASELINE (UniAud's repeated new tokens, one run of 1000, random init, "
        "30 steps).",
        "",
    ] + _table(columns, rows)


def reach(args: argparse.Namespace) -> list[str]:
    """Both tests' median ε_L of the correct implementations at claimed ε 2, 4, 8, over a perfect attacker's
    at the same m and runs under the same verdict rule."""
    config = LanguageAuditConfig()
    rows = []
    for epsilon in args.epsilons:
        ceiling = perfect_attacker(
            epsilon, config.audit_size, runs=config.pooled_runs, seeds=args.ceiling_seeds, rng=np.random.default_rng(0)
        )
        for name in args.implementations:
            results = _seeded(args, name, epsilon=epsilon)
            steinke, curve = _median(r.epsilon_lower_bound for r in results), _median(r.curve_epsilon_lower_bound for r in results)
            _add_row(rows, name, epsilon, _median(r.claimed_epsilon for r in results), steinke, ceiling[0],
                     f"{steinke / ceiling[0]:.0%}", curve, ceiling[1], f"{curve / ceiling[1]:.0%}",
                     sum(r.verdict == "violation" for r in results), _median(r.seconds for r in results))  # fmt: skip
    columns = ("implementation", "target ε", "claimed ε", "median ε_L", "perfect attacker ε_L", "reach",
               "median curve-test ε", "perfect attacker curve ε", "reach (curve)", "violations", "s / audit")  # fmt: skip
    return _header("Reach of the LM audit: both tests beside a perfect attacker", args) + [
        f"{args.seeds} seed(s) per row from seed {args.first_seed}. The perfect attacker (benchmarks/curves.py) "
        "scores each canary by the exact likelihood ratio of the μ-GDP mechanism whose ε at "
        "δ = 1e-5 is the target, at the same m, runs, guess grid and 95 % split between the two tests "
        f"({args.ceiling_seeds} simulated audits, median). Opacus calibrates σ with its RDP accountant, which "
        "overstates ε, so its runs are a little more private than the target and 100 % is out of reach.",
        "",
    ] + _table(columns, rows)


def detection(args: argparse.Namespace) -> list[str]:
    """Seeds on which each LM variant (and Opacus with its noise halved) is caught, per claimed ε."""
    variants = [i.info.name for i in language_implementations() if i.info.expected == "violation"]
    rows = []
    for name in [*variants, "opacus-lm-noise-div-2"]:
        info = _implementation(name).info
        for epsilon in args.epsilons:
            results = _seeded(args, name, epsilon=epsilon)
            _add_row(rows, name, info.bug or "", info.detectability, epsilon,
                     f"{sum(r.verdict == 'violation' for r in results)}/{len(results)}",
                     f"{sum(bool(r.curve_refuted) for r in results)}/{len(results)}",
                     _median(r.epsilon_lower_bound for r in results), _median(r.curve_epsilon_lower_bound for r in results),
                     _median(r.seconds for r in results))  # fmt: skip
    columns = ("variant", "bug class", "expected", "claimed ε", "caught", "by the curve test", "median ε_L",
               "median curve-test ε", "s / audit")
    return _header("LM variants caught", args) + [
        f"{args.seeds} seed(s) per row from seed {args.first_seed}; opacus-lm-noise-div-2 is Opacus (ghost) with its "
        "noise divided by 2 and its claim for σ kept (not registered).",
        "",
    ] + _table(columns, rows)


def false_alarms(args: argparse.Namespace) -> list[str]:
    """Audits of the correct LM implementations: violations with the Clopper–Pearson interval of the rate."""
    rows, total_violations, total = [], 0, 0
    for name in args.implementations:
        results = [_audit(args, name, seed=args.first_seed + s, epsilon=e) for s in range(args.seeds) for e in args.epsilons]
        violations = sum(r.verdict == "violation" for r in results)
        total_violations, total = total_violations + violations, total + len(results)
        _add_row(rows, name, len(results), violations, sum(bool(r.curve_refuted) for r in results),
                 _median(r.epsilon_lower_bound for r in results), _median(r.seconds for r in results))  # fmt: skip
    interval = stats.binomtest(total_violations, total).proportion_ci(0.95, method="exact")
    rows.append(("all", total, total_violations, "", f"95 % CI of the rate [{interval.low:.3f}, {interval.high:.3f}]; level 0.05", ""))
    return _header("False alarms of the correct LM implementations", args) + [
        f"{args.seeds} seed(s) from seed {args.first_seed} × claimed ε ∈ {{{', '.join(f'{e:g}' for e in args.epsilons)}}} "
        "per implementation, each audit at 95 % split between the (ε, δ) test and the curve test.",
        "",
    ] + _table(("implementation", "audits", "violations", "by the curve test", "median ε_L", "s / audit"), rows)


def embedding_leak(args: argparse.Namespace) -> list[str]:
    """Whether the un-noised embedding is a real leak in the designated transformer: one run of the
    default's canaries, scored by whether the model answers a canary's prefix exactly as it answers a base
    token no sequence uses (a prefix row that never moved) — a black-box score built for this bug only."""
    from dpverify.audits.language import _one_run

    config = LanguageAuditConfig().with_overrides(device=args.device)
    rows = []
    for name in ("opacus-lm", "opacus-lm-unnoised-embedding"):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            request, _ = _one_run(dataclasses.replace(config, seed=seed), 0, device=resolve_device(args.device), step_progress=None)
            trained = _implementation(name).train(request)
            base_token = 0  # never in a sequence: its embedding row moves only by noise
            m = config.canaries_per_run[0]
            prefixes = config.canaries.base_vocab_size + np.arange(m)
            suffixes = prefixes + m
            asked = np.stack([prefixes, suffixes], axis=1)
            reference = np.stack([np.full(m, base_token), suffixes], axis=1)
            same = trained.token_log_probs(asked)[:, 0] == trained.token_log_probs(reference)[:, 0]
            member = np.isin(prefixes, request.sequences[:, 0])
            _add_row(rows, name, seed, f"{same[member].mean():.0%}", f"{same[~member].mean():.0%}")
    return _header("Is the un-noised embedding a real leak in the designated transformer?", args) + [
        "One run of 1000 Dirac token canaries (the default's first run, claimed ε = 2) per row. A canary's answer "
        "is 'unchanged' when log p(s_i | p_i) equals, to the last bit, log p(s_i | b) for a base token b that no "
        "sequence contains. With Opacus' noise every embedding row moves; without it on the embedding, a "
        "non-member's prefix row never moves, a member's does.",
        "",
    ] + _table(("implementation", "seed", "members unchanged", "non-members unchanged"), rows)


BENCHMARKS = {
    "separation": separation,
    "reach": reach,
    "detection": detection,
    "false-alarms": false_alarms,
    "embedding-leak": embedding_leak,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=tuple(BENCHMARKS))
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--results-dir", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    parser.add_argument("--implementations", nargs="+", default=["opacus-lm", "opacus-lm-hooks"])
    parser.add_argument("--ceiling-seeds", type=int, default=30)
    parser.add_argument("--output", help="result file name without .md (default language-<benchmark>)")
    args = parser.parse_args(argv)
    args.command = "python benchmarks/language_dirac.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    lines = BENCHMARKS[args.benchmark](args) + ["", f"Total wall time: {time.perf_counter() - started:.0f} s."]
    _write(args.output or f"language-{args.benchmark}", lines, args)


if __name__ == "__main__":
    main()
