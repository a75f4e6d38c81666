"""Crafted neighbouring datasets for two-world audits, each with the probes and the score that expose one
class of bug.

A :class:`TwoWorlds` names the two datasets D and D′ (add/remove: D′ is D plus one record; replace-one:
D′ is D with one record replaced), the probe inputs the auditor queries the black box on, and the score,
a number computed from the black box's log-probabilities on the probes alone, higher meaning "D′". Which
bug class a world targets, and why it should show there, is said by its constructor. Imports numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from dpverify._validation import check_choice, check_int, check_real
from dpverify.contract import RELATIONS, DPHyperparameters

__all__ = [
    "SCORES",
    "RECORD_SCORES",
    "UPDATE_SCORES",
    "WORLDS",
    "TwoWorldConfig",
    "TwoWorlds",
    "World",
    "dataset_size_worlds",
    "fixed_batch_spike",
    "fixed_batch_worlds",
    "spike_log_likelihood_ratio",
    "microbatch_worlds",
    "realised_batch_worlds",
    "register_world",
    "world_names",
    "worst_case_record_worlds",
]

#: ``output_spread``: the standard deviation of the log-probabilities over the classes, averaged over the
#: probes (grows with the size of the last update, noise included); ``target_log_prob``: the log-probability
#: of ``target_class``, averaged over the probes (grows with the target record's pull).
#: ``fixed_batch_spike``: read from every released update, not the final model (see
#: :func:`fixed_batch_worlds`).
SCORES: tuple[str, ...] = ("output_spread", "target_log_prob", "fixed_batch_spike")
#: Scores read from every released update (:attr:`~dpverify.contract.Request.observe_update`): the
#: adversary of such a world sees each step's update, as a DP-SGD claim's accountant assumes.
UPDATE_SCORES: tuple[str, ...] = ("fixed_batch_spike",)
#: Scores that read the differing record's pull on the model, so that their separation between the worlds
#: measures the claimed mechanism (and a noise deficit shows); ``output_spread`` reads the noise's scale,
#: which a correct implementation keeps the same in both worlds.
RECORD_SCORES: tuple[str, ...] = ("target_log_prob",)


@dataclass(frozen=True, kw_only=True, eq=False)
class TwoWorlds:
    """Two neighbouring datasets, the probes and the score of a two-world audit.

    ``features_d``/``labels_d`` is D and ``features_dprime``/``labels_dprime`` is D′; ``relation`` says how
    they neighbour (checked here: D′ is D with one record inserted, anywhere, since the order a trainer is
    handed its records is the auditor's choice; or D with one record replaced). ``targets``
    names the bug class the world is built for and why it shows there. ``public_size`` is the dataset size
    whose q-th part the audit designates as the public normaliser in both worlds (default |D|).
    ``marker_scale`` is the norm of the fixed-batch world's one input point, which its update score divides
    out (:func:`fixed_batch_spike`); ``None`` in the worlds scored on the final model.
    """

    name: str
    relation: str
    features_d: np.ndarray
    labels_d: np.ndarray
    features_dprime: np.ndarray
    labels_dprime: np.ndarray
    num_classes: int
    probes: np.ndarray
    score: str
    target_class: int | None = None
    targets: str = ""
    public_size: int | None = None
    marker_scale: float | None = None

    def __post_init__(self) -> None:
        check_choice("relation", self.relation, RELATIONS)
        check_choice("score", self.score, SCORES)
        if self.observes_updates:
            check_real("marker_scale", self.marker_scale, low=0.0, low_open=True)
        check_int("num_classes", self.num_classes, low=2)
        for name in ("features_d", "features_dprime", "probes"):
            array = getattr(self, name)
            if array.ndim != 2 or array.dtype != np.float32 or array.shape[0] < 1:
                raise ValueError(f"{name} must be a non-empty 2-D float32 array, got {array.shape} {array.dtype}")
        dims = {self.features_d.shape[1], self.features_dprime.shape[1], self.probes.shape[1]}
        if len(dims) != 1:
            raise ValueError(f"D, D′ and the probes must share one feature dimension, got {sorted(dims)}")
        if self.score == "target_log_prob":
            check_int("target_class", self.target_class, low=0, high=self.num_classes - 1)
        if not _neighbours(self.relation, (self.features_d, self.labels_d), (self.features_dprime, self.labels_dprime)):
            raise ValueError(
                f"D′ must be D {'plus one record' if self.relation == 'add_remove' else 'with one record replaced'} "
                f"({self.relation}); got {len(self.labels_d)} and {len(self.labels_dprime)} records that are not"
            )

    @property
    def observes_updates(self) -> bool:
        """Whether the score reads every released update (the trainer must hand them over) rather than
        the final model's log-probabilities on :attr:`probes`."""
        return self.score in UPDATE_SCORES

    @property
    def observed(self) -> str:
        """What the world's adversary sees: ``"every update"`` or ``"final model"``."""
        return "every update" if self.observes_updates else "final model"

    def dataset(self, world: str) -> tuple[np.ndarray, np.ndarray]:
        """``(features, labels)`` of ``world`` ("d" or "dprime")."""
        check_choice("world", world, ("d", "dprime"))
        return (self.features_d, self.labels_d) if world == "d" else (self.features_dprime, self.labels_dprime)

    def score_log_probs(self, log_probs: np.ndarray) -> float:
        """The world's score of one trained model from its log-probabilities on :attr:`probes` (k × C)."""
        if log_probs.shape != (self.probes.shape[0], self.num_classes):
            expected = (self.probes.shape[0], self.num_classes)
            raise ValueError(f"log_probs must have shape {expected}, got {log_probs.shape}")
        if self.observes_updates:
            raise ValueError(f"the {self.name} world scores every released update (score_updates), not the final model")
        if self.score == "output_spread":
            return float(np.mean(np.std(log_probs, axis=1)))
        return float(np.mean(log_probs[:, self.target_class]))

    def score_updates(self, parameters: list[tuple[np.ndarray, ...]], hyperparameters: DPHyperparameters) -> np.ndarray:
        """The world's candidate scores of one run from the parameters its trainer handed over (before the
        first step, then after each): see :func:`fixed_batch_worlds`."""
        if not self.observes_updates:
            raise ValueError(f"the {self.name} world scores the final model (score_log_probs), not its updates")
        return fixed_batch_spike(parameters, hyperparameters, scale=self.marker_scale)


def _neighbours(relation: str, d: tuple[np.ndarray, np.ndarray], dprime: tuple[np.ndarray, np.ndarray]) -> bool:
    (x, y), (xp, yp) = d, dprime
    if y.shape != (x.shape[0],) or yp.shape != (xp.shape[0],) or y.dtype != np.int64 or yp.dtype != np.int64:
        return False
    if relation == "add_remove":
        if xp.shape[0] != x.shape[0] + 1 or xp.shape[1:] != x.shape[1:]:
            return False
        same = np.all(xp[:-1] == x, axis=1) & (yp[:-1] == y)
        inserted = int(np.argmin(same)) if not same.all() else x.shape[0]  # first row where D′ departs from D
        rest = slice(inserted + 1, None)
        return np.array_equal(xp[rest], x[inserted:]) and np.array_equal(yp[rest], y[inserted:])
    differs = np.any(x != xp, axis=1) | (y != yp) if x.shape == xp.shape else None
    return differs is not None and int(differs.sum()) == 1


def dataset_size_worlds(*, records: int = 2, dimension: int = 1, num_classes: int = 4096) -> TwoWorlds:
    """D: ``records`` copies of one point; D′: one copy more. Score: the output spread on that point.

    Targets docs/bugs.md class 7 and Opacus #571/#819: an implementation that normalises the noisy sum by a
    function of the dataset's size (Opacus: expected_batch_size = int(N · 1/len(loader)), with the
    sampling rate and the epoch's step count from len(loader) as well) scales its noise differently in the
    two worlds. The records are identical, so the worlds differ in their size and one clipped gradient only;
    with many classes the noise on the output layer makes the spread of the log-probabilities a norm of
    thousands of coordinates, which concentrates, so a 1.5× change of the normaliser (2 vs 3 records)
    separates the worlds in every run, while the one clipped gradient moves it by no more than DP allows.
    Use few steps and a learning rate for which the noise dominates the initial outputs.
    """
    records = check_int("records", records, low=1)
    dimension = check_int("dimension", dimension, low=1)
    num_classes = check_int("num_classes", num_classes, low=2)
    point = np.ones((1, dimension), dtype=np.float32)
    features = np.repeat(point, records + 1, axis=0)
    labels = np.zeros(records + 1, dtype=np.int64)
    return TwoWorlds(
        name=f"dataset-size-{records}-vs-{records + 1}",
        relation="add_remove",
        features_d=features[:records],
        labels_d=labels[:records],
        features_dprime=features,
        labels_dprime=labels,
        num_classes=num_classes,
        probes=point,
        score="output_spread",
        targets="docs/bugs.md class 7 (Opacus #571, #819): a normaliser, sampling rate or step count derived from N",
    )


def realised_batch_worlds(*, records: int = 1, dimension: int = 1, num_classes: int = 1024) -> TwoWorlds:
    """The dataset-size construction (``records`` copies of a point, D′ one copy more, scored by the spread
    of the log-probabilities), named and sized for a normaliser that reads the *sampled* batch: audit it at
    q < 1 with the normaliser designated (the two-world audit does).

    Targets docs/bugs.md class 7 in its realised-batch form (Opacus #420, #571; TF-Privacy's optimizer divides by
    the number of microbatches it is handed): dividing the noisy sum by the realised batch size B_t scales
    step t's noise by 1/B_t, and B_t is Binomial(N, q) with N = |D| or |D| + 1. With one record in D, D's
    batches hold at most one record and its noise is never scaled down, while D′ has a batch of two with
    probability q² a step; on many outputs the spread measures the noise's size in every run, so those
    steps show (the construction of Opacus #571, taken to q < 1). A designated normaliser keeps the noise
    the same in both worlds, so a correct implementation moves the score only by the clipped gradient.
    """
    world = dataset_size_worlds(records=records, dimension=dimension, num_classes=num_classes)
    return dataclasses.replace(
        world,
        name=f"realised-batch-{records}-vs-{records + 1}",
        targets="docs/bugs.md class 7 (Opacus #420, #571): a noisy sum divided by the realised batch size",
    )


def microbatch_worlds(*, records: int = 2, dimension: int = 2, num_classes: int = 2, scale: float = 10.0) -> TwoWorlds:
    """D: ``records`` − 1 copies of a unit point a (label 0), then x* = ``scale``·e₁ with label 0; D′: (x*, 1)
    inserted first. Probed for log p(1 | x*). ``records`` is even.

    Targets docs/bugs.md class 11 (TF-Privacy's microbatches, accounted with σ as if each record were clipped
    alone): a clipped microbatch mean is one "row", and a record added to a microbatch can turn that row
    from −C to +C, twice the sensitivity C the claim assumes for add/remove (Ponomareva et al. 2023, "How
    to DP-fy ML", §5.6). Records are grouped in the order the trainer receives them, so the added record is
    put first: it shifts every pair. D's last pair, (a, (x*, 0)), is dominated by x*'s large gradient and
    clips to C against class 1 at x*; in D′ the first pair ((x*, 1), a) clips to C towards it and (x*, 0) is
    left over. A per-record clipper sees one extra row of norm C, so a correct implementation stays at the
    claim.
    """
    records = check_int("records", records, low=2)
    if records % 2:
        raise ValueError(f"records must be even for the microbatch world (D is cut into pairs), got {records}")
    dimension = check_int("dimension", dimension, low=2)
    num_classes = check_int("num_classes", num_classes, low=2)
    scale = check_real("scale", scale, low=0.0, low_open=True)
    features = np.zeros((records + 1, dimension), dtype=np.float32)
    features[1:-1, -1] = 1.0  # a: a unit point orthogonal to x*, with a gradient far smaller than x*'s
    features[0, 0] = features[-1, 0] = scale
    labels = np.zeros(records + 1, dtype=np.int64)
    labels[0] = 1
    return TwoWorlds(
        name=f"microbatch-{records}",
        relation="add_remove",
        features_d=features[1:],
        labels_d=labels[1:],
        features_dprime=features,
        labels_dprime=labels,
        num_classes=num_classes,
        probes=features[:1],
        score="target_log_prob",
        target_class=1,
        targets="docs/bugs.md class 11: clipped microbatch means accounted as clipped records (sensitivity 2C, not C)",
    )


def worst_case_record_worlds(
    *,
    records: int = 1,
    dimension: int = 16,
    num_classes: int = 2,
    scale: float = 10.0,
    relation: str = "add_remove",
) -> TwoWorlds:
    """A far-away target x* = ``scale``·e₁, probed for log p(1 | x*). Add/remove: D is ``records`` copies
    of a base point (label 0) and D′ adds (x*, 1). Replace-one: D holds ``records`` − 1 base copies and
    (x*, 0), D′ the same with (x*, 1).

    Targets the noise and clipping rules (docs/bugs.md classes 1-6, 11, 12) with the classic worst case (Nasr et
    al. 2021): x* is large and far from the base points, so its gradient keeps a norm above C at every
    step and its clipped gradient pulls x*'s logit for class 1 the same way each step; the probe is x*
    itself, where that pull is largest. Replace-one flips x*'s label, so the two clipped gradients point
    exactly opposite ways (2C apart: for one input, the loss gradients of two labels differ by the sign of
    the output gradient (p − e_y), which is a multiple of (−1, 1) for two classes). A correct full-batch
    Gaussian mechanism then moves the score by about C (2C) per unit σC of noise each step (μ ≈ √steps/σ,
    2√steps/σ, in the linear regime), so the audit can approach the claim; missing noise or clipping moves
    it far more. ``scale=0`` puts x* at the origin, where the first layer's weights get no gradient and
    their noise does not reach the probe (the power benchmark's setting, with hidden width 1).
    """
    records = check_int("records", records, low=1)
    dimension = check_int("dimension", dimension, low=1)
    num_classes = check_int("num_classes", num_classes, low=2)
    scale = check_real("scale", scale, low=0.0)
    check_choice("relation", relation, RELATIONS)
    base = np.zeros((records, dimension), dtype=np.float32)
    base[:, -1] = 1.0  # the base points sit on the last axis, orthogonal to x*
    target = np.zeros((1, dimension), dtype=np.float32)
    target[0, 0] = scale
    labels = np.zeros(records, dtype=np.int64)
    if relation == "add_remove":
        features_d, labels_d = base, labels
        features_dprime, labels_dprime = np.concatenate([base, target]), np.append(labels, 1)
    else:
        features_d = features_dprime = np.concatenate([base[:-1], target])
        labels_d, labels_dprime = labels, np.append(labels[:-1], 1)
    return TwoWorlds(
        name=f"worst-case-record-{relation}-{records}",
        relation=relation,
        features_d=features_d,
        labels_d=labels_d,
        features_dprime=features_dprime,
        labels_dprime=labels_dprime,
        num_classes=num_classes,
        probes=target,
        score="target_log_prob",
        target_class=1,
        targets="docs/bugs.md classes 1-6, 11, 12: missing or scaled noise, missing or batch-level clipping",
    )


def fixed_batch_worlds(
    *, records: int = 79, dimension: int = 1, num_classes: int = 2, scale: float = 10.0
) -> TwoWorlds:
    """D: ``records`` *markers* (x* = ``scale``·e₁, label 0); D′: D plus the canary (x*, label 1). Scored
    from every released update by :func:`fixed_batch_spike`. Add/remove neighbours: D′ is D with one
    record added, the relation a Poisson accountant's ε is stated for.

    Targets docs/bugs.md class 9 (Opacus ``poisson_sampling=False``, JAX-Privacy's Keras default
    ``poisson_sampling_in_fit=False``, TF-Privacy's ``shuffle().batch(B)`` tutorials; Chua et al. 2024,
    Annamalai et al. 2026): fixed-size batches of a shuffled dataset accounted as Poisson sampling. With two
    classes, x*'s clipped gradient for label 0 and for label 1 point exactly opposite ways whatever the
    model predicts ((p − e₀) and (p − e₁) are multiples of (−1, 1)), so along the canary's direction each
    marker in a batch adds −C and the canary +C. With k·B − 1 markers (``records``; the normaliser is B =
    q·|D′|) cut into k batches an epoch, D's epoch is k − 1 batches of B markers and a last, short one of
    B − 1 (+C against a full batch); D′'s k full batches hold the canary in one of them (+2C). Released
    step by step, D′ shows a 2C spike at an unknown step where D shows C at the epoch's last: far more
    than the Poisson claim allows, whose per-step mixture is the canary's C with probability q. A correct
    Poisson sampler's batch holds Binomial(|D|, q) markers in both worlds, so its spread hides the canary
    exactly as the claim says. ``scale`` keeps every record's gradient clipped while the learning rate is
    small (the designated setting's drift leaves p(1 | x*) above 0.3).
    """
    records = check_int("records", records, low=1)
    dimension = check_int("dimension", dimension, low=1)
    if num_classes != 2:
        raise ValueError(f"the fixed-batch world needs two classes (opposite clipped gradients), got num_classes={num_classes}")
    scale = check_real("scale", scale, low=0.0, low_open=True)
    point = np.zeros((1, dimension), dtype=np.float32)
    point[0, 0] = scale
    features = np.repeat(point, records + 1, axis=0)
    labels = np.zeros(records + 1, dtype=np.int64)
    labels[-1] = 1
    return TwoWorlds(
        name=f"fixed-batch-{records}",
        relation="add_remove",
        features_d=features[:-1],
        labels_d=labels[:-1],
        features_dprime=features,
        labels_dprime=labels,
        num_classes=2,
        probes=point,
        score="fixed_batch_spike",
        targets="docs/bugs.md class 9 (Opacus #80, jax_privacy #84): shuffled fixed-size batches accounted as Poisson",
        public_size=records + 1,
        marker_scale=scale,
    )


def fixed_batch_spike(
    parameters: list[tuple[np.ndarray, ...]], hyperparameters: DPHyperparameters, *, scale: float
) -> np.ndarray:
    r"""A run's scores in the fixed-batch world: log-likelihood ratios of "D′" against "D" under the
    fixed-batch model, summed over epochs (higher means D′), one for each place a trainer leaves the
    remainder (:func:`spike_log_likelihood_ratio`); the two-world test chooses between them on its held-out
    half of the runs.

    Each step's released noisy sum is :math:`g_t = -(\theta_t - \theta_{t-1})\,n/\eta` (normaliser n,
    learning rate η); along the canary's unit clipped direction u = (x*, −x*, 1, −1)/‖·‖ (weights then
    bias), :math:`x_t = \langle g_t, u\rangle / C + B` is 0 for a full batch of markers, plus
    N(0, σ²). Under fixed batches, D gives x = e_k + σZ in each epoch of k steps (the short batch last, as
    a data loader leaves it) and D′ gives 2e_J + σZ with J uniform, so the epoch's log-likelihood ratio is

    .. math:: \log \sum_j e^{(2x_j - 2)/\sigma^2} - (x_k - \tfrac12)/\sigma^2 - \log k.

    Where a trainer drops the remainder instead (D's epoch holds k full batches' worth of markers and no
    short one), the ratio against "D: nothing" drops the last term. The statistics are fixed before any run
    and the test chooses one on runs it does not count, so it is valid whatever the trainer does.
    """
    hp = hyperparameters
    if hp.noise_multiplier is None or hp.noise_multiplier <= 0 or hp.expected_batch_size is None:
        raise ValueError("the fixed-batch score needs a designated noise multiplier > 0 and expected_batch_size")
    shapes = [p.shape for p in parameters[0]] if parameters else []
    if len(shapes) != 2 or len(shapes[0]) != 2 or shapes[0][0] != 2 or shapes[1] != (2,):
        raise ValueError(
            "the fixed-batch world audits softmax regression on two classes: it needs a weight (2, d) and a "
            f"bias (2,) after every step, got parameter shapes {shapes}"
        )
    if len(parameters) != hp.steps + 1:
        raise ValueError(
            f"the trainer handed over {len(parameters)} parameter sets, expected {hp.steps + 1} "
            f"(before the first step and after each of {hp.steps})"
        )
    theta = np.stack([np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in ps]) for ps in parameters])
    point = np.zeros(shapes[0][1])
    point[0] = scale
    direction = np.concatenate([point, -point, [1.0, -1.0]])
    direction /= np.linalg.norm(direction)
    sums = -np.diff(theta, axis=0) * hp.expected_batch_size / hp.learning_rate
    x = sums @ direction / hp.max_grad_norm + hp.expected_batch_size
    return spike_log_likelihood_ratio(x.reshape(hp.epochs, hp.steps_per_epoch), noise_multiplier=hp.noise_multiplier)


