"""Two-world (many-run) audits: the Opacus #571 finding, false alarms, power and speed.

    python benchmarks/two_world.py finding       # the dataset-size world on Opacus and the reference
    python benchmarks/two_world.py false-alarms  # many audits of correct implementations
    python benchmarks/two_world.py power         # ε_L against the claim of a correct Gaussian mechanism
    python benchmarks/two_world.py speed         # seconds per 1000 runs
    python benchmarks/two_world.py executor-speed  # runs per second in-process, in a pool and on Ray
    python benchmarks/two_world.py catalog       # docs/bugs.md classes 6, 7, 9, 11, 12 against the correct path
    python benchmarks/two_world.py shuffle-gap   # the Poisson claim against a shuffled run's final sum
    python benchmarks/two_world.py noise-deficit # Opacus with its noise divided by k, where one run cannot tell
    python benchmarks/two_world.py scale --runs 100000  # 10⁵ runs per world by executor, power, row 9

Each writes a table to ``benchmarks/results/two-world*.md``. The reference and Opacus memoise their
accountants' ε per distinct (σ, q, steps, δ) in the process (pure functions that cost more than a small
model's training), so only a run's first claim is computed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import math
import os
import platform
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from scipy import stats

from dpverify.audits.two_world import TwoWorldResult, run_two_world_audit
from dpverify.canaries.worlds import (
    TwoWorlds,
    dataset_size_worlds,
    microbatch_worlds,
    realised_batch_worlds,
    worst_case_record_worlds,
)
from dpverify.contract import DPHyperparameters, MLPArchitecture
from dpverify.registry import get_implementation
from dpverify.stats.bounds import _gdp_epsilon
from dpverify.stats.two_world import two_world_bound

RESULTS = Path(__file__).parent / "results"
DELTA = 1e-5


def implementation(name: str):
    """A registered implementation, or ``opacus-dataloader-b<B>``: Opacus on a user's constant batch size."""
    if name.startswith("opacus-dataloader-b"):
        from dpverify_opacus import dataloader_implementation

        return dataloader_implementation(int(name.rsplit("-b", 1)[1]))
    return get_implementation(name)


