"""Null simulations through the real audits: each one runs :func:`~dpverify.audits.run_audit` or
:func:`~dpverify.audits.two_world.run_two_world_audit` (looks, readers and tests included) on a fast
mechanism that is exactly the claim (``deficit`` 1) or whose noise is ``deficit`` times smaller than the
claim says (the claimed curve is then that much too strong), and counts the audits that refute the claim.

The subject is the statistics, not a library, so the trainers are simulated: the one-run audit's
:class:`~tests.doubles.GaussianMechanism` (Dirac scores N(μ, 1) against N(0, 1) at q = 1), the every-update
audit's :class:`DiracDPSGD` (DP-SGD of softmax regression on Dirac records, Poisson batches, its updates
handed over and its black box the last of them), and :class:`WorldScoreMechanism` for the two-world
worlds, which releases exactly the claimed Gaussian mechanism as the world's score reads it.
:mod:`tests.test_null_simulations` asserts what these rates must be; ``benchmarks/null_simulations.py``
measures them with more audits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
from scipy import stats

from dpverify.audits import run_audit
from dpverify.audits.two_world import full_batch_gdp_mu, run_two_world_audit
from dpverify.canaries.worlds import WORLDS, TwoWorlds, world_names
from dpverify.config import EVERY_UPDATE_SETTING, AuditConfig, profile_config
from dpverify.contract import (
    DPHyperparameters,
    Implementation,
    ImplementationInfo,
    MLPArchitecture,
    PrivacyClaim,
    TrainedModel,
    TrainingRequest,
)
from dpverify.stats.curves import ClaimedRun
from tests.doubles import GaussianMechanism, Rows

#: The deficit of the power checks: the truth's σ is the claimed σ / 1.25.
DEFICIT = 1.25
#: The null simulations' level (1 − confidence): loose, so that a share above it shows in few audits.
LEVEL = 0.2
#: The null check's one-sided confidence: it fails when the Clopper–Pearson lower end of the refuted share
#: at this confidence exceeds :data:`LEVEL`, so an audit whose level holds fails it with probability ≤ 0.01.
NULL_CHECK = 0.99
#: Simulated audits of each null check, at the truth and (the power check) at its departure (:data:`DEPARTURES`):
#: five, of which four refuted fail the check (:func:`refuted_to_fail`). An audit refuting at exactly the
#: level then fails it with probability 0.0067; one refuting the departure in a share p of audits fails it with probability
#: p⁵ + 5p⁴(1 − p), ≥ 0.9 for p ≥ 0.89 (each simulation's p: benchmarks/results/null-simulations.md).
NULL_AUDITS = 5


@contextlib.contextmanager
def without_power_step() -> Iterator[None]:
    """Skip the power measured after each verdict (:func:`~dpverify.audits.verdict.power_beside_verdict`):
    it can only turn a pass into ``undecided`` (design rule 13), never make or unmake a violation, which is
    all a null simulation counts, and it costs more than the audit itself (a bisection of simulated audits)."""
    import dpverify.audits.two_world as two_world
    import dpverify.audits.verdict as verdict

    originals = verdict.power_beside_verdict, two_world.power_beside_verdict
    verdict.power_beside_verdict = two_world.power_beside_verdict = lambda outcome, *rest, **named: (outcome, None)
    try:
        yield
    finally:
        verdict.power_beside_verdict, two_world.power_beside_verdict = originals


def clopper_pearson(refuted: int, audits: int, *, confidence: float) -> tuple[float, float]:
    """The two-sided Clopper–Pearson interval of a rate at ``confidence`` (each end holds at (1 + c)/2)."""
    tail = (1 - confidence) / 2
    low = 0.0 if refuted == 0 else float(stats.beta.ppf(tail, refuted, audits - refuted + 1))
    high = 1.0 if refuted == audits else float(stats.beta.ppf(1 - tail, refuted + 1, audits - refuted))
    return low, high


def null_check_lower_end(refuted: int, audits: int) -> float:
    """The one-sided :data:`NULL_CHECK` Clopper–Pearson lower end of the refuted share."""
    return clopper_pearson(refuted, audits, confidence=2 * NULL_CHECK - 1)[0]


def level_exceeded(refuted: int, audits: int) -> bool:
    """The null check: whether ``refuted`` of ``audits`` show a refuted share above :data:`LEVEL`."""
    return null_check_lower_end(refuted, audits) > LEVEL


def refuted_to_fail(audits: int) -> int:
    """The fewest refuted of ``audits`` that fail the null check."""
    return next(k for k in range(audits + 1) if level_exceeded(k, audits))


# --- the one-run audit (final model, Dirac canaries, q = 1) -------------------------------------------


def one_run_config(*, seed: int, confidence: float, m: int = 160_000, pooled_runs: int = 64) -> AuditConfig:
    """The quick profile's Dirac audit (q = 1, 10 steps) with ``m`` canaries in ``pooled_runs`` runs of
    2500, at ``confidence``: 16 times the gate's canaries, where a 1.25-fold deficit shows (at level 0.2,
    40 000 refuted 0 of 8 audits of it, 160 000 all 16 of benchmarks/results/null-simulations.md)."""
    return profile_config("quick", m=m, pooled_runs=pooled_runs, dimension=m // pooled_runs, confidence=confidence,
                          seed=seed, device="cpu")  # fmt: skip


@dataclass(frozen=True)
class OneRunOutcome:
    """One simulated one-run audit: its verdict, and which of its two tests refuted the claim."""

    violation: bool
    epsilon_refuted: bool
    curve_refuted: bool


@functools.cache  # one audit's two tests are read twice by the tests (the verdict, then which test refuted)
def one_run_audit(*, deficit: float, seed: int, confidence: float, **sizes) -> OneRunOutcome:
    """:func:`run_audit` of the claimed Gaussian mechanism at claimed ε 6 whose canaries carry ``deficit``
    times the claimed μ (the truth's σ is the claim's / ``deficit``). ε 6 rather than the gate's 2: the
    audit's relative power is larger there (at 40 000 canaries it catches 1.36× against 1.46×)."""
    result = run_audit(GaussianMechanism(claimed_epsilon=6.0, signal=deficit), one_run_config(seed=seed, confidence=confidence, **sizes))
    assert result.verdict in ("pass", "violation", "undecided"), result.summary()
    return OneRunOutcome(
        violation=result.verdict == "violation",
        epsilon_refuted=result.epsilon_lower_bound > result.claimed_epsilon,
        curve_refuted=bool(result.curve_refuted),
    )