def spike_log_likelihood_ratio(x, *, noise_multiplier: float) -> np.ndarray:
    """:func:`fixed_batch_spike`'s statistics of the released sums ``x`` (``(..., epochs, k)``, in clip norms
    above a full batch of markers), ``(..., 2)``: the log-likelihood ratio of "D′: +2 at a uniform step"
    against "D: +1 at the epoch's last" (a data loader's short last batch), and against "D: nothing" (its
    remainder dropped, as an API that refuses a short batch does), each summed over the epochs."""
    x = np.asarray(x, dtype=np.float64)
    sigma2 = check_real("noise_multiplier", noise_multiplier, low=0.0, low_open=True) ** 2
    spike = np.logaddexp.reduce((2.0 * x - 2.0) / sigma2, axis=-1) - math.log(x.shape[-1])
    return np.stack([np.sum(spike - (x[..., -1] - 0.5) / sigma2, axis=-1), np.sum(spike, axis=-1)], axis=-1)


@dataclass(frozen=True, kw_only=True)
class World:
    """A crafted world as the default gate, the configuration and the strategies know it, declared once
    (:func:`register_world`).

    ``maker`` builds its :class:`TwoWorlds` from ``records`` and ``num_classes``. ``bugs``: the docs/bugs.md classes it
    is built to expose; the gate runs it on the buggy variants of these rows (and on every implementation
    expected to be private that has what it ``needs``). ``quick_setting``: what the default gate designates
    in it at the quick profile (runs per world, records, outputs, σ, q, epochs, learning rate).
    ``normaliser``: ``"designated"`` (the audit designates a public normaliser for both datasets) or
    ``"batch_size"`` (the batch size of fixed batches, q·|D′|: an API that divides by its own batch size takes
    it as it is). ``needs``: the :class:`~dpverify.contract.ImplementationInfo` flags an implementation
    expected private must set to get it (the microbatch world: ``microbatches``; the fixed-batch world:
    ``amplified``). ``once_per_sampler``: its
    question is the sampler's alone, so the gate runs it once per
    :attr:`~dpverify.contract.ImplementationInfo.sampler`. ``full_batch_blind``: a one-run audit at q = 1 cannot
    see its rows, so an implementation of one gets this world in place of that audit. ``records_multiple``:
    D's size is a multiple of it; ``outputs``: the one number of classes it takes (``None``: any).
    ``designates_sigma``: its score needs a designated noise multiplier, which drawn configurations (they
    target an ε) leave out, so the strategies draw it only when named. ``reads``: for a world that states no
    power of its own, what its score reads and so what its pass vouches for, shown with its verdict (a world
    whose score reads the differing record's pull, :data:`RECORD_SCORES`, states its ρ and k* instead).
    ``relations``: the neighbouring relations its datasets can be built in (the first by default; ``maker``'s
    ``relation=`` picks another), each the relation its audit tests a claim in: a claim it cannot test there is ``undecided``
    (:func:`dpverify.audits.claims.relation_gap`). The worlds that read the dataset's size, its batches or its
    microbatches add one record (add/remove: their bugs live in what a size-preserving relation hides); the
    worst-case record is added, or its label flipped (replace-one, where add/remove and zero-out claims are
    tested by their mechanism's replace-one curve). No world is zero-out: its null record (a padding example
    whose gradient the trainer zeroes) is the trainer's own, which a dataset handed over cannot designate."""

    name: str
    maker: Callable[..., TwoWorlds]
    bugs: tuple[int, ...]
    quick_setting: Mapping[str, Any]
    normaliser: str = "designated"
    needs: tuple[str, ...] = ()
    once_per_sampler: bool = False
    full_batch_blind: bool = False
    records_multiple: int = 1
    outputs: int | None = None
    designates_sigma: bool = False
    reads: str | None = None
    relations: tuple[str, ...] = ("add_remove",)

    def __post_init__(self) -> None:
        check_choice("normaliser", self.normaliser, NORMALISERS)
        if not self.relations:
            raise ValueError(f"the {self.name} world must be built in at least one relation")
        for relation in self.relations:
            check_choice("relations", relation, RELATIONS)
        check_int("records_multiple", self.records_multiple, low=1)
        missing = sorted(set(QUICK_SETTING_KEYS) - set(self.quick_setting))
        if missing:
            raise ValueError(f"the {self.name} world's quick_setting lacks {', '.join(missing)}")


