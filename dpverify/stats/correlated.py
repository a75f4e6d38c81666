r"""Correlated noise as the adversary of every update sees it: the strategy, its sensitivity, and the
decorrelating Neyman–Pearson score.

Matrix-factorization training (JAX-Privacy's BandMF and ``matrix_factorization_privatizer``, TF-Privacy's
DP-FTRL with tree aggregation) releases, per model coordinate, the update sequence

.. math::

    y = G + \tau\, C^{-1} Z, \qquad Z \sim N(0, I_T),

where G (steps T) stacks the clipped, summed gradients in clip norms, C (T × T, lower-triangular) is the
strategy (encoder) and τ the noise standard deviation in clip norms. The release is post-processing of
the Gaussian mechanism x ↦ Cx + τZ (multiply by the public C^{-1}), and conversely the adversary that sees
every update sees Cy = CG + τZ: it can decorrelate. A canary whose clipped gradient at step t is g_t
(zero at the steps it cannot take part in) moves the whitened release by C·g, so its sensitivity is ‖Cg‖
and its Gaussian-DP μ is ‖Cg‖/τ; with a unit gradient at the steps S, ‖C u_S‖/τ, the column sums of C over
S. The claim of a library bounds the worst case of that over its participation pattern:

- BandMF (``BandMFExecutionPlanConfig``): C banded Toeplitz from ``strategy`` coefficients, τ = σ·‖coef‖
  (the largest column norm), cyclic Poisson batches every ``num_bands`` steps, and
  ``amplified_bandmf_event`` composes ⌈T/b⌉ Poisson-sampled Gaussians of σ: μ = √⌈T/b⌉/σ before
  amplification. Columns b or more steps apart are orthogonal, so the per-participation parts are
  independent (:func:`min_separation_sensitivity` is then exact).
- A dense ``matrix_factorization_privatizer``: C as given, τ = σ·sens(C) with the library's min-separation
  sensitivity for several participations, one ``GaussianDpEvent(σ)``: μ = 1/σ.
- DP-FTRL (``DPFTRLTreeAggregationOptimizer``): TF-Privacy's efficient tree (Honaker) releases the
  residual of noisy prefix sums, so the updates' noise is σ·L·Z with L the tree's linear map; its C is
  the inverse of L Lᵀ's Cholesky factor (:meth:`NoiseStructure.tree_aggregation`). The accountant
  (``compute_rdp_tree_restart``) counts the whole tree, ⌊log₂ P⌋ + 1 nodes per epoch of P steps, which
  the updates do not all show: :func:`tree_restart_claimed_mu` is the claim, ‖C u_S‖/σ what it reaches.

Units: clip norms, the released update divided by the clipped sum's sensitivity s. JAX-Privacy's
``clipped_grad`` divides the sum by ``normalize_by`` and reports s = (1 with ``rescale_to_unit_norm``, else
``l2_clip_norm``)/``normalize_by`` (twice that under REPLACE_ONE; the plan's default accountant is
REPLACE_SPECIAL), and the plan's privatizer adds noise of stddev σ·s·‖coef‖ — so τ = σ·‖coef‖, or σ with
``column_normalize`` (unit-norm coef, unit columns). TF-Privacy's tree adds node noise σ·``l2_norm_clip``
to the clipped sum before the optimizer divides by ``num_microbatches``: τ = σ.

Layout: as :class:`~dpverify.canaries.updates.DiracUpdates` reads them, one row per canary and one column
per step: ``released`` (m, T) or (m, T, K) with K the coordinates a canary owns (a Dirac canary's column
of the softmax weights), ``gradients`` of the same shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpverify._validation import check_int, check_real
from dpverify.stats.scoring import subsampled_gaussian_log_likelihood_ratio

#: The level below which :func:`structure_fit` refutes the stated structure, and the audit scores by the
#: estimated one instead (:func:`scoring_structure`). It is not the audit's level: either score keeps that.
STRUCTURE_FIT_LEVEL = 1e-3
#: The fewest untouched coordinates per step from which :func:`scoring_structure` estimates a structure: the
#: plug-in score's variance is about 1 + T/K, so at K ≥ 4T it keeps at least 0.89 of the exact score's μ.
UNTOUCHED_PER_STEP = 4
#: The floor of the audit's estimate (:func:`estimated_structure`): noise 10⁻³ of its typical s.d. where the
#: untouched coordinates show none, far below what any correct run's estimate resolves at K ≫ T.
ESTIMATE_FLOOR = 1e-6

__all__ = [
    "NoiseStructure",
    "bandmf_claimed_mu",
    "bandwidth",
    "cyclic_log_likelihood_ratio",
    "canary_mu",
    "decorrelated_log_likelihood_ratio",
    "estimated_structure",
    "min_separation_sensitivity",
    "optimal_max_error_coefficients",
    "scoring_structure",
    "sensitivity",
    "ESTIMATE_FLOOR",
    "STRUCTURE_FIT_LEVEL",
    "StructureFit",
    "UNTOUCHED_PER_STEP",
    "structure_fit",
    "tree_restart_claimed_mu",
    "whitened_statistic",
]


@dataclass(frozen=True, eq=False)
class NoiseStructure:
    r"""The strategy C (T × T, lower-triangular, finite, non-zero diagonal) whose inverse correlates the
    released updates' noise: y = G + τ C^{-1} Z (module docstring). Build it with the constructor named
    for what a library ships; the matrix is validated at the door and kept read-only."""

    strategy: np.ndarray

    def __post_init__(self) -> None:
        c = np.array(self.strategy, dtype=np.float64)
        if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] == 0:
            raise ValueError(f"strategy must be a square (steps × steps) matrix, got shape {np.shape(self.strategy)}")
        if not np.all(np.isfinite(c)):
            raise ValueError("strategy must be finite, got NaN or infinite entries")
        above = np.triu(c, k=1)
        if np.any(above != 0):
            i, j = np.argwhere(above != 0)[0]
            raise ValueError(
                f"strategy must be lower-triangular (noise at a step cannot depend on later steps), got "
                f"{c[i, j]:g} at row {i}, column {j}"
            )
        diagonal = np.abs(np.diag(c))
        if np.any(diagonal <= np.finfo(float).eps * max(1.0, float(np.abs(c).max()))):
            raise ValueError(
                f"strategy must be invertible, got a zero diagonal entry at step {int(np.argmin(diagonal))}"
            )
        c.setflags(write=False)
        object.__setattr__(self, "strategy", c)

    def __eq__(self, other: object) -> bool:
        """Structures are equal when their strategies are (two runs of one seed state equal claims)."""
        return isinstance(other, NoiseStructure) and np.array_equal(self.strategy, other.strategy)

    def __hash__(self) -> int:
        return hash((self.strategy.shape, self.strategy.tobytes()))

    @property
    def steps(self) -> int:
        return self.strategy.shape[0]

    @classmethod
    def dense(cls, strategy) -> "NoiseStructure":
        """A dense strategy C, as ``matrix_factorization_privatizer`` takes it (its noising matrix is C⁻¹)."""
        return cls(strategy=np.asarray(strategy, dtype=np.float64))

    @classmethod
    def independent(cls, *, steps: int) -> "NoiseStructure":
        """C = I: DP-SGD's independent noise."""
        return cls(strategy=np.eye(check_int("steps", steps, low=1)))

    @classmethod
    def banded_toeplitz(cls, coefficients, *, steps: int, column_normalize: bool = False) -> "NoiseStructure":
        """JAX-Privacy's banded Toeplitz strategy (``toeplitz.materialize_lower_triangular``; BandMF's
        ``strategy``): C[i, j] = coef[i − j] for 0 ≤ i − j < len(coef). ``column_normalize`` rescales each
        column to unit norm, as ``inverse_as_streaming_matrix(coef, column_normalize_for_n=steps)`` does."""
        steps = check_int("steps", steps, low=1)
        coef = np.asarray(coefficients, dtype=np.float64)
        if coef.ndim != 1 or coef.size == 0:
            raise ValueError(f"coefficients must be a non-empty 1-D array, got shape {coef.shape}")
        if coef.size > steps:
            raise ValueError(f"coefficients must number at most steps={steps} (the bands), got {coef.size}")
        lag = np.subtract.outer(np.arange(steps), np.arange(steps))
        padded = np.concatenate([coef, np.zeros(steps - coef.size)])
        c = np.where(lag >= 0, padded[np.clip(lag, 0, steps - 1)], 0.0)
        if column_normalize:
            norms = np.linalg.norm(c, axis=0)
            c = c / np.where(norms > 0, norms, 1.0)
        return cls(strategy=c)

    @classmethod
    def tree_aggregation(
        cls, *, steps: int, restart_period: int | None = None, restart_warmup: int | None = None
    ) -> "NoiseStructure":
        r"""TF-Privacy's DP-FTRL (``DPFTRLTreeAggregationOptimizer``): ``TreeResidualSumQuery`` with the
        efficient (Honaker) tree, restarted as ``PeriodicRoundRestartIndicator(period, warmup)`` does.

        Step t releases x_t + N_t − N_{t−1}, N_t the tree's noise of the prefix sum up to t (N = 0 before
        a tree's first step), with N_t = Σ_levels w_l·node_l, w_l = 1/(2 − 2^{−l}) and each new node
        ½(left + right) + fresh noise (``EfficientTreeAggregator``). That is linear in the unit Gaussians
        the tree draws: the updates' noise is σ·L·Z. Its covariance L Lᵀ = M Mᵀ (Cholesky, M
        lower-triangular), and C = M⁻¹ whitens it exactly; τ is the library's σ (clip norms)."""
        steps = check_int("steps", steps, low=1)
        noise_map = _tree_restart_noise_map(steps, _tree_epochs(steps, restart_period, restart_warmup))
        cholesky = np.linalg.cholesky(noise_map @ noise_map.T)
        return cls(strategy=np.tril(np.linalg.inv(cholesky)))


    @classmethod
    def binary_tree(cls, *, steps: int, tree_steps: int) -> "NoiseStructure":
        r"""The binary mechanism of continual release (Chan, Shi and Song, 2011) as opacus-dpcr runs it:
        dpcrpy's ``BinMech(k)`` over blocks of ``tree_steps`` = 2^k steps, restarted after each block by
        ``dpCrFw`` (the next block's prefix sums start from the last one released, with fresh noise).

        Node t of a block (1-indexed) sums the steps (t − lowbit(t), t] plus fresh noise; the released prefix
        sum up to t is the sum of the nodes of t's binary decomposition, and the updates are its
        differences. The nodes are A·x + τZ with A the 0/1 node matrix, A[t, s] = 1 for s in
        (t − lowbit(t), t], and the prefix sums a linear bijection of them, so the updates are
        y = A⁻¹(Ax + τZ) = x + τA⁻¹Z: C = A exactly (lower-triangular, unit diagonal), one block per tree,
        the last one cut to its first rows (a tree's first t nodes are complete after its t-th step).
        A record in every step of a tree touches node t lowbit(t) times: ‖C·1‖² = Σ_t lowbit(t)² per
        tree, against the k + 1 nodes of a record in one step that the tree's noise is scaled for."""
        steps = check_int("steps", steps, low=1)
        tree_steps = check_int("tree_steps", tree_steps, low=1)
        if tree_steps & (tree_steps - 1):
            raise ValueError(f"tree_steps must be a power of 2 (BinMech(k) spans 2^k steps), got {tree_steps}")
        local = np.arange(steps) % tree_steps + 1  # each step's position in its tree, from 1
        lowbit = local & -local
        t, s = np.arange(steps)[:, None], np.arange(steps)[None, :]
        same_tree = t // tree_steps == s // tree_steps
        return cls(strategy=(same_tree & (s <= t) & (s > t - lowbit[:, None])).astype(np.float64))