# --- the every-update Dirac audit ----------------------------------------------------------------------


@dataclass
class DiracDPSGD(Implementation):
    """DP-SGD of zero-initialised softmax regression on Dirac records (record j is a·e_j), computed column
    by column: record j's gradient lives in weight column j and the bias, so a step costs O(classes × d)
    instead of NumpyDPSGD's O(batch × classes × d). Poisson batches at q, each record clipped to C by its
    whole gradient's norm, Gaussian noise (σ/``noise_deficit``)·C on every coordinate, the designated
    normaliser; it hands over (weight (C, d), bias (C,)) before the first step and after each, and its
    black box is the last of them. Claims σ, q and the steps (full-batch GDP ε, as NumpyDPSGD)."""

    noise_deficit: float = 1.0
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-dirac-dpsgd", library="numpy"))

    def train(self, request: TrainingRequest) -> TrainedModel:
        hp = request.hyperparameters
        records = Rows.of(request.features)
        if records.dense is not None:
            raise ValueError(f"{self.info.name} trains on Dirac records only (one non-zero feature each, each in a column of its own)")
        owner, scale = records.owner, records.value
        classes, clip, sigma = request.num_classes, hp.max_grad_norm, hp.noise_multiplier
        normaliser = hp.normaliser(request.num_records)
        rng = np.random.default_rng(request.seed)
        weight, bias = np.zeros((classes, request.dimension)), np.zeros(classes)
        onehot = np.eye(classes)[request.labels].T  # (C, n)
        request.observe_update(0, (weight.copy(), bias.copy())) if request.observe_update else None
        for step in range(1, hp.steps + 1):
            logits = scale * weight[:, owner] + bias[:, None]
            residual = np.exp(logits - np.logaddexp.reduce(logits, axis=0)) - onehot
            factor = np.minimum(1.0, clip / np.maximum(np.linalg.norm(residual, axis=0) * np.sqrt(scale**2 + 1), 1e-300))
            factor *= rng.random(len(scale)) < hp.sampling_rate
            summed_weight = sigma / self.noise_deficit * clip * rng.standard_normal(weight.shape)
            np.add.at(summed_weight.T, owner, (factor * scale * residual).T)
            summed_bias = (factor * residual).sum(axis=1) + sigma / self.noise_deficit * clip * rng.standard_normal(classes)
            weight -= hp.learning_rate * summed_weight / normaliser
            bias -= hp.learning_rate * summed_bias / normaliser
            request.observe_update(step, (weight.copy(), bias.copy())) if request.observe_update else None
        claim = PrivacyClaim(
            epsilon=ClaimedRun(noise_multiplier=sigma, steps=hp.steps).epsilon(hp.delta), delta=hp.delta,
            accountant="full-batch GDP", noise_multiplier=sigma, sampling_rate=hp.sampling_rate, steps=hp.steps,
        )  # fmt: skip
        final_weight, final_bias = weight.copy(), bias.copy()
        return TrainedModel(predict_log_proba=lambda x: _log_softmax(Rows.of(x).times(final_weight.T) + final_bias),
                            claim=claim, device="cpu")  # fmt: skip