#: ``World.normaliser``: what the gate divides a world's noisy sum by.
NORMALISERS: tuple[str, ...] = ("designated", "batch_size")
#: What a world's ``quick_setting`` designates (config.two_world_config adds the rest).
QUICK_SETTING_KEYS: tuple[str, ...] = ("runs", "records", "outputs", "noise_multiplier", "sampling_rate", "epochs", "learning_rate")
#: The registered worlds by name (:func:`register_world`).
WORLDS: dict[str, World] = {}


def register_world(world: World, *, replace: bool = False) -> World:
    """Declare ``world``: the gate, ``--dp-audit-worlds``/``--worlds``, the configuration and the strategies
    read it from here. A name taken already is an error unless ``replace``."""
    if world.name in WORLDS and not replace:
        raise ValueError(f"a world named {world.name!r} is registered already; pass replace=True to replace it")
    WORLDS[world.name] = world
    return world


def world_names() -> tuple[str, ...]:
    """The registered worlds' names, sorted: the order the gate runs them in."""
    return tuple(sorted(WORLDS))


# What the default gate designates in each world at the quick profile, fixed before any audit ran:
# zero-initialised softmax regression, clip norm 1, and σ, q and steps chosen so that the bug class the world
# targets separates the worlds within a few hundred runs, where a correct implementation's claim is still
# tested (benchmarks/results/two-world-gate.md). Dataset size: 2 vs 3 records and 1024 outputs, one
# full-batch step (a normaliser that reads N moves the noise's size 1.5×). Realised batch: 1 vs 2 records,
# q = 1/2, 4 steps, and σ = 10 so that the claim is small (ε ≈ 0.4) while a halved noise in any step still
# shows. Microbatch and worst-case record: one full-batch step at σ = 0.5 (claimed μ = 2), learning rate
# 0.07/σ so that x*'s logit margin has noise of sd about 1 (the linear regime): a doubled sensitivity moves μ
# to 4, far enough to refute within 300 runs. Fixed batch (every update seen): 79 markers and the canary in
# batches of 8, q = 1/10, 2 epochs at σ = 0.8 (a Poisson claim of ε ≈ 5.7 at δ = 1e-5), learning rate 2e-3
# so the markers stay clipped; in simulation of the ideal fixed-batch mechanism 160 runs per world refute it
# at every seed at the main job's per-audit level (benchmarks/results/every-update-fixed-batch.md).
# The worst-case record also exposes classes 1-5, but those are D1/D2 bugs the one-run audit already catches,
# so it is not run on them again. Shuffled fixed-size batches (class 9) at q = 1 are one batch of the whole
# dataset, the same mechanism as Poisson sampling at q = 1, so the one-run audit there would repeat its
# Poisson twin's: the fixed-batch world is full-batch blind. It asks whether a claim's amplification by sampling
# holds, so it needs one (ImplementationInfo.amplified): DP-FTRL's epochs of fixed batches are what its
# unamplified claim counts, and there it could only be undecided (a claim of ε 22 at the world's σ and q).
register_world(World(
    name="dataset_size", maker=dataset_size_worlds, bugs=(7,),
    quick_setting=dict(runs=50, records=2, outputs=1024, noise_multiplier=2.0, sampling_rate=1.0, epochs=1, learning_rate=1.0),
    reads=(
        "this world's score reads the spread of the outputs on the copies' point: the noise's scale after the "
        "step's division, which a correct implementation keeps the same in both worlds. It catches a normaliser, "
        "sampling rate or step count derived from the dataset's size; it states no noise deficit (a deficit "
        "shrinks the noise in both worlds alike)"
    ),
))
register_world(World(
    name="fixed_batch", maker=fixed_batch_worlds, bugs=(9,),
    quick_setting=dict(runs=160, records=79, outputs=2, noise_multiplier=0.8, sampling_rate=0.1, epochs=2, learning_rate=2e-3),
    normaliser="batch_size", needs=("amplified",), once_per_sampler=True, full_batch_blind=True, outputs=2,
    designates_sigma=True,
    reads=(
        "this world's score reads each released update along the canary's direction against the batches the "
        "sampler forms: it reads the batch sampler, not the noise. It catches fixed-size batches of a shuffled "
        "dataset accounted as Poisson sampling; it states no noise deficit, and a Poisson trainer that adds too "
        "little noise, or none, is not what it catches (the one-run and every-update audits test the noise)"
    ),
))
register_world(World(
    name="microbatch", maker=microbatch_worlds, bugs=(11,),
    quick_setting=dict(runs=300, records=2, outputs=2, noise_multiplier=0.5, sampling_rate=1.0, epochs=1, learning_rate=0.14),
    needs=("microbatches",), records_multiple=2,
))
register_world(World(
    name="realised_batch", maker=realised_batch_worlds, bugs=(7,),
    quick_setting=dict(runs=100, records=1, outputs=1024, noise_multiplier=10.0, sampling_rate=0.5, epochs=2, learning_rate=1.0),
    reads=(
        "this world's score reads the spread of the outputs: the noise's scale in each step, which a correct "
        "implementation keeps the same in both worlds. It catches a noisy sum divided by the sampled batch's "
        "size; it states no noise deficit (a deficit shrinks the noise in both worlds alike)"
    ),
))
register_world(World(
    name="worst_case_record", maker=worst_case_record_worlds, bugs=(6, 12),
    quick_setting=dict(runs=300, records=1, outputs=2, noise_multiplier=0.5, sampling_rate=1.0, epochs=1, learning_rate=0.14),
    relations=("add_remove", "replace_one"),
))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TwoWorldConfig:
    """The two-world design's part of an audit: the crafted ``world`` (a registered :class:`World`, see
    :func:`world_names` and their constructors), ``records`` in D, the model's
    ``outputs`` (classes) and ``runs`` trainings on each of D and D′. The defaults are the setting that finds Opacus #571: 2 vs 3
    records and 1024 outputs, 60 runs per world. ``relation``: how D and D′ neighbour, one of the world's
    :attr:`World.relations` (add/remove by default; the worst-case record also replace-one)."""

    world: str = "dataset_size"
    runs: int = 60
    records: int = 2
    outputs: int = 1024
    relation: str = "add_remove"

    def __post_init__(self) -> None:
        check_choice("world", self.world, world_names())
        relations = WORLDS[self.world].relations
        if self.relation not in relations:
            raise ValueError(
                f"the {self.world} world's datasets are {' or '.join(relations)} neighbours only, got relation={self.relation!r}"
            )
        check_int("runs", self.runs, low=2)
        check_int("records", self.records, low=1)
        check_int("outputs", self.outputs, low=2)
        self.worlds()  # each world checks what it needs of records and outputs (the microbatch world: even)

    def worlds(self) -> TwoWorlds:
        """The two datasets this part designates."""
        world = WORLDS[self.world]
        chosen = {"relation": self.relation} if len(world.relations) > 1 else {}
        return world.maker(records=self.records, num_classes=self.outputs, **chosen)