def optimal_max_error_coefficients(bands: int) -> np.ndarray:
    """The leading ``bands`` coefficients of the Toeplitz square root of the prefix sum (Fichtenberger,
    Henzinger and Upadhyay; JAX-Privacy's ``toeplitz.optimal_max_error_strategy_coefs``), a decaying strategy
    to band."""
    k = np.arange(check_int("bands", bands, low=1), dtype=np.float64)
    ratios = np.ones_like(k)
    ratios[1:] = (2 * k[1:] - 1) / (2 * k[1:])
    return np.cumprod(ratios)


def _tree_epochs(steps: int, period: int | None, warmup: int | None) -> list[int]:
    """The lengths of the trees between restarts (``PeriodicRoundRestartIndicator``: a restart after call
    n when n mod period == warmup)."""
    if period is None:
        if warmup is not None:
            raise ValueError(f"restart_warmup needs a restart_period, got restart_warmup={warmup} and no period")
        return [steps]
    period = check_int("restart_period", period, low=1)
    if warmup is not None:
        check_int("restart_warmup", warmup, low=1, high=period - 1)
    ends = [n for n in range(1, steps + 1) if n % period == (warmup or 0)]
    bounds = [0] + ends + ([steps] if not ends or ends[-1] != steps else [])
    return [b - a for a, b in zip(bounds, bounds[1:])]