def header(title: str, args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        f"# {title}",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores shared with other sessions, no GPU; load average {_load()} at the start); "
        f"{_libraries()}",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}`",
        _threads(),
        *extra,
        "",
    ]


def _libraries() -> str:
    """The audited libraries' versions here: torch and Opacus, or, in the JAX environment, JAX and JAX-Privacy."""
    try:
        import torch
    except ImportError:
        return f"jax {_version('jax')}, jax-privacy {_version('jax-privacy')}"
    return f"torch {torch.__version__}, opacus {_version('opacus')}"


def _threads() -> str:
    if importlib.util.find_spec("torch") is None:
        return f"- threads: XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')!r}"
    return "- torch threads: 1 (tiny models; the box is shared)"


def _version(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)


def _range(values) -> str:
    return f"{min(values):.4g} – {max(values):.4g}"


def verdict_cells(info, kind: str, results) -> str:
    """A gate benchmark row's first cells: the implementation, what it is expected to do, the audit's
    ``kind`` (world or layer), the violations and the outcomes as expected over the seeds' ``results``, and
    the (ε, δ) test's ε_L (min – max)."""
    from dpverify.session import outcome_mark

    expected = {"verdict": None, "expected": info.expected, "detectability": info.detectability}
    marks = [outcome_mark({**expected, "verdict": r.verdict}) for r in results]
    return (
        f"| {info.name} | {info.expected}{f' ({info.detectability})' if info.detectability else ''} | {kind} | "
        f"{sum(r.verdict == 'violation' for r in results)} / {len(results)} | "
        f"{sum(m != '!' for m in marks)} / {len(results)} | {_range([r.epsilon_lower_bound for r in results])} | "
    )


def _row(result: TwoWorldResult, note: str) -> str:
    b = result.bound
    claim_mu = "–" if result.claimed_mu is None else f"{result.claimed_mu:.3f}"
    if b is None:
        return f"| {result.implementation} | {result.world} | {note} | – | – | – | – | {result.verdict}: {result.error} | |"
    return (
        f"| {result.implementation} | {result.world} | {note} | {result.claimed_epsilon_d:.3f} / "
        f"{result.claimed_epsilon_dprime:.3f} | {b.epsilon_lower_bound:.3f} (ceiling {b.epsilon_ceiling:.3f}) | "
        f"{claim_mu} / {b.gdp_mu_lower_bound:.3f} | {_range(result.scores_d)} vs {_range(result.scores_dprime)} | "
        f"**{result.verdict}** | {result.seconds_per_run:.3f} |"
    )


TABLE = [
    "| implementation | world | setting | claimed ε, D / D′ | ε_L | claimed μ / μ_L | scores D vs D′ | verdict | s/run |",
    "|---|---|---|---|---|---|---|---|---|",
]


def finding(args: argparse.Namespace) -> None:
    """The dataset-size world (D: N copies of a point, D′: N + 1) against Opacus as users call it."""
    hp = DPHyperparameters(noise_multiplier=args.sigma, sampling_rate=1.0, epochs=1, learning_rate=1.0, delta=DELTA)
    arch = MLPArchitecture(hidden_width=args.hidden)
    cases = [
        ("opacus-dataloader", 2, "B = round(q·N): 2 vs 3"),
        ("opacus-dataloader-b2", 2, "B = 2 (Opacus #571's setting)"),
        ("opacus-dataloader-b64", 64, "B = 64, N = B vs B + 1"),
        ("opacus-ghost", 2, "designated normaliser q·|D|"),
        ("opacus-hooks", 2, "designated normaliser q·|D|"),
        ("reference-dpsgd", 2, "designated normaliser q·|D|"),
        ("tf-privacy-keras", 2, "realised batch size (TF-Privacy's own)"),
    ]
    lines = header(
        "Two-world audit: does the dataset's size leak? (Opacus #571, #819)",
        args,
        [
            f"- hyperparameters: σ = {args.sigma}, requested q = 1, 1 epoch, lr 1, C = 1, δ = {DELTA}; MLP 1 → "
            f"{args.hidden} → {args.classes}; {args.runs} runs per world, 95 % confidence (split threshold, level "
            "shared by the (ε, δ) and the GDP tests), seed 0",
            "- world: D = N copies of one point (label 0), D′ = N + 1 copies (add/remove); score: standard deviation "
            "of the log-probabilities over the classes at that point",
        ],
    )
    lines += TABLE
    for name, records, note in cases:
        world = dataset_size_worlds(records=records, num_classes=args.classes)
        result = run_two_world_audit(
            implementation(name), world=world, runs=args.runs, hyperparameters=hp, architecture=arch,
            confidence=0.95, seed=0, progress=lambda m: print(f"  {name}: {m}", flush=True),
        )  # fmt: skip
        lines.append(_row(result, note))
        print(lines[-1], flush=True)
    lines += [
        "",
        "What each run derives from its dataset (Opacus 1.6.0 `make_private`: q = 1/len(loader), "
        "expected_batch_size = int(len(dataset)·q); the user's loop runs len(loader) steps an epoch):",
        "",
        "- `opacus-dataloader` (B = round(q·N)): q = 1 and one step in both worlds, normaliser int(N·q) = 2 vs 3, "
        "so the noise on every output differs by 3/2;",
        "- `opacus-ghost`, `opacus-hooks` (a loader of 1/q batches) and `reference-dpsgd`: the audit designates the "
        "public normaliser q·|D| = 2 (`DPHyperparameters.expected_batch_size`) and they divide by it in both worlds;",
        "- `tf-privacy-keras`: TF-Privacy's optimizer divides by the realised batch size, which at q = 1 is N "
        "(2 vs 3); it has no setting for a designated normaliser;",
        "- `opacus-dataloader-b2`: D has q = 1, normaliser 2, one step; D′ has q = 1/2, normaliser int(3/2) = 1, "
        "two steps (Opacus #571's setting), and Opacus claims a different ε for D′;",
        "- `opacus-dataloader-b64`: D has q = 1, normaliser 64, one step; D′ has q = 1/2, normaliser 32, two steps.",
        "",
        "ε_L at its ceiling means no run of D scored on D′'s side of the threshold or back: the worlds never "
        "overlapped (the score ranges), so more runs would raise ε_L without limit.",
    ]
    _write(args.output or "two-world-finding.md", lines)


def false_alarms(args: argparse.Namespace) -> None:
    """Many two-world audits of correct implementations in a world where no known bug can act."""
    world = worst_case_record_worlds(records=1, relation="replace_one")
    hp = DPHyperparameters(noise_multiplier=args.sigma, sampling_rate=1.0, epochs=1, learning_rate=1.0, delta=DELTA)
    lines = header(
        "Two-world audit: false alarms on correct implementations",
        args,
        [
            f"- world: {world.name} (D = {{(x*, 0)}}, D′ = {{(x*, 1)}}, x* = 10·e₁ in d = 16, C = 2 classes; one "
            "record, so no normaliser reads a size that differs); score log p(1 | x*)",
            f"- hyperparameters: σ = {args.sigma}, q = 1, 1 step, lr 1, C = 1, δ = {DELTA}; MLP 16 → 16 → 2; "
            f"{args.runs} runs per world, 95 % confidence; audit seeds 0 … {args.audits - 1}",
            "- claim compared: replace-one ε of the claimed run (dpverify's PLD accountant) and the exact "
            "full-batch GDP μ = 2√steps/σ",
        ],
    )
    lines += ["| implementation | audits | violations | undecided | median ε_L | median μ_L | claimed ε / μ | 95 % CI of the violation rate |", "|---|---|---|---|---|---|---|---|"]
    total = 0
    for name in args.implementations:
        results = []
        for seed in range(args.audits):
            results.append(run_two_world_audit(
                implementation(name), world=world, runs=args.runs, hyperparameters=hp,
                architecture=MLPArchitecture(hidden_width=16), confidence=0.95, seed=seed,
            ))  # fmt: skip
        errors = [r for r in results if r.verdict == "error"]
        if errors:
            raise SystemExit(f"{name}: {errors[0].error}")
        violations = sum(r.verdict == "violation" for r in results)
        undecided = sum(r.verdict == "undecided" for r in results)
        total += violations
        low, high = _clopper_pearson(violations, len(results))
        lines.append(
            f"| {name} | {len(results)} | {violations} | {undecided} | "
            f"{np.median([r.epsilon_lower_bound for r in results]):.3f} | "
            f"{np.median([r.bound.gdp_mu_lower_bound for r in results]):.3f} | "
            f"{results[0].claimed_epsilon:.3f} / {results[0].claimed_mu:.3f} | [{low:.3f}, {high:.3f}] |"
        )
        print(lines[-1], flush=True)
    audits = args.audits * len(args.implementations)
    low, high = _clopper_pearson(total, audits)
    lines.append(f"| all | {audits} | {total} | | | | | [{low:.3f}, {high:.3f}]; level 0.05 |")
    _write(args.output or "two-world.md", lines)


def power(args: argparse.Namespace) -> None:
    """ε_L against the claim of a correct full-batch Gaussian mechanism: the reference training softmax
    regression from zero on the replace-one worst case, one step, at R runs per world for each prefix R of
    one long audit (each prefix is R independent runs a side, fixed before any score was seen)."""
    world = worst_case_record_worlds(records=1, relation="replace_one", dimension=args.dimension, scale=args.scale)
    midpoint = math.log(0.5)  # log p(1 | x*) at logit margin 0, the worlds' centre of symmetry
    lines = header(
        "Two-world audit: power against a correct Gaussian mechanism",
        args,
        [
            f"- implementation: reference-dpsgd training softmax regression (hidden_width=0, zero init) "
            f"{args.dimension} → 2; world: {world.name}: D = {{(x*, 0)}}, D′ = {{(x*, 1)}} with x* = "
            f"{args.scale:g}·e₁, so the two clipped gradients are exactly opposite (2C apart); score log p(1 | x*)",
            f"- q = 1, {args.steps} step(s), C = {args.clip}, lr = {args.noise_step}/(σC) (the logit margin's "
            f"noise has sd ≈ 1, away from float saturation), δ = {DELTA}; σ chosen so that the exact replace-one GDP "
            "ε (μ = 2√steps/σ) is the target; 95 % confidence shared by the two tests; seed "
            f"{args.seed}; {args.runs} runs per world, rows for its first R runs a side",
            "- rules: `split` (the audit's default: threshold and direction chosen on the first half of the runs, "
            f"counted on the second); `midpoint` (one threshold declared before training, log ½ = {midpoint:.4f}, "
            "the score where the two worlds' scores mirror each other, counted on all runs)",
            "- ε_L: the Clopper–Pearson (ε, δ) test; μ_L: the GDP test's largest refuted μ (threshold chosen to "
            "maximise it; refutes the claim exactly when μ_L > μ); GDP ε_L: the ε at δ of μ_L (sound for a "
            "mechanism whose trade-off curve is Gaussian, as a full-batch Gaussian mechanism's is)",
        ],
    )
    lines += [
        "| target ε | σ | claimed ε (replace-one, PLD) | μ | R per world | rule | ε_L | ε_L / claim | μ_L | GDP ε_L | GDP ε_L / claim | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for target in args.epsilons:
        mu = _mu_for_epsilon(target)
        sigma = 2 * math.sqrt(args.steps) / mu
        hp = DPHyperparameters(
            noise_multiplier=sigma, sampling_rate=1.0, epochs=args.steps, learning_rate=args.noise_step / (sigma * args.clip),
            delta=DELTA, max_grad_norm=args.clip,
        )  # fmt: skip
        result = run_two_world_audit(
            implementation("reference-dpsgd"), world=world, runs=args.runs, hyperparameters=hp,
            architecture=MLPArchitecture(hidden_width=0), confidence=0.95, seed=args.seed,
        )  # fmt: skip
        if result.verdict == "error":
            raise SystemExit(result.error)
        claimed = result.claimed_epsilon
        for runs in sorted({r for r in args.prefixes if r < args.runs} | {args.runs}):
            d, dprime = result.scores_d[:runs], result.scores_dprime[:runs]
            for rule, grid in (("split", None), ("midpoint", [midpoint])):
                b = two_world_bound(
                    d, dprime, delta=DELTA, confidence=0.95, threshold_rule="grid" if grid else "split", thresholds=grid
                )
                lines.append(
                    f"| {target:g} | {sigma:.4f} | {claimed:.3f} | {result.claimed_mu:.3f} | {runs} | {rule} | "
                    f"{b.epsilon_lower_bound:.3f} | {b.epsilon_lower_bound / claimed:.2f} | {b.gdp_mu_lower_bound:.3f} | "
                    f"{b.gdp_epsilon_lower_bound:.3f} | {b.gdp_epsilon_lower_bound / claimed:.2f} | "
                    f"{result.seconds_per_run:.4f} |"
                )
                print(lines[-1], flush=True)
    _write(args.output or "two-world-power.md", lines)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _speed_world(kind: str, args: argparse.Namespace) -> tuple[TwoWorlds, DPHyperparameters, str]:
    """A small two-world configuration of a speed row: the world, its hyperparameters, its setting in words."""
    hp = DPHyperparameters(noise_multiplier=2.0, sampling_rate=1.0, epochs=1, learning_rate=0.05, delta=DELTA)
    if kind == "worst_case_record":
        world = worst_case_record_worlds(records=1, relation="replace_one", dimension=args.dimension)
        return world, hp, f"q = 1, 1 step; softmax regression {args.dimension} → 2"
    if kind == "dataset_size":
        world = dataset_size_worlds(records=2, num_classes=args.classes)
        return world, hp, f"q = 1, 1 step; softmax regression 1 → {args.classes}"
    world = realised_batch_worlds(records=1, num_classes=args.classes)
    hp = dataclasses.replace(hp, sampling_rate=0.5, epochs=2)
    return world, hp, f"q = 1/2, {hp.steps} Poisson steps; softmax regression 1 → {args.classes}"


SPEED_WORLDS = ("worst_case_record", "dataset_size", "realised_batch")


def speed(args: argparse.Namespace) -> None:
    """Seconds per 1000 runs on the small two-world models (softmax regression from zero, σ = 2, lr 0.05)
    in each of ``--worlds``. ``NAME:R`` measures NAME with R runs per world."""
    worlds = [(kind, *_speed_world(kind, args)) for kind in args.worlds]
    extra = [f"- world {world.name}: {setting} (hidden_width=0, zero init)" for _, world, _, setting in worlds]
    extra.append("- hyperparameters: σ = 2, lr 0.05, C = 1; accountants memoised per distinct claim (the first run computes it)")
    if any(token.startswith("tf-privacy") for token in args.implementations):
        versions = ", ".join(f"{name} {_version(name)}" for name in ("tensorflow", "tensorflow-privacy", "keras"))
        extra.append(f"- {versions}; the first run of each configuration traces TF-Privacy's step (included)")
    lines = header("Two-world audit: seconds per 1000 runs", args, extra)
    lines += [
        "| implementation | world | runs per world | s per 1000 runs (training, claim, black box, score) |",
        "|---|---|---|---|",
    ]
    for kind, world, hp, _ in worlds:
        for token in args.implementations:
            name, _, runs = token.partition(":")
            result = _timed_audit(name, world, int(runs or args.runs), hp, MLPArchitecture(hidden_width=0))
            lines.append(f"| {name} | {kind} | {result.runs} | {1000 * result.seconds_per_run:.1f} |")
            print(lines[-1], flush=True)
    _write(args.output or "two-world-speed.md", lines)


def _timed_audit(name, world, runs, hyperparameters, architecture, *, executor=None) -> TwoWorldResult:
    """One two-world audit of ``name`` (seed 0) for its timing; an audit that errs ends the benchmark."""
    result = run_two_world_audit(
        implementation(name), world=world, runs=runs, hyperparameters=hyperparameters, architecture=architecture,
        seed=0, executor=executor,
    )  # fmt: skip
    if result.verdict == "error":
        raise SystemExit(result.error)
    return result


def executor_speed(args: argparse.Namespace) -> None:
    """Runs per second of one two-world audit (the dataset-size world, q = 1, one step) on each executor:
    in-process, a pool of ``--workers`` processes and a local Ray cluster of as many CPUs. Each executor
    runs the audit twice: the first includes starting its workers (once per session), the second not;
    the scores must be identical to the in-process ones."""
    from dpverify.execution import ExecutorSpec

    world = dataset_size_worlds(records=2, num_classes=args.classes)
    hp = DPHyperparameters(noise_multiplier=args.sigma, sampling_rate=1.0, epochs=1, learning_rate=1.0, delta=DELTA)
    architecture = MLPArchitecture(hidden_width=args.hidden)
    lines = header(
        "Two-world audit: runs per second by executor",
        args,
        [
            f"- world: {world.name}; σ = {args.sigma}, q = 1, 1 step, lr 1; MLP 1 → {args.hidden} → {args.classes} "
            f"(hidden_width=0: softmax regression); {args.runs} runs per world, seed 0; the workers take the "
            "parent's torch thread count (1)",
        ],
    )
    lines += [
        "| implementation | executor | first audit: runs/s (s) | second audit: runs/s (s) | scores as in-process | load average after |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.implementations:
        reference = None
        for kind in ("inprocess", "pool", "ray"):
            spec = ExecutorSpec(executor=kind, workers=None if kind == "inprocess" else args.workers)
            with spec.start() as executor:
                results = [_timed_audit(name, world, args.runs, hp, architecture, executor=executor) for _ in range(2)]
            reference = reference or results[0]
            same = all(r.scores_d == reference.scores_d and r.scores_dprime == reference.scores_dprime for r in results)
            label = kind if kind == "inprocess" else f"{kind} ({args.workers})"
            cells = [f"{2 * r.runs / r.seconds:.0f} ({r.seconds:.1f})" for r in results]
            lines.append(f"| {name} | {label} | {cells[0]} | {cells[1]} | {'yes' if same else '**no**'} | {_load()} |")
            print(lines[-1], flush=True)
    _write(args.output or "executor-speed.md", lines)


def scale(args: argparse.Namespace) -> None:
    """Two-world audits of ``--runs`` runs per world through the executors: the GDP test against a correct
    full-batch Gaussian mechanism at each of ``--epsilons`` (the power setting: the reference, softmax
    regression, the replace-one worst case, one step) in a pool of ``--workers``; at the first ε also
    in-process and on a local Ray cluster, for runs per second by mode; and docs/bugs.md class 9 (shuffled
    batches accounted as Poisson) against the correct Opacus path in the catalog's setting."""
    from dpverify.execution import ExecutorSpec

    world = worst_case_record_worlds(records=1, relation="replace_one", dimension=args.dimension, scale=args.scale)
    lines = header(
        "Two-world audits at scale: runs per second by executor, closeness to the claim, and row 9",
        args,
        [
            f"- power rows: reference-dpsgd, softmax regression {args.dimension} → 2 from zero, {world.name}, q = 1, "
            f"1 step, C = 1, lr = {args.noise_step}/σ, σ for the target replace-one GDP ε; 95 % confidence shared by "
            f"the two tests; seed {args.seed}; {args.runs} runs per world in the pool, {args.mode_runs} on Ray and in-process",
            "- ε_L and verdict: the audit's own; GDP μ_L and GDP ε_L: `two_world_bound` of the same scores without a "
            "claimed curve (split threshold), as `power` reports closeness to the claim",
            "- row 9: opacus-shuffled-batches against opacus-ghost, worst-case-record add/remove with 2 base records, "
            f"q = 1/2, 2 steps, σ = 1, lr 0.07 (the catalog's setting); a final-model score; {args.row9_runs} runs per world",
        ],
    )
    lines += [
        "| audit | executor | runs per world | runs/s | claimed ε | ε_L | GDP μ_L / claimed μ | GDP ε_L | GDP ε_L / claim | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def row(label: str, kind: str, result: TwoWorldResult) -> None:
        """The audit's verdict and (ε, δ) bound; the GDP columns as `power` measures closeness: the largest
        μ the runs refute (threshold chosen on a split), not only whether they refute the claimed one."""
        if result.verdict == "error":
            raise SystemExit(result.error)
        claimed = result.claimed_epsilon
        b = two_world_bound(result.scores_d, result.scores_dprime, delta=DELTA, confidence=0.95)
        mu = "–" if result.claimed_mu is None else f"{b.gdp_mu_lower_bound:.3f} / {result.claimed_mu:.3f}"
        gdp = "–" if result.claimed_mu is None else f"{b.gdp_epsilon_lower_bound:.3f}"
        ratio = "–" if result.claimed_mu is None else f"{b.gdp_epsilon_lower_bound / claimed:.2f}"
        lines.append(
            f"| {label} | {kind} | {result.runs} | {2 * result.runs / result.seconds:.0f} | {claimed:.3f} | "
            f"{b.epsilon_lower_bound:.3f} | {mu} | {gdp} | {ratio} | {result.verdict} |"
        )
        print(lines[-1], flush=True)

    def power_audit(target: float, executor, runs: int) -> TwoWorldResult:
        sigma = 2 / _mu_for_epsilon(target)
        hp = DPHyperparameters(
            noise_multiplier=sigma, sampling_rate=1.0, epochs=1, learning_rate=args.noise_step / sigma, delta=DELTA
        )
        return run_two_world_audit(
            implementation("reference-dpsgd"), world=world, runs=runs, hyperparameters=hp,
            architecture=MLPArchitecture(hidden_width=0), confidence=0.95, seed=args.seed, executor=executor,
        )  # fmt: skip

    kinds = {"pool": ExecutorSpec(executor="pool", workers=args.workers), "ray": ExecutorSpec(executor="ray", workers=args.workers),
             "inprocess": ExecutorSpec(executor="inprocess")}  # fmt: skip
    with kinds["pool"].start() as pool:
        for target in args.epsilons:
            row(f"reference, target ε {target:g}", f"pool ({args.workers})", power_audit(target, pool, args.runs))
        shuffle_world = worst_case_record_worlds(records=2, dimension=2)
        hp = DPHyperparameters(noise_multiplier=1.0, sampling_rate=0.5, epochs=1, learning_rate=0.07, delta=DELTA)
        for name in ("opacus-shuffled-batches", "opacus-ghost"):
            result = run_two_world_audit(
                implementation(name), world=shuffle_world, runs=args.row9_runs, hyperparameters=hp,
                architecture=MLPArchitecture(hidden_width=0), confidence=0.95, seed=args.seed, executor=pool,
            )  # fmt: skip
            row(f"row 9: {name}", f"pool ({args.workers})", result)
    for kind in ("ray", "inprocess"):
        with kinds[kind].start() as executor:
            label = kind if kind == "inprocess" else f"{kind} ({args.workers})"
            row(f"reference, target ε {args.epsilons[0]:g}", label, power_audit(args.epsilons[0], executor, args.mode_runs))
    _write(args.output or "two-world-scale.md", lines)


@dataclasses.dataclass(frozen=True)
class CatalogCase:
    """One bug class's variant (docs/bugs.md) in a world built for its bug class, with the correct path as control."""

    row: int
    variant: str
    world: Callable[[], TwoWorlds]
    setting: str
    hyperparameters: DPHyperparameters
    runs: int


def _catalog_cases() -> list[CatalogCase]:
    """The settings, fixed before any run: softmax regression (zero init) unless the world needs a spread."""
    sigma2 = 2 / _mu_for_epsilon(2.0)  # replace-one GDP ε = 2 for one full-batch step
    lr = 0.07  # times 1/(σC): the logit margin's noise sd ≈ 1
    return [
        CatalogCase(6, "opacus-duplicated-rows", lambda: worst_case_record_worlds(relation="replace_one", dimension=2),
                    f"q = 1, 1 step, σ = {sigma2:.3f} (claimed GDP ε 2)", DPHyperparameters(noise_multiplier=sigma2, sampling_rate=1.0, epochs=1, learning_rate=lr / sigma2, delta=DELTA), 500),
        CatalogCase(7, "opacus-realised-batch-norm", lambda: dataset_size_worlds(records=2, num_classes=1024),
                    "q = 1, 1 step, σ = 3, 2 vs 3 records, 1024 outputs", DPHyperparameters(noise_multiplier=3.0, sampling_rate=1.0, epochs=1, learning_rate=1.0, delta=DELTA), 200),
        CatalogCase(7, "opacus-realised-batch-norm", lambda: realised_batch_worlds(records=1, num_classes=1024),
                    "q = 1/2, 2 steps, σ = 3, 1 vs 2 records, 1024 outputs", DPHyperparameters(noise_multiplier=3.0, sampling_rate=0.5, epochs=1, learning_rate=1.0, delta=DELTA), 200),
        CatalogCase(9, "opacus-shuffled-batches", lambda: worst_case_record_worlds(records=2, dimension=2),
                    "q = 1/2, 2 steps, σ = 1, add/remove, 2 base records", DPHyperparameters(noise_multiplier=1.0, sampling_rate=0.5, epochs=1, learning_rate=lr, delta=DELTA), 500),
        CatalogCase(11, "opacus-microbatches", lambda: worst_case_record_worlds(dimension=2),
                    "q = 1, 1 step, σ = 2, x* appended", DPHyperparameters(noise_multiplier=2.0, sampling_rate=1.0, epochs=1, learning_rate=lr / 2, delta=DELTA), 500),
        CatalogCase(11, "opacus-microbatches", lambda: microbatch_worlds(records=2),
                    "q = 1, 1 step, σ = 1, (x*, 1) inserted first", DPHyperparameters(noise_multiplier=1.0, sampling_rate=1.0, epochs=1, learning_rate=lr, delta=DELTA), 500),
        CatalogCase(12, "opacus-reused-noise", lambda: worst_case_record_worlds(relation="replace_one", dimension=2),
                    f"q = 1, 4 steps, σ = {2 * sigma2:.3f} (claimed GDP ε 2)", DPHyperparameters(noise_multiplier=2 * sigma2, sampling_rate=1.0, epochs=4, learning_rate=lr / (2 * sigma2), delta=DELTA), 500),
    ]  # fmt: skip


def catalog(args: argparse.Namespace) -> None:
    """docs/bugs.md classes 6, 7, 9, 11, 12: each variant and the correct opacus-ghost, two-world audits at seeds
    0 … ``--audits`` − 1, in a world built for the row's bug class."""
    lines = header(
        "Two-world audits of the catalog's subtle rows (docs/bugs.md classes 6, 7, 9, 11, 12)",
        args,
        [
            "- each row's Opacus variant and, as control, the correct `opacus-ghost` in the same world and setting; "
            f"audit seeds 0 … {args.audits - 1}; 95 % confidence per audit, shared by the (ε, δ) and the GDP tests "
            "(GDP only at q = 1); the audit designates the normaliser q·|D|",
            "- softmax regression (hidden_width=0, zero init) on d = 2 for the worst-case worlds (x* = 10·e₁, "
            "lr = 0.07/(σC)); d = 1 and 1024 outputs for the dataset-size world",
        ],
    )
    lines += [
        "| row | implementation | world | setting | runs per world | violations | ε_L (min – max) | μ_L (min – max) | claimed ε / μ | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in _catalog_cases():
        for name in (case.variant, "opacus-ghost"):
            results = _seeded_audits(implementation(name), case.world(), case.runs, case.hyperparameters, args.audits)
            lines.append(_audits_row([case.row, name, results[0].world, case.setting, case.runs], results))
    _write(args.output or "two-world-catalog.md", lines)


def shuffle_gap(args: argparse.Namespace) -> None:
    """Why a final-model world does not refute shuffling accounted as Poisson (docs/bugs.md class 9) in the linear
    regime: the shuffled run's final sum holds x*'s clipped gradient exactly E times (once an epoch) under
    noise of sd σC√T, a Gaussian mechanism with μ = E/(σ√T), whose exact ε is compared with the Poisson
    claim (dp_accounting's PLD, add/remove) for the same σ, q and T = E/q steps."""
    from dpverify_reference import accounting

    lines = header(
        "Shuffled batches accounted as Poisson: what the final model can show",
        args,
        ["- add/remove, δ = 1e-05; T = E/q steps; shuffled final sum: GDP μ = E/(σ√T)"],
    )
    lines += ["| q | epochs E | steps T | σ | Poisson claim ε (PLD) | shuffled final sum: μ | its ε |", "|---|---|---|---|---|---|---|"]
    for q in (0.5, 0.25, 0.1):
        for epochs in (1, 2):
            steps = round(epochs / q)
            for sigma in (0.5, 1.0, 2.0):
                mu = epochs / (sigma * math.sqrt(steps))
                lines.append(
                    f"| {q:g} | {epochs} | {steps} | {sigma:g} | {accounting.pld_epsilon(sigma, q, steps, DELTA):.3f} | "
                    f"{mu:.3f} | {float(_gdp_epsilon(np.asarray(mu), DELTA)):.3f} |"
                )
    _write(args.output or "two-world-shuffle.md", lines)


def noise_deficit(args: argparse.Namespace) -> None:
    """Opacus (hooks mode, the faster per run here) with its noise divided by k and its claim kept, in the
    replace-one worst-case world of ``power``, seeds 0 … ``--audits`` − 1 per row: the two-world audit's
    answer to a deficit that no one-run test resolves at small ε (benchmarks/results/noise-deficit-standard*.md)."""
    from dpverify_opacus import noise_scaled

    world = worst_case_record_worlds(records=1, relation="replace_one", dimension=args.dimension, scale=args.scale)
    lines = header(
        "Two-world audit of a noise deficit",
        args,
        [
            f"- implementation: opacus-hooks with its noise std divided by k (`noise_scaled(k, grad_sample_mode='hooks')`), "
            f"softmax regression (hidden_width=0, zero init) {args.dimension} → 2; world: {world.name} (as `power`)",
            f"- q = 1, {args.steps} step(s), C = 1, lr = {args.noise_step}/σ, δ = {DELTA}; σ chosen so that the exact "
            "replace-one GDP ε of the claim is the target; 95 % confidence per audit shared by the (ε, δ) and the GDP "
            "tests; a row is caught when the verdict is a violation",
        ],
    )
    lines += [
        "| target ε | k | runs per world | violations | ε_L (min – max) | μ_L (min – max) | claimed ε / μ | s/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target, runs in zip(args.epsilons, args.runs_by_epsilon):
        sigma = 2 * math.sqrt(args.steps) / _mu_for_epsilon(target)
        hp = DPHyperparameters(
            noise_multiplier=sigma, sampling_rate=1.0, epochs=args.steps, learning_rate=args.noise_step / sigma,
            delta=DELTA,
        )  # fmt: skip
        for k in args.deficits:
            results = _seeded_audits(noise_scaled(k, grad_sample_mode="hooks"), world, runs, hp, args.audits)
            lines.append(_audits_row([f"{target:g}", f"{k:g}", runs], results))
    _write(args.output or "two-world-noise-deficit.md", lines)


def _seeded_audits(audited, world: TwoWorlds, runs: int, hyperparameters: DPHyperparameters, audits: int) -> list[TwoWorldResult]:
    """Two-world audits of softmax regression at seeds 0 … ``audits`` − 1, 95 % each; an error stops the benchmark."""
    results = [
        run_two_world_audit(
            audited, world=world, runs=runs, hyperparameters=hyperparameters,
            architecture=MLPArchitecture(hidden_width=0), confidence=0.95, seed=seed,
        )
        for seed in range(audits)
    ]  # fmt: skip
    errors = [r for r in results if r.verdict == "error"]
    if errors:
        raise SystemExit(f"{audited.info.name}: {errors[0].error}")
    return results


def _audits_row(cells: list, results: list[TwoWorldResult]) -> str:
    """A table row: ``cells``, then violations, the ranges of ε_L and μ_L, the claim and seconds per run."""
    eps = [r.epsilon_lower_bound for r in results]
    mus = [r.bound.gdp_mu_lower_bound for r in results]
    mu_claim = "–" if results[0].claimed_mu is None else f"{results[0].claimed_mu:.3f}"
    row = (
        "| " + " | ".join(str(c) for c in cells) + f" | {sum(r.verdict == 'violation' for r in results)} / {len(results)} | "
        f"{_range(eps)} | {_range(mus)} | {results[0].claimed_epsilon:.3f} / {mu_claim} | "
        f"{np.mean([r.seconds_per_run for r in results]):.4f} |"
    )
    print(row, flush=True)
    return row


def _mu_for_epsilon(epsilon: float) -> float:
    low, high = 1e-3, 50.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _gdp_epsilon(np.asarray(mid), DELTA) < epsilon else (low, mid)
    return (low + high) / 2


def _clopper_pearson(k: int, n: int) -> tuple[float, float]:
    low = stats.beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
    high = stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return float(low), float(high)


def _write(name: str, lines: list[str]) -> None:
    path = RESULTS / name
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what",
        choices=("finding", "false-alarms", "power", "speed", "executor-speed", "scale", "catalog", "shuffle-gap", "noise-deficit"),
    )
    parser.add_argument("--runs", type=int, default=200, help="runs per world")
    parser.add_argument("--audits", type=int, default=100)
    parser.add_argument("--sigma", type=float, default=3.0)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--noise-step", type=float, default=0.07, help="power: lr·σ·C, the noise's std per coordinate in the update")
    parser.add_argument("--scale", type=float, default=10.0, help="power: x* = scale·e₁")
    parser.add_argument("--dimension", type=int, default=2, help="power: the input dimension d")
    parser.add_argument("--prefixes", type=int, nargs="+", default=[1000, 3000], help="power: rows for the first R runs")
    parser.add_argument("--clip", type=float, default=1.0, help="power: the clipping norm C")
    parser.add_argument("--seed", type=int, default=0, help="power: the audit seed (pilots use others)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--deficits", type=float, nargs="+", default=[1.5], help="noise-deficit: the factors k")
    parser.add_argument(
        "--runs-by-epsilon", type=int, nargs="+", default=[10_000, 5000, 2000],
        help="noise-deficit: runs per world for each of --epsilons, in order",
    )  # fmt: skip
    parser.add_argument("--implementations", nargs="+", default=["reference-dpsgd", "opacus-ghost"])
    parser.add_argument("--worlds", nargs="+", choices=SPEED_WORLDS, default=["worst_case_record"], help="speed: the worlds")
    parser.add_argument("--workers", type=int, default=2, help="executor-speed, scale: the pool's processes, the Ray cluster's CPUs")
    parser.add_argument("--row9-runs", type=int, default=100_000, help="scale: runs per world of the class 9 audits")
    parser.add_argument("--mode-runs", type=int, default=100_000, help="scale: runs per world on Ray and in-process")
    parser.add_argument("--output", help="file name under benchmarks/results/")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    subcommands = {
        "finding": finding,
        "false-alarms": false_alarms,
        "power": power,
        "speed": speed,
        "executor-speed": executor_speed,
        "catalog": catalog,
        "shuffle-gap": shuffle_gap,
        "noise-deficit": noise_deficit,
        "scale": scale,
    }
    subcommands[args.what](args)


if __name__ == "__main__":
    main()