def every_update_config(
    *, seed: int, confidence: float, m: int = 80_000, pooled_runs: int = 32, sampling_rate: float = 1.0, epochs: int = 2,
    noise_multiplier: float = 1.2, **design
) -> AuditConfig:
    """The every-update audit (Dirac canaries in softmax regression) on ``m`` canaries in ``pooled_runs``
    runs, ``epochs`` at q = ``sampling_rate`` and σ = ``noise_multiplier``, with the quick profile's guesses
    unless ``design`` sets them."""
    return profile_config("quick", observe="every_update", m=m, pooled_runs=pooled_runs, dimension=m // pooled_runs,
                          sampling_rate=sampling_rate, epochs=epochs, noise_multiplier=noise_multiplier,
                          confidence=confidence, seed=seed, device="cpu", **design)  # fmt: skip


def every_update_audit(*, deficit: float, seed: int, confidence: float, **sizes) -> bool:
    """Whether :func:`run_audit` of every-update DP-SGD (:class:`DiracDPSGD`: Poisson batches, its updates
    handed over) adding σ/``deficit`` while it claims σ refutes the claim."""
    result = run_audit(DiracDPSGD(noise_deficit=deficit), every_update_config(seed=seed, confidence=confidence, **sizes))
    assert result.verdict in ("pass", "violation", "undecided") and result.observed == "every update", result.summary()
    return result.verdict == "violation"


# --- the two-world worlds -------------------------------------------------------------------------------


@dataclass
class WorldScoreMechanism(Implementation):
    """The claimed Gaussian mechanism as ``world``'s score reads it: the score of a run on D is N(0, 1), on
    D′ N(μ, 1) with μ = ``deficit`` × the claim's GDP μ (√steps/σ, add/remove at q = 1), the exact trade-off
    curve the claim asserts when ``deficit`` is 1. A world scored on the final model gets a black box whose
    log-probabilities give that score at every probe (constant in the input, so affine: the designated
    softmax regression's form); the every-update world gets softmax-regression parameters whose released
    sums put the mechanism on the canary's direction at each step (:func:`fixed_batch_updates`), and the
    black box of the last of them."""

    world: TwoWorlds
    deficit: float = 1.0
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-world-gaussian", library="numpy"))

    def train(self, request: TrainingRequest) -> TrainedModel:
        hp = request.hyperparameters
        claim = PrivacyClaim(
            epsilon=_claimed_epsilon(hp.noise_multiplier, hp.sampling_rate, hp.steps, hp.delta),
            delta=hp.delta, accountant="test-world-gaussian", noise_multiplier=hp.noise_multiplier,
            sampling_rate=hp.sampling_rate, steps=hp.steps,
        )  # fmt: skip
        in_dprime = request.labels.shape == self.world.labels_dprime.shape and bool(
            np.array_equal(request.labels, self.world.labels_dprime) and np.array_equal(request.features, self.world.features_dprime)
        )
        rng = np.random.default_rng(request.seed)
        if self.world.observes_updates:
            handed = fixed_batch_updates(self.world, hp, in_dprime=in_dprime, deficit=self.deficit, rng=rng)
            for step, parameters in enumerate(handed):
                request.observe_update(step, parameters)
            weight, bias = (p.astype(np.float64) for p in handed[-1])
            return TrainedModel(predict_log_proba=lambda x: _log_softmax(np.asarray(x, np.float64) @ weight.T + bias), claim=claim, device="cpu")
        mu = full_batch_gdp_mu(claim, self.world.relation)
        assert mu is not None, "the final-model worlds are simulated at q = 1, where the claim is exactly μ-GDP"
        score = self.deficit * mu * in_dprime + rng.standard_normal()
        return TrainedModel(predict_log_proba=_constant_log_probs(_logits_scoring(self.world, score)), claim=claim, device="cpu")


