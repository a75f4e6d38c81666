r"""Dense matrix-factorization DP training on JAX-Privacy 2.0.0's core API, correct or broken in one place.

A run of T steps: ``batch_selection.CyclicPoissonSampling(sampling_prob=1, iterations=T, cycle_length=b,
partition_type=INDEPENDENT)`` (the library's "fixed order + multi-epoch" batches, b = round(1/q) a cycle, each
record in one of the b groups drawn independently, as add/remove adjacency needs), so a record takes part every
b steps, ⌈T/b⌉ times; ``jax_privacy.clipped_grad`` sums the clipped per-example gradients (unit rescale, as the
core path); ``noise_addition.matrix_factorization_privatizer(noising_matrix, stddev=σ·s·sens)`` adds correlated
noise, the noising matrix C⁻¹ as a dense ``jax.Array`` (the library's ``_dense_matrix_factorization_privatizer``).
The strategy C is the banded Toeplitz square root of the prefix sum (``toeplitz.optimal_max_error_strategy_coefs``,
:data:`BANDS` coefficients) materialised dense for the T steps (``toeplitz.materialize_lower_triangular``), its
sensitivity the library's own for the run's participation,
``sensitivity.get_min_sep_sensitivity_upper_bound(C, min_sep=b, max_participations=⌈T/b⌉)`` (exact here: CᵀC is
non-negative). The whitened updates C·y are then one Gaussian mechanism of noise multiplier σ, so the claim is
``GaussianDpEvent(σ)`` (dp_accounting's PLD, add/remove) with ``NoiseStructure.dense(C)``
(:mod:`dpverify.stats.correlated`), and every update is handed over for the every-update audit.

The variants change one library call and keep the claim:

- ``single_participation`` (docs/bugs.md class 13, jax_privacy PR #238's class): the stddev is σ times
  ``sensitivity.single_participation_sensitivity(C)``, the largest column norm, while a record takes part ⌈T/b⌉
  times: at q = 1 the noise is ‖C·1‖/1.118 too small, 4.1 times at T = 10 steps and 7.5 at T = 32.
- ``mismatched_noising`` (class 15): the privatizer's noising matrix is the inverse of the unbanded Toeplitz
  square root (``optimal_max_error_strategy_coefs(T)``) while the sensitivity and the claim are the
  :data:`BANDS`-band strategy's: the noise stream and the accounting drift apart.
- ``short_noising`` (a finding in the release, class 15; the known issue ``jax-privacy-dense-mf-short-noising``): the
  library as it ships, given a noising matrix materialised
  for a strategy sized for the first ⌈T/2⌉ steps (the banded Toeplitz's leading block, exact for those steps)
  and the run goes on for T. The 2.0.0 dense privatizer does not stop: its update reads
  ``matrix_row = noising_matrix[index] * stddev`` with ``index`` the step counter in its state, JAX clamps an
  out-of-bounds gather, so every step from ⌈T/2⌉ on gets row ⌈T/2⌉ − 1 again, and that row's noise
  ``Σ_j row_j · normal(fold_in(prng_key, j))`` is drawn from the same key every step
  (``_gaussian_linear_combination``): the same noise vector is added again, and the differences of those
  updates carry no noise at all. jax_privacy PR #338 (after 2.0.0) makes it an ``IndexError``. The claimed
  strategy's score adds the repeated noise up over the later steps (numpy ceiling: 0.20 of the claimed μ; measured
  ρ 0.11–0.22, undecided on 5 of 5 seeds: benchmarks/results/dense-mf.md); the every-update audit sees it because
  the noise no record touches refutes the claimed structure, and the structure that noise shows reads the noiseless
  differences (refuted on 5 of 5 seeds: benchmarks/results/structure-estimate.md). The run is the user's slip (a
  matrix sized for fewer steps than trained) that the release lets through without a word, so it is registered as
  a known issue of the release with PR #338's link, and its repetition is tested in tests/test_dense_mf.py.

This module imports neither jax nor jax_privacy until a run trains: listing implementations works without them.
"""

from __future__ import annotations

import functools
import math

from dpverify.contract import Implementation, ImplementationInfo, PrivacyClaim, TrainedModel, TrainingRequest, noise_and_claim

__all__ = ["BANDS", "KINDS", "DenseMatrixFactorization", "implementations", "strategy"]

#: The strategy's bands: step t's noise is correlated with the BANDS − 1 steps before it through C.
BANDS = 2
#: The runs: the library's path as documented, and one call changed.
KINDS: tuple[str, ...] = ("correct", "single_participation", "mismatched_noising", "short_noising")

_LIBRARY = dict(
    library="jax-privacy", requires=("jax", "jax_privacy", "dp_accounting"), extra="jax-privacy", correlated_noise=True
)