def _tree_restart_noise_map(steps: int, epochs: list[int]) -> np.ndarray:
    """L (steps × draws): the updates' noise in unit Gaussians, one efficient tree per epoch."""
    blocks = []
    for length in epochs:
        prefix = _efficient_tree_prefix_noise(length)
        blocks.append(np.diff(prefix, axis=0, prepend=np.zeros((1, prefix.shape[1]))))
    out = np.zeros((steps, sum(b.shape[1] for b in blocks)))
    row = column = 0
    for block in blocks:
        out[row : row + block.shape[0], column : column + block.shape[1]] = block
        row, column = row + block.shape[0], column + block.shape[1]
    return out


def _efficient_tree_prefix_noise(steps: int) -> np.ndarray:
    """N_t (steps × draws) of ``EfficientTreeAggregator``, replayed on coefficient vectors."""
    draws = 2 * steps + 1
    unit = np.eye(draws)
    buffer: list[tuple[int, np.ndarray]] = [(0, unit[0])]  # (level, node) from the lowest level
    drawn = 1
    rows = []
    for _ in range(steps):
        rows.append(sum(node / (2.0 - 0.5**level) for level, node in buffer))
        new, drawn = unit[drawn], drawn + 1
        level = 0
        while level < len(buffer) and buffer[level][0] == level:
            new = 0.5 * (buffer[level][1] + new) + unit[drawn]
            drawn += 1
            level += 1
        buffer = [(level, new)] + buffer[level:]
    return np.array(rows)[:, :drawn]