@functools.cache
def _claimed_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    """The claim's ε, once per setting: computing it took 60 % of a simulated world's audit, run after run."""
    return ClaimedRun(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps).epsilon(delta)


def _logits_scoring(world: TwoWorlds, score: float) -> np.ndarray:
    """One row of logits whose log-probabilities the world's score maps increasingly to ``score``."""
    if world.score == "target_log_prob":  # log p(target) rises with the target's logit
        logits = np.zeros(world.num_classes)
        logits[world.target_class] = score
        return logits
    # output_spread: the log-probabilities' spread over the classes is |50 + score| × the pattern's (1)
    pattern = np.resize([1.0, -1.0], world.num_classes)
    return (50.0 + score) * (pattern - pattern.mean()) / pattern.std()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def _constant_log_probs(logits: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    log_probs = _log_softmax(logits)
    return lambda features: np.tile(log_probs, (len(features), 1))


def fixed_batch_updates(world: TwoWorlds, hp: DPHyperparameters, *, in_dprime: bool, deficit: float, rng: np.random.Generator):
    """The parameters (before the first step, then after each) of DP-SGD of softmax regression on the
    fixed-batch world in which the markers' clipped gradients are zero and the canary's is C along its
    direction u: each step's released sum along u is 1{canary sampled, probability q}·C + (σ/``deficit``)·C·Z,
    the claimed Poisson-subsampled Gaussian mechanism (exactly, with ``deficit`` 1). The markers' own
    Binomial counts would hide the canary from the world's score at any noise (the world reads the batch
    sampler, not the noise), so they are left out to test the curve test, which is what this measures."""
    scale = world.marker_scale
    dimension = world.features_d.shape[1]
    point = np.zeros(dimension)
    point[0] = scale
    direction = np.concatenate([point, -point, [1.0, -1.0]])
    direction /= np.linalg.norm(direction)
    sampled = in_dprime * (rng.random(hp.steps) < hp.sampling_rate)
    noise = rng.standard_normal((hp.steps, direction.size)) * hp.noise_multiplier / deficit
    sums = hp.max_grad_norm * (sampled[:, None] * direction + noise)
    theta = np.vstack([np.zeros(direction.size), -np.cumsum(hp.learning_rate * sums / hp.expected_batch_size, axis=0)])
    return [(row[: 2 * dimension].reshape(2, dimension).astype(np.float32), row[2 * dimension :].astype(np.float32)) for row in theta]


#: Each world's simulated setting: its records and classes (the gate's, but one record for the fixed-batch
#: world), q = 1, where the claim is exactly μ-GDP (the default curve test of the final-model worlds; the
#: fixed-batch world's every-update test takes the claim's own curve, and its spike score is then the Gaussian
#: likelihood ratio: at q = 0.5 it refuted 1 of 8 audits at 1.25×), and σ 0.4 over one step (μ = 2.5), for
#: which :data:`WORLD_RUNS` runs a world refute a claim whose σ is 1.25 times too large in about 19 audits
#: of 20, enough for each world's null check alone to notice it (:data:`NULL_AUDITS`). Per run, μ 2.5 is
#: the sharper setting: at 800 runs μ 2 refuted 25 of 30, μ 2.5 29 of 30, μ 1.5 22 of 30 (at 400 runs, μ 2
#: about half).
WORLD_SETTINGS: dict[str, dict] = {
    "dataset_size": dict(records=2, num_classes=1024, noise_multiplier=0.4, sampling_rate=1.0, epochs=1),
    "fixed_batch": dict(records=1, num_classes=2, noise_multiplier=0.4, sampling_rate=1.0, epochs=1),
    "microbatch": dict(records=2, num_classes=2, noise_multiplier=0.4, sampling_rate=1.0, epochs=1),
    "realised_batch": dict(records=1, num_classes=1024, noise_multiplier=0.4, sampling_rate=1.0, epochs=1),
    "worst_case_record": dict(records=1, num_classes=2, noise_multiplier=0.4, sampling_rate=1.0, epochs=1),
}


def two_world_audit(kind: str, *, deficit: float, seed: int, confidence: float, runs: int) -> bool:
    """Whether :func:`run_two_world_audit` of :class:`WorldScoreMechanism` in world ``kind`` (its
    :data:`WORLD_SETTINGS`, ``runs`` per world) refutes the claim."""
    setting = dict(WORLD_SETTINGS[kind])
    world = WORLDS[kind].maker(records=setting.pop("records"), num_classes=setting.pop("num_classes"))
    hp = DPHyperparameters(max_grad_norm=1.0, learning_rate=1.0, **setting)
    if world.public_size is not None:
        hp = dataclasses.replace(hp, expected_batch_size=hp.sampling_rate * world.public_size)
    result = run_two_world_audit(WorldScoreMechanism(world=world, deficit=deficit), world=world, runs=runs,
                                 hyperparameters=hp, architecture=MLPArchitecture(hidden_width=0),
                                 confidence=confidence, seed=seed)  # fmt: skip
    assert result.verdict in ("pass", "violation", "undecided") and result.error is None, (result.verdict, result.error)
    return result.verdict == "violation"


def _two_world(kind: str) -> Callable[..., bool]:
    return lambda *, deficit, seed, confidence: two_world_audit(kind, deficit=deficit, seed=seed, confidence=confidence, runs=WORLD_RUNS)


#: Runs per world of the two-world simulations.
WORLD_RUNS = 800
#: The every-update audit at q < 1 as the gate designs it (:data:`~dpverify.config.EVERY_UPDATE_SETTING`'s
#: guesses, on the members' side only) at the gate's 40 000 canaries in 16 runs, q = 0.5 over 2 epochs
#: (4 steps) at σ 1. It does not notice 1.25× at any size measured (benchmarks/results/null-simulations.md:
#: curve p 0.74 and 0.32 at 40 000 canaries, 0.98, 0.84 and 0.99 at 160 000, where Fisher's combination of
#: 64 runs' conservative p-values only dilutes; 4 runs of 10 000 canaries: p 0.38), and notices 1.5× (5 of
#: 5 at 40 000): its null check's power is shown at 1.5× (:data:`DEPARTURES`).
SUBSAMPLED_EVERY_UPDATE: dict = dict(
    m=40_000, pooled_runs=16, sampling_rate=0.5, epochs=2, noise_multiplier=1.0,
    guesses=EVERY_UPDATE_SETTING["guesses"], sides=EVERY_UPDATE_SETTING["sides"],
)  # fmt: skip

#: Each simulation as ``f(deficit=, seed=, confidence=) -> refuted``, by name.
SIMULATIONS: dict[str, Callable[..., bool]] = {
    "one_run": lambda **kw: one_run_audit(**kw).violation,
    "every_update": every_update_audit,
    **{f"two_world/{kind}": _two_world(kind) for kind in world_names()},
    "every_update_subsampled": lambda **kw: every_update_audit(**kw, **SUBSAMPLED_EVERY_UPDATE),
}
#: The departure each null check's power is shown at: a claimed curve 1.25 times too strong, but 1.5 times
#: for the every-update audit at q < 1, which cannot notice 1.25× at an affordable size.
DEPARTURES: dict[str, float] = {name: DEFICIT for name in SIMULATIONS} | {"every_update_subsampled": 1.5}


def null_check_seeds(name: str, deficit: float) -> range:
    """The seeds of simulation ``name``'s null check (:data:`NULL_AUDITS`), fixed before any run:
    10 000·i + 0, 1, … at the truth and 10 000·i + 1000, … at any other deficit for the i-th simulation
    (each world's draws its own)."""
    first = 10_000 * list(SIMULATIONS).index(name) + (0 if deficit == 1.0 else 1000)
    return range(first, first + NULL_AUDITS)


def null_check_refuted(name: str, *, deficit: float, until_decided: bool = False) -> int:
    """How many of the null check's audits of simulation ``name`` at ``deficit`` (1: the truth, else its
    :data:`DEPARTURES`) refute the claim. ``until_decided`` runs them in their seeds' order only until the
    rest cannot change :func:`level_exceeded`'s answer (at the truth, two not refuted; at a departure
    usually four refuted): the count may then be short of the full one, but the null check's answer on it
    is the full count's for every outcome of the audits, so its error rates are the same."""
    seeds, refuted = null_check_seeds(name, deficit), 0
    with without_power_step():
        for done, seed in enumerate(seeds):
            # the full count lies in [refuted, refuted + the audits left], and level_exceeded rises with it
            if until_decided and level_exceeded(refuted, NULL_AUDITS) == level_exceeded(refuted + len(seeds) - done, NULL_AUDITS):
                break
            refuted += SIMULATIONS[name](deficit=deficit, seed=seed, confidence=1 - LEVEL)
    return refuted