_NOTES = (
    "jax_privacy core API with a dense matrix-factorization privatizer: batch_selection.CyclicPoissonSampling("
    "sampling_prob=1, iterations=T, cycle_length=b = round(1/q), partition_type=INDEPENDENT) (fixed cyclic batches, a "
    "record every b steps); jax_privacy.clipped_grad(l2_clip_norm=C, rescale_to_unit_norm=True); "
    "noise_addition.matrix_factorization_privatizer(jnp.linalg.inv(C), stddev=σ·l2_norm_bound·sens) with C the "
    f"{BANDS}-band Toeplitz square root of the prefix sum (toeplitz.optimal_max_error_strategy_coefs, "
    "materialize_lower_triangular) as a dense T × T matrix and sens = sensitivity.get_min_sep_sensitivity_upper_bound("
    "C, min_sep=b, max_participations=⌈T/b⌉); SGD update lr·C·noisy sum / normaliser; every update handed over. "
    "Claim: GaussianDpEvent(σ) (dp_accounting PLD, add/remove) with NoiseStructure.dense(C); a target ε is "
    "calibrated with dp_accounting.calibrate_dp_mechanism. q must be 1/b for a whole b."
)

_VARIANTS = {
    "single_participation": dict(
        bug=13,
        detectability="D2",
        breaks="correlated noise must be scaled by the strategy's sensitivity over every participation a record "
        "makes (⌈T/b⌉ here); it is scaled by the single-participation sensitivity, the largest column norm",
        how="the privatizer's stddev is σ·l2_norm_bound·sensitivity.single_participation_sensitivity(C).",
    ),
    "mismatched_noising": dict(
        bug=15,
        detectability="D3",
        breaks="the noise must be drawn with the inverse of the strategy the sensitivity and the accountant use; "
        "it is drawn with the inverse of another strategy",
        how="the privatizer's noising matrix is jnp.linalg.inv of the unbanded Toeplitz square root "
        "(optimal_max_error_strategy_coefs(T)) while sens and the claim are the banded strategy's.",
    ),
}



class DenseMatrixFactorization(Implementation):
    """JAX-Privacy's dense ``matrix_factorization_privatizer`` path, run ``kind`` (:data:`KINDS`)."""

    def __init__(self, info: ImplementationInfo, kind: str = "correct") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown dense matrix-factorization run {kind!r}; expected one of {', '.join(KINDS)}")
        self.info = info
        self.kind = kind

    def unavailable_reason(self) -> str | None:
        """Also ``n/a`` before JAX-Privacy 2.0.0, whose ``matrix_factorization_privatizer`` and batch selection
        this path calls."""
        from dpverify_jaxprivacy._releases import missing_since_2

        return super().unavailable_reason() or missing_since_2(
            self.info.name, "noise_addition.matrix_factorization_privatizer and batch_selection.CyclicPoissonSampling(cycle_length=...)"
        )

    def train(self, request: TrainingRequest) -> TrainedModel:
        hp = request.hyperparameters
        cycle = cycle_length(hp.sampling_rate)
        structure = strategy(hp.steps)
        sigma, claim = noise_and_claim(
            self.info.name,
            "dp_accounting",
            hp,
            calibrate=lambda: _calibrated_sigma(hp.target_epsilon, hp.delta),
            claim=lambda sigma: _claim(sigma, hp.delta, structure),
        )
        from dpverify_jaxprivacy import _device
        from dpverify_jaxprivacy._mf_training import train_with_privatizer

        sens = _noise_sensitivity(self.kind, hp.steps, cycle)
        try:
            predict = train_with_privatizer(
                request, noising_matrix=_noising_matrix(self.kind, hp.steps), stddev_per_bound=sigma * sens, cycle_length=cycle
            )
        except (FloatingPointError, ValueError) as exc:
            raise RuntimeError(f"{self.info.name}: {exc}") from exc
        return TrainedModel(predict_log_proba=predict, claim=claim, device=_device())


def cycle_length(sampling_rate: float) -> int:
    """b = 1/q, the batches of a cycle (each record in one of them); a ``ValueError`` when 1/q is no whole number."""
    cycle = round(1.0 / sampling_rate)
    if not math.isclose(cycle * sampling_rate, 1.0, rel_tol=1e-9):
        raise ValueError(
            f"dense matrix factorization here trains fixed cyclic batches, a record every 1/q steps: sampling_rate "
            f"must be 1/b for a whole b (1, 0.5, 0.1, ...), got {sampling_rate}"
        )
    return cycle