def sensitivity(structure: NoiseStructure, participation) -> float:
    """‖C u_S‖: the whitened shift of one unit contribution at each step of ``participation`` (step indices
    or a boolean mask over the steps)."""
    return float(np.linalg.norm(structure.strategy @ _indicator(structure.steps, participation)))


def _indicator(steps: int, participation) -> np.ndarray:
    given = np.asarray(participation)
    if given.dtype == bool:
        if given.shape != (steps,):
            raise ValueError(f"a participation mask must have shape ({steps},), got {given.shape}")
        return given.astype(np.float64)
    indices = given.astype(np.int64).ravel()
    if indices.size == 0 or np.any(indices < 0) or np.any(indices >= steps) or np.unique(indices).size != indices.size:
        raise ValueError(f"participation must name distinct steps in [0, {steps}), got {given.tolist()}")
    u = np.zeros(steps)
    u[indices] = 1.0
    return u


def bandwidth(structure: NoiseStructure) -> int:
    """b: one more than the largest lag i − j with C[i, j] ≠ 0 (1 for a diagonal C, BandMF's ``num_bands``)."""
    rows, columns = np.nonzero(structure.strategy)
    return int(np.max(rows - columns)) + 1


def min_separation_sensitivity(
    structure: NoiseStructure, *, min_separation: int, max_participations: int | None = None
) -> float:
    r"""The largest ‖C u_S‖ over S with steps at least ``min_separation`` apart (BandMF's cyclic Poisson:
    min_separation = num_bands) and at most ``max_participations`` of them (default ⌈T/min_separation⌉),
    for unit contributions of any direction.

    ‖C Σ_{i∈S} e_i g_iᵀ‖²_F = Σ_{i,j∈S} X_ij ⟨g_i, g_j⟩ with X = CᵀC. When X_ij = 0 for |i − j| ≥
    min_separation (C with at most min_separation bands) this is Σ_{i∈S} X_ii, maximised exactly by a
    dynamic programme over S (the VecSens of Choquette-Choo et al., 2023). Otherwise the bound
    Σ_{i,j∈S} |X_ij| ≤ max_S Σ_{i∈S} max_{S'} Σ_{j∈S'} |X_ij| is returned, as JAX-Privacy's
    ``get_min_sep_sensitivity_upper_bound`` computes it."""
    steps = structure.steps
    min_separation = check_int("min_separation", min_separation, low=1, high=steps)
    limit = -(-steps // min_separation)
    if max_participations is not None:
        limit = min(limit, check_int("max_participations", max_participations, low=1))
    gram = structure.strategy.T @ structure.strategy
    lag = np.abs(np.subtract.outer(np.arange(steps), np.arange(steps)))
    if np.all(gram[lag >= min_separation] == 0):
        return math.sqrt(_best_separated_sum(np.diag(gram), min_separation, limit))
    rows = np.array([_best_separated_sum(row, min_separation, limit) for row in np.abs(gram)])
    return math.sqrt(_best_separated_sum(rows, min_separation, limit))


def _best_separated_sum(values: np.ndarray, separation: int, limit: int) -> float:
    """max Σ_{i∈S} values_i over S with gaps ≥ separation and |S| ≤ limit (values ≥ 0 here)."""
    best = np.zeros(values.size + separation)
    for _ in range(limit):
        best[: values.size] = values + best[separation:]
        best = np.maximum.accumulate(best[::-1])[::-1]
    return float(best[0])


def bandmf_claimed_mu(*, noise_multiplier: float, steps: int, num_bands: int) -> float:
    """μ of ``amplified_bandmf_event`` before amplification: ⌈T/b⌉ Gaussians of σ, √⌈T/b⌉/σ (a record in
    every batch of its group; Poisson sampling at rate q is the curve's amplification, not μ's)."""
    sigma = check_real("noise_multiplier", noise_multiplier, low=0.0, low_open=True)
    rounds = -(-check_int("steps", steps, low=1) // check_int("num_bands", num_bands, low=1))
    return math.sqrt(rounds) / sigma


def tree_restart_claimed_mu(*, noise_multiplier: float, epoch_steps) -> float:
    """μ of ``compute_rdp_tree_restart``: a Gaussian of sensitivity² Σ_epochs (⌊log₂ P⌋ + 1) and σ."""
    sigma = check_real("noise_multiplier", noise_multiplier, low=0.0, low_open=True)
    depths = [math.floor(math.log2(check_int("epoch_steps", p, low=1))) + 1 for p in np.atleast_1d(epoch_steps)]
    return math.sqrt(sum(depths)) / sigma


def _checked_pair(released, gradients, steps: int) -> tuple[np.ndarray, np.ndarray]:
    released = np.asarray(released, dtype=np.float64)
    gradients = np.asarray(gradients, dtype=np.float64)
    if released.shape != gradients.shape:
        raise ValueError(f"released and gradients must have one shape, got {released.shape} and {gradients.shape}")
    if released.ndim not in (2, 3) or released.shape[1] != steps:
        raise ValueError(
            f"released must be (canaries, steps={steps}) or (canaries, steps={steps}, coordinates), got {released.shape}"
        )
    if not (np.all(np.isfinite(released)) and np.all(np.isfinite(gradients))):
        raise ValueError("released and gradients must be finite, got NaN or infinite values")
    if released.ndim == 2:
        return released[:, :, None], gradients[:, :, None]
    return released, gradients


def _whiten(structure: NoiseStructure, series: np.ndarray) -> np.ndarray:
    """C applied along the steps of (m, T, K) series."""
    return np.einsum("ts,msk->mtk", structure.strategy, series, optimize=True)


def canary_mu(gradients, *, structure: NoiseStructure, noise_stddev: float) -> np.ndarray:
    """Each canary's μ = ‖C g‖_F/τ if it takes part in every step where its gradient is non-zero."""
    tau = check_real("noise_stddev", noise_stddev, low=0.0, low_open=True)
    g = np.asarray(gradients, dtype=np.float64)
    _, g = _checked_pair(g, g, structure.steps)
    return np.sqrt(np.sum(_whiten(structure, g) ** 2, axis=(1, 2))) / tau


def whitened_statistic(released, gradients, *, structure: NoiseStructure, noise_stddev: float) -> np.ndarray:
    r"""Each canary's z = ⟨Cg, Cy⟩_F/(τ‖Cg‖_F): N(0, 1) for a canary that took no part, N(μ, 1) with
    μ = ‖Cg‖_F/τ for one that took part in every step of g (module docstring); 0 where g = 0.

    Why: Cy = CG + τZ with Z white, so the log-likelihood ratio of "Cg was added" is
    ⟨Cg, Cy⟩/τ² − ‖Cg‖²/(2τ²) = μz − μ²/2, a monotone function of z (Neyman–Pearson). Equivalently
    z = gᵀΣ⁻¹y/√(gᵀΣ⁻¹g) with Σ = τ²(CᵀC)⁻¹ the updates' noise covariance. With K coordinates per canary
    (a Dirac canary's column) the inner products run over steps and coordinates, so a gradient whose
    direction changes between steps is scored exactly; (m, T) input is the case K = 1, exact when the
    canary's direction is the same at every step."""
    tau = check_real("noise_stddev", noise_stddev, low=0.0, low_open=True)
    y, g = _checked_pair(released, gradients, structure.steps)
    signal = _whiten(structure, g)
    norm = np.sqrt(np.sum(signal**2, axis=(1, 2)))
    inner = np.sum(signal * _whiten(structure, y), axis=(1, 2))
    return np.divide(inner, tau * norm, out=np.zeros_like(inner), where=norm > 0)


def decorrelated_log_likelihood_ratio(
    released, gradients, *, structure: NoiseStructure, noise_stddev: float, sampling_rate: float = 1.0
) -> np.ndarray:
    r"""Each canary's log-likelihood ratio of "member" against "non-member" from every released update,
    under the stated structure; with C = I it is today's
    :func:`~dpverify.stats.scoring.subsampled_gaussian_log_likelihood_ratio` exactly.

    ``gradients`` are the canary's clipped gradients (clip norms) at each step it may take part in and 0
    elsewhere (for cyclic Poisson, the steps of its group); a member takes part in each independently with
    probability q = ``sampling_rate``.

    - q = 1: μz − μ²/2 with z, μ of :func:`whitened_statistic`, the Neyman–Pearson score.
    - q < 1: the steps' whitened projections r_i = (Ce_i)ᵀ(Cy)g_i/(‖Ce_i‖‖g_i‖) ~ N(‖Ce_i‖‖g_i‖·1{i∈S}, τ²)
      enter Σ_i log(1 − q + q·exp((c_i r_i − c_i²/2)/τ²)), c_i = ‖Ce_i‖‖g_i‖. When the columns Ce_i of the
      canary's steps are orthogonal (BandMF at min-separation ≥ num_bands) the r_i are independent and the
      rest of Cy is pure noise, so this is the exact likelihood ratio; otherwise it is a valid score that
      ignores the steps' overlap (a wrong model costs power, never soundness)."""
    q = check_real("sampling_rate", sampling_rate, low=0.0, high=1.0, low_open=True)
    tau = check_real("noise_stddev", noise_stddev, low=0.0, low_open=True)
    if q == 1:
        z = whitened_statistic(released, gradients, structure=structure, noise_stddev=tau)
        mu = canary_mu(gradients, structure=structure, noise_stddev=tau)
        return mu * z - mu**2 / 2
    signal, projection = _step_projections(*_checked_pair(released, gradients, structure.steps), structure)
    return subsampled_gaussian_log_likelihood_ratio(signal, projection, noise_multiplier=tau, sampling_rate=q)


def _step_projections(y: np.ndarray, g: np.ndarray, structure: NoiseStructure) -> tuple[np.ndarray, np.ndarray]:
    """(c_i, r_i), each (m, T): the steps' signals ‖Ce_i‖‖g_i‖ and whitened projections (see
    :func:`decorrelated_log_likelihood_ratio`)."""
    c = structure.strategy
    back = np.einsum("ts,mtk->msk", c, _whiten(structure, y), optimize=True)  # Cᵀ C y, one row per step
    signal = np.linalg.norm(c, axis=0)[None, :] * np.linalg.norm(g, axis=2)
    along = np.sum(back * g, axis=2)
    return signal, np.divide(along, signal, out=np.zeros_like(along), where=signal > 0)


def cyclic_log_likelihood_ratio(
    released, gradients, *, structure: NoiseStructure, noise_stddev: float, cycle: int, sampling_rate: float = 1.0
) -> np.ndarray:
    r"""Each canary's log-likelihood ratio when a member takes part only in the steps of one of ``cycle``
    phases (t ≡ j mod ``cycle``), j uniform and independent per record and unseen by the auditor: JAX-Privacy's
    cyclic Poisson sampling, ``partition_type=INDEPENDENT``.

    Given the phase, the member's likelihood ratio Λ_j is :func:`decorrelated_log_likelihood_ratio` of its
    gradients at that phase's steps only; the phase unseen, the ratio is the mixture
    log((1/b) Σ_j exp Λ_j) (logsumexp, b = ``cycle``), the Neyman–Pearson score of the run as it is. The claim
    (``amplified_bandmf_event``) bounds an adversary who knows the phase, so this score stays below it even
    for a correct run: the share it reaches is the perfect attacker's ceiling, not a defect."""
    cycle = check_int("cycle", cycle, low=1, high=structure.steps)
    q = check_real("sampling_rate", sampling_rate, low=0.0, high=1.0, low_open=True)
    tau = check_real("noise_stddev", noise_stddev, low=0.0, low_open=True)
    y, g = _checked_pair(released, gradients, structure.steps)
    at_phase = [(np.arange(structure.steps) % cycle == j)[None, :] for j in range(cycle)]
    if q < 1:  # the steps' projections do not depend on the phase: whiten once, sum each phase's steps
        signal, projection = _step_projections(y, g, structure)
        ratios = np.stack(
            [subsampled_gaussian_log_likelihood_ratio(signal * mask, projection * mask, noise_multiplier=tau, sampling_rate=q) for mask in at_phase]
        )
    else:
        ratios = np.stack(
            [decorrelated_log_likelihood_ratio(y, np.where(mask[:, :, None], g, 0.0), structure=structure, noise_stddev=tau) for mask in at_phase]
        )
    top = ratios.max(axis=0)
    return top + np.log(np.mean(np.exp(ratios - top), axis=0))


def estimated_structure(untouched, *, floor: float = 0.0) -> NoiseStructure:
    r"""The structure the noise itself shows in coordinates no record touches (the audit scores by it when
    the untouched noise refutes the stated one: :func:`scoring_structure`).

    ``untouched`` (K, T): the released update sequences of K coordinates that no record's gradient reaches,
    pure noise i.i.d. across coordinates with covariance Σ = τ²(CᵀC)⁻¹. The empirical Σ̂ = UᵀU/K (the mean
    is known to be 0) = M̂M̂ᵀ (Cholesky), and Ĉ = M̂⁻¹ whitens the updates to unit noise: score with
    ``noise_stddev=1``. The plug-in statistic is N(0, 1) only as K/T grows (its variance is about
    1 + T/K), so give K ≫ T; K ≤ T leaves Σ̂ singular and raises. ``floor`` φ > 0 whitens by
    Σ̂ + φ·(tr Σ̂/T)·I instead, which a combination of steps without noise (a noise stream that repeats
    itself) leaves invertible: what the updates show there is then weighed at 1/√φ of their typical noise
    rather than refused."""
    floor = check_real("floor", floor, low=0.0)
    u = _untouched_series(untouched)
    if u.shape[0] <= u.shape[1]:
        raise ValueError(
            f"estimating the noise's correlation over {u.shape[1]} steps needs more untouched coordinates than "
            f"steps, got {u.shape[0]} (give many more: the estimate's error scales as steps/coordinates)"
        )
    covariance = u.T @ u / u.shape[0]
    covariance += floor * np.trace(covariance) / u.shape[1] * np.eye(u.shape[1])
    try:
        cholesky = np.linalg.cholesky(covariance)
    except np.linalg.LinAlgError:
        raise ValueError("the untouched coordinates' noise is degenerate (its covariance is singular): is it noise?") from None
    return NoiseStructure(strategy=np.tril(np.linalg.inv(cholesky)))


def _untouched_series(untouched, steps: int | None = None) -> np.ndarray:
    u = np.asarray(untouched, dtype=np.float64)
    if u.ndim != 2 or (steps is not None and u.shape[1] != steps):
        expected = f"(coordinates, steps={steps})" if steps is not None else "(coordinates, steps)"
        raise ValueError(f"untouched must be {expected}, got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        raise ValueError("untouched must be finite, got NaN or infinite values")
    return u


@dataclass(frozen=True)
class StructureFit:
    r"""The likelihood-ratio test that K untouched coordinates' noise U (K × T) is the stated
    y-noise τC⁻¹Z, i.e. i.i.d. rows of covariance Σ = τ²(CᵀC)⁻¹.

    Whitened by the stated structure, W = U Cᵀ/τ has i.i.d. N(0, I_T) rows under the hypothesis. With
    S = WᵀW/K (the mean is known to be 0), the likelihood ratio against any covariance is
    Λ = K(tr S − log det S − T), and Bartlett's correction ρ = 1 − (2T² + 3T − 1)/(6K(T + 1)) makes ρΛ
    χ² with ν = T(T + 1)/2 degrees of freedom to O(K⁻²) (Anderson, *An Introduction to Multivariate
    Statistical Analysis*, §10.8, with K for n: the mean is known). ``statistic`` is ρΛ (∞ when S is
    singular: some combination of the steps carries no noise), ``p_value`` its χ²_ν tail. Its power is
    against any other covariance, in scale as well as in shape."""

    statistic: float
    degrees_of_freedom: int
    p_value: float


def structure_fit(untouched, *, structure: NoiseStructure, noise_stddev: float) -> StructureFit:
    """:class:`StructureFit` of the untouched coordinates' noise (K × T) against the stated structure and τ."""
    from scipy import stats

    tau = check_real("noise_stddev", noise_stddev, low=0.0, low_open=True)
    u = _untouched_series(untouched, structure.steps)
    k, steps = u.shape
    if k <= steps:
        raise ValueError(f"testing the noise's covariance over {steps} steps needs more untouched coordinates than steps, got {k}")
    whitened = u @ structure.strategy.T / tau
    s = whitened.T @ whitened / k
    sign, log_det = np.linalg.slogdet(s)
    bartlett = 1 - (2 * steps**2 + 3 * steps - 1) / (6 * k * (steps + 1))
    statistic = bartlett * k * (np.trace(s) - log_det - steps) if sign > 0 else math.inf
    freedom = steps * (steps + 1) // 2
    return StructureFit(float(statistic), freedom, float(stats.chi2.sf(statistic, freedom)))


def scoring_structure(untouched, *, stated: NoiseStructure, noise_stddev: float) -> tuple[NoiseStructure, float]:
    r"""``(structure, τ)`` the every-update score decorrelates by: the stated ones, unless the untouched
    coordinates' noise refutes them (:func:`structure_fit` below :data:`STRUCTURE_FIT_LEVEL`) and they number
    at least :data:`UNTOUCHED_PER_STEP` per step, then the structure the noise itself shows
    (:func:`estimated_structure` with :data:`ESTIMATE_FLOOR`, τ = 1): where some combination of the steps
    carries no noise (a noise stream that repeats itself), what the updates show there weighs ~1000 noise s.d.

    Why one score at the audit's whole level, not two at half of it each: the audit's guarantee (UniAud's
    bound on correct guesses, the curve test) holds for guesses made by *any* function of what the mechanism
    released, so long as it does not read the secret bits. The untouched coordinates are part of the release
    (and, in a Dirac design, carry no canary's gradient, members' and non-members' alike), so the score
    chosen here, stated or estimated, is such a function whatever the noise: a true claim is refuted at
    most at the audit's level. The estimate's error (the plug-in score's variance is about 1 + T/K) and a
    correct run's rare switch (at this test's level) cost power only. Noise correlated otherwise than
    stated is then scored as it is, whitened as the run's own perfect attacker would whiten it."""
    u = _untouched_series(untouched, stated.steps)
    if u.shape[0] < UNTOUCHED_PER_STEP * stated.steps:
        return stated, noise_stddev
    if structure_fit(u, structure=stated, noise_stddev=noise_stddev).p_value >= STRUCTURE_FIT_LEVEL:
        return stated, noise_stddev
    return estimated_structure(u, floor=ESTIMATE_FLOOR), 1.0