@functools.lru_cache(maxsize=32)
def _toeplitz(bands: int, steps: int):
    """The ``bands``-coefficient Toeplitz square root of the prefix sum as a dense ``steps`` × ``steps`` matrix
    (a jax array, float32 as the library builds it)."""
    from jax_privacy.matrix_factorization import toeplitz

    return toeplitz.materialize_lower_triangular(toeplitz.optimal_max_error_strategy_coefs(bands), n=steps)


def strategy(steps: int):
    """The accounted strategy C of a ``steps``-step run as the claim states it: ``NoiseStructure.dense``."""
    import numpy as np

    from dpverify.stats.correlated import NoiseStructure

    return NoiseStructure.dense(np.asarray(_toeplitz(min(BANDS, steps), steps), dtype=np.float64))


@functools.lru_cache(maxsize=64)
def _noise_sensitivity(kind: str, steps: int, cycle: int) -> float:
    """The sensitivity the run's stddev is scaled by: the library's min-separation sensitivity for a record every
    ``cycle`` steps, ⌈steps/cycle⌉ times, or (``single_participation``) its single-participation one."""
    from jax_privacy.matrix_factorization import sensitivity

    c = _toeplitz(min(BANDS, steps), steps)
    if kind == "single_participation":
        return float(sensitivity.single_participation_sensitivity(c))
    return float(sensitivity.get_min_sep_sensitivity_upper_bound(c, min_sep=cycle, max_participations=-(-steps // cycle)))


def _noising_matrix(kind: str, steps: int):
    """C⁻¹ as the run hands it to the privatizer (module docstring): the accounted strategy's inverse, the
    unbanded strategy's, or the accounted one's for the first ⌈steps/2⌉ steps only."""
    import jax.numpy as jnp

    if kind == "mismatched_noising":
        return jnp.linalg.inv(_toeplitz(steps, steps))
    if kind == "short_noising":
        planned = -(-steps // 2)
        return jnp.linalg.inv(_toeplitz(min(BANDS, planned), planned))
    return jnp.linalg.inv(_toeplitz(min(BANDS, steps), steps))


@functools.lru_cache(maxsize=64)
def _calibrated_sigma(target_epsilon: float, delta: float) -> float:
    import dp_accounting

    return float(
        dp_accounting.calibrate_dp_mechanism(
            dp_accounting.pld.PLDAccountant, dp_accounting.GaussianDpEvent, target_epsilon, delta
        )
    )


@functools.lru_cache(maxsize=64)
def _epsilon(sigma: float, delta: float) -> float:
    import dp_accounting

    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    return float(accountant.get_epsilon(delta))


def _claim(sigma: float, delta: float, structure) -> PrivacyClaim:
    """``GaussianDpEvent(σ)`` of the whitened updates with the strategy beside it (infinite ε without noise)."""
    import dp_accounting

    return PrivacyClaim(
        epsilon=float("inf") if sigma == 0 else _epsilon(sigma, delta),
        delta=delta,
        accountant="dp_accounting.pld (GaussianDpEvent of the whitened updates)",
        dp_event=dp_accounting.GaussianDpEvent(sigma),
        noise_structure=structure,
    )


#: The upstream change that makes the dense privatizer refuse to read past its noising matrix's rows.
PAST_ROWS_REFUSED = "https://github.com/google-deepmind/jax_privacy/pull/338"


def implementations() -> list[Implementation]:
    """``jax-privacy-dense-mf``, its two variants and the release's known issue ``short_noising`` (module
    docstring)."""
    correct = DenseMatrixFactorization(ImplementationInfo(name="jax-privacy-dense-mf", notes=_NOTES, **_LIBRARY))
    variants = [
        DenseMatrixFactorization(
            ImplementationInfo(
                name=f"jax-privacy-dense-mf-{kind.replace('_', '-')}",
                expected="violation",
                breaks=row["breaks"],
                bug=row["bug"],
                detectability=row["detectability"],
                notes=f"{row['how']} The claim is the correct run's. " + _NOTES,
                **_LIBRARY,
            ),
            kind,
        )
        for kind, row in _VARIANTS.items()
    ]
    past_rows = DenseMatrixFactorization(
        ImplementationInfo(
            name="jax-privacy-dense-mf-short-noising",
            expected="known-issue",
            issue=PAST_ROWS_REFUSED,
            bug=15,
            notes="the library as it ships, its privatizer given a noising matrix of ⌈T/2⌉ rows (the accounted "
            "banded strategy's leading block) for a T-step run: JAX-Privacy 2.0.0 reads the last row again, from the "
            "same key, at every later step, so those steps repeat one noise vector. The claim is the correct run's. "
            + _NOTES,
            **_LIBRARY,
        ),
        "short_noising",
    )
    return [correct, *variants, past_rows]
