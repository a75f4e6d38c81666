r"""A claim stated as a ``dp_accounting`` ``DpEvent``: the mechanism's privacy curve by dp_accounting's PLD
accountant, in the claim's own neighbouring relation.

JAX-Privacy's plans and accountants state a run as an event (``SelfComposedDpEvent`` of a
``PoissonSampledDpEvent`` of a ``GaussianDpEvent`` for DP-SGD). :class:`EventRun` is that mechanism as the
audit tests it: its ε at any δ, its trade-off curve (the envelope of its privacy profile δ(ε), both
directions, :class:`~dpverify.stats.curves.ProfileCurve`) and the family of the same event with more or less
noise, which the curve test searches for the weakest member its counts refute. ``noise_multiplier`` indexes
that family: the event's reference noise multiplier (the first Gaussian or Laplace noise multiplier in the
event); a member with noise multiplier s scales every noise multiplier of the event by s over the
reference, so a DP-SGD event's family is the one :class:`~dpverify.stats.curves.ClaimedRun` searches.

An event dp_accounting cannot account, or a relation the installed release cannot account it in, raises
:class:`UnaccountableEvent` with the reason: the audit reports it ``undecided``, never a pass. dp_accounting
0.4 accounts Gaussian events for add/remove neighbours only (its Gaussian PLD has no relation and its
Poisson-sampled events refuse any other); from 0.5 on, ``from_gaussian_mechanism`` takes the relation and
replace-one (sensitivity 2) and zero-out (``REPLACE_SPECIAL``, sensitivity 1) are accounted too.

dp_accounting is imported only when an event is accounted: the contract and the audit stay numpy-only for
claims that state (σ, q, steps).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpverify._validation import check_choice, check_probability, check_real
from dpverify.stats import curves

__all__ = [
    "EventRun",
    "UnaccountableEvent",
    "check_dp_event",
    "CorrelatedRelease",
    "correlated_release",
    "dp_event_type",
    "dpsgd_numbers",
    "event_relations",
    "request_numbers",
]

#: The claim's relations by their dp_accounting ``NeighboringRelation`` names.
ACCOUNTANT_RELATIONS = {"add_remove": "ADD_OR_REMOVE_ONE", "replace_one": "REPLACE_ONE", "zero_out": "REPLACE_SPECIAL"}
#: The PLD's discretisation of the privacy loss (dp_accounting's default).
DISCRETISATION = 1e-4
#: Points of the privacy profile a curve is built from, and the δ where its grid of ε ends.
_PROFILE_POINTS = 2000
_PROFILE_FLOOR = 1e-12
#: Fields of an event that hold a noise multiplier (scaled together along the family).
_NOISE_FIELDS = ("noise_multiplier",)


class UnaccountableEvent(ValueError):
    """The installed dp_accounting cannot turn the claim's event into a privacy curve in the relation asked
    for; the message says why."""


def dp_event_type() -> type:
    """dp_accounting's ``DpEvent`` (imported here, on demand)."""
    try:
        import dp_accounting
    except ImportError as exc:
        raise ImportError(
            "a claim stated as a DpEvent needs dp_accounting (pip install dp-accounting), which made the event"
        ) from exc
    return dp_accounting.DpEvent


def check_dp_event(event: object) -> object:
    """``event`` when it is a dp_accounting ``DpEvent``; else a ``ValueError`` that says what to give."""
    if not isinstance(event, dp_event_type()):
        raise ValueError(
            "dp_event must be a dp_accounting DpEvent (e.g. SelfComposedDpEvent(PoissonSampledDpEvent(q, "
            f"GaussianDpEvent(sigma)), steps), or a JAX-Privacy plan's dp_event), got {type(event).__name__}: {event!r}"
        )
    return event


@functools.lru_cache(maxsize=1)
def event_relations() -> tuple[str, ...]:
    """The relations the installed dp_accounting accounts Gaussian events in (see the module docstring)."""
    from dp_accounting.pld import privacy_loss_distribution

    takes_relation = "neighboring_relation" in inspect.signature(privacy_loss_distribution.from_gaussian_mechanism).parameters
    return tuple(ACCOUNTANT_RELATIONS) if takes_relation else ("add_remove",)


def _noise_multipliers(event: Any) -> list[float]:
    """Every noise multiplier in ``event``, depth first."""
    import attr

    found: list[float] = []
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if field.name in _NOISE_FIELDS:
            found.append(float(value))
        for child in value if isinstance(value, (list, tuple)) else [value]:
            if attr.has(type(child)):
                found.extend(_noise_multipliers(child))
    return found


def _scaled(event: Any, factor: float) -> Any:
    """``event`` with every noise multiplier times ``factor``."""
    import attr

    changes = {}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if field.name in _NOISE_FIELDS:
            changes[field.name] = value * factor
        elif isinstance(value, (list, tuple)):
            changes[field.name] = type(value)(_scaled(v, factor) if attr.has(type(v)) else v for v in value)
        elif attr.has(type(value)):
            changes[field.name] = _scaled(value, factor)
    return attr.evolve(event, **changes)


def dpsgd_numbers(claim: Any) -> tuple[float, float, int]:
    """``(σ, q, steps)`` of a :class:`~dpverify.contract.PrivacyClaim` of DP-SGD: its numbers, or those of its
    event when that is DP-SGD; a ``ValueError`` for an event of another mechanism or correlated noise."""
    if claim.noise_structure is not None:
        raise ValueError(f"the claimed noise is correlated across steps, not DP-SGD's independent noise: {claim.mechanism}")
    if claim.dp_event is None:
        return claim.noise_multiplier, claim.sampling_rate, claim.steps
    return _dpsgd(claim.dp_event)


def request_numbers(claim: Any) -> tuple[float, float, int]:
    """``(σ, q, steps)`` with which a claim answers a request's hyperparameters: DP-SGD's
    (:func:`dpsgd_numbers`), or for correlated noise its DP-SGD-shaped event's σ and q and the steps its
    structure spans (BandMF's event composes fewer Gaussians than the run has steps)."""
    if claim.noise_structure is None:
        return dpsgd_numbers(claim)
    sigma, rate, _ = _dpsgd(claim.dp_event)
    return sigma, rate, claim.noise_structure.steps


@dataclass(frozen=True)
class CorrelatedRelease:
    r"""What a claim with a ``noise_structure`` states about its released updates y = G + τC⁻¹Z (clip norms):
    the strategy C (``structure``), the noise τ (``noise_stddev``), and how a record takes part: in the steps
    of one of ``cycle`` phases (steps t ≡ j mod ``cycle``, j uniform and independent per record, unseen by the
    audit), in each independently with probability ``sampling_rate``. ``cycle`` 1: every step."""

    structure: Any
    noise_stddev: float
    cycle: int
    sampling_rate: float


def correlated_release(claim: Any) -> CorrelatedRelease:
    r"""The :class:`CorrelatedRelease` a claim with a ``noise_structure`` states, for the every-update score.

    The event must be n self-composed Gaussians of σ, Poisson-sampled at rate q or not, over the T steps of
    its structure C (b bands: the largest lag with a non-zero entry, plus one), read as one of:

    - n = k·⌈T/b⌉ with b > 1, any q when k = 1 (BandMF's cyclic Poisson: ``amplified_bandmf_event``), q = 1
      when the event states k > 1 Gaussians per participation as
      ``SelfComposedDpEvent(SelfComposedDpEvent(GaussianDpEvent(σ), k), ⌈T/b⌉)`` (DP-FTRL restarted every b
      steps: a record once an epoch, each time in the k = ⌊log₂b⌋ + 1 nodes its accountant counts): see below.
    - any other n at q = 1 (a full batch: every record in every step): one Gaussian mechanism of μ = √n/σ on the
      whitened updates Cy = CG + τZ, of sensitivity Δ₁ = the largest ‖CG‖_F over one record's gradients of
      norm at most 1 at every step (:func:`~dpverify.stats.correlated.min_separation_sensitivity` at
      separation 1, ‖C·1‖ when CᵀC ≥ 0 entrywise); τ = σΔ₁/√n.
    - cyclic (n = k·⌈T/b⌉, b > 1): a record in one of b phases,
      at most ⌈T/b⌉ participations b or more steps apart, whose columns of C are orthogonal. Each
      participation is k Gaussians of σ, one of μ = √k/σ, claimed for the worst step: τ = σ·max_i ‖Ce_i‖/√k
      (σ·‖coef‖ for BandMF's Toeplitz C, the plan's stddev, whose event's σ is for a strategy of largest
      column norm 1). Each participation's whitened part is then an independent Gaussian of signal at most
      √k/σ, so q < 1 (k = 1) is the event's Poisson-subsampled Gaussian exactly.
    - n = T with b = 1 (independent noise, C diagonal), any q: DP-SGD's, τ = σΔ₁/√n.

    Any other event is a ``ValueError`` with the reason: a sampled event at every step of a banded strategy
    (its steps' whitened parts overlap), or n fitting neither participation. A full-batch claim that happens
    to compose ⌈T/b⌉ Gaussians is read as cyclic: the score still reads the release and not the secret bits,
    so the audit keeps its level; only its power is the cyclic reading's."""
    from dpverify.stats.correlated import bandwidth, min_separation_sensitivity

    sigma, rate, compositions = _dpsgd(claim.dp_event)
    per_participation = _per_participation(claim.dp_event)
    if sigma <= 0:
        raise ValueError(f"the claimed event adds no noise (noise multiplier {sigma:g}): nothing to decorrelate")
    structure = claim.noise_structure
    steps, bands = structure.steps, bandwidth(structure)
    if bands > 1 and compositions == per_participation * -(-steps // bands) and (per_participation == 1 or rate == 1):
        cycle = bands
    elif rate == 1 or (bands == 1 and compositions == steps):
        cycle = 1
    else:
        raise ValueError(
            "correlated noise is scored for a full-batch Gaussian event (GaussianDpEvent(σ), self-composed or not; "
            f"every record in every step) or for cyclic participation every b = {bands} steps (the strategy's "
            f"bands: BandMF's amplified event composes ⌈T/b⌉ = {-(-steps // bands)} Gaussians, Poisson-sampled or "
            f"not); the claim's {steps}-step structure has {bands} bands and its event composes {compositions} "
            f"Gaussians at sampling rate {rate:g}: {claim.dp_event!r}"
        )
    if cycle == 1:
        tau = sigma * min_separation_sensitivity(structure, min_separation=1) / math.sqrt(compositions)
    else:  # each participation k Gaussians of σ for the largest column norm (the event's unit)
        tau = sigma * float(np.linalg.norm(structure.strategy, axis=0).max()) / math.sqrt(per_participation)
    return CorrelatedRelease(structure=structure, noise_stddev=tau, cycle=cycle, sampling_rate=rate)


def _installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:
        return "(this release)"


def _per_participation(event: Any) -> int:
    """k, the Gaussians of one participation, where the event states its participations as a self-composition
    of self-composed Gaussians (``SelfComposedDpEvent(SelfComposedDpEvent(GaussianDpEvent(σ), k), n)``); 1
    for any other event."""
    import dp_accounting

    if isinstance(event, dp_accounting.SelfComposedDpEvent) and isinstance(event.event, dp_accounting.SelfComposedDpEvent):
        return _dpsgd(event.event)[2]
    return 1


def _dpsgd(event: Any) -> tuple[float, float, int]:
    """``(σ, q, steps)`` of an event that is DP-SGD (a Gaussian, Poisson-sampled or not, self-composed any
    number of times); a ``ValueError`` for any other."""
    import dp_accounting

    steps = 1
    while isinstance(event, dp_accounting.SelfComposedDpEvent):
        steps, event = steps * event.count, event.event
    rate = 1.0
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        rate, event = float(event.sampling_probability), event.event
    if not isinstance(event, dp_accounting.GaussianDpEvent):
        raise ValueError(f"the claimed event is not DP-SGD (a self-composed, Poisson-sampled Gaussian): {event!r}")
    return float(event.noise_multiplier), rate, steps


@dataclass(frozen=True, kw_only=True, eq=False)
class EventRun(curves.ClaimedMechanism):
    """A claimed mechanism stated as a dp_accounting ``event``, tested in ``relation`` (see the module
    docstring); ``noise_multiplier`` picks the member of the event's family (``None``: the event itself).
    Members are equal when their events print the same (an event that composes a list is not hashable)."""

    event: Any
    relation: str = "add_remove"
    noise_multiplier: float = None  # type: ignore[assignment]  # set from the event when not given

    def __post_init__(self) -> None:
        check_dp_event(self.event)
        check_choice("relation", self.relation, tuple(ACCOUNTANT_RELATIONS))
        if self.noise_multiplier is None:
            object.__setattr__(self, "noise_multiplier", self.reference_noise)
        check_real("noise_multiplier", self.noise_multiplier, low=0.0)

    def _key(self) -> tuple:
        return repr(self.event), self.relation, self.noise_multiplier

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventRun) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def reference_noise(self) -> float:
        """The event's own noise multiplier: its first; 1 for an event without one (no family then)."""
        found = _noise_multipliers(self.event)
        return found[0] if found else 1.0

    @property
    def member_event(self) -> Any:
        """The event of this member of the family (the claim's own at its reference noise)."""
        reference = self.reference_noise
        if self.noise_multiplier == reference:
            return self.event
        if reference == 0:
            raise UnaccountableEvent("an event without noise has no family of noisier members")
        return _scaled(self.event, self.noise_multiplier / reference)

    @property
    def mu(self) -> None:
        """No exact GDP shortcut: the curve is always the PLD accountant's."""
        return None

    @property
    def sampling_rate(self) -> float:
        """q of a DP-SGD event (what k*'s participation model needs); a ``ValueError`` for any other."""
        return _dpsgd(self.event)[1]

    @property
    def steps(self) -> int:
        """The steps of a DP-SGD event; a ``ValueError`` for any other."""
        return _dpsgd(self.event)[2]

    def accountant(self):
        """dp_accounting's PLD accountant with this member's event composed, in :attr:`relation` (once per
        member and process: the claim check, the conversion and the curve ask for the same)."""
        return _composed(self)

    def curve(self) -> curves.TradeOffCurve:
        """The member's trade-off curve: from its privacy profile, both directions (the PLD holds both)."""
        return _curve(self)

    def epsilon(self, delta) -> float:
        """ε at ``delta`` by dp_accounting's PLD accountant (an upper bound, up to its tail truncation)."""
        return float(self.accountant().get_epsilon(check_probability("delta", delta)))

    def least_epsilon(self, delta) -> float:
        r"""A lower bound on the event's ε at ``delta``: :meth:`epsilon` less the discretisation's reach.

        The pessimistic PLD rounds each composed mechanism's privacy loss up by at most one interval Δ
        (connecting the dots is tighter still), so n composed losses rise by at most nΔ and
        :math:`\varepsilon_{PLD}(\delta) \le \varepsilon(\delta) + n\Delta`; n counts the Gaussian and
        Laplace mechanisms the event composes."""
        return max(0.0, self.epsilon(delta) - _compositions(self.member_event) * DISCRETISATION)

    def with_noise(self, noise_multiplier: float) -> EventRun:
        """The member of the event's family with noise multiplier ``noise_multiplier`` (see the docstring)."""
        return dataclasses.replace(self, noise_multiplier=noise_multiplier)


def _compositions(event: Any) -> int:
    """How many noise-adding mechanisms ``event`` composes (a self-composition counts its count times)."""
    import attr
    import dp_accounting

    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event.count * _compositions(event.event)
    if any(field.name in _NOISE_FIELDS for field in attr.fields(type(event))):
        return 1
    total = 0
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        for child in value if isinstance(value, (list, tuple)) else [value]:
            if attr.has(type(child)):
                total += _compositions(child)
    return total


@functools.lru_cache(maxsize=64)
def _composed(run: EventRun):
    """:meth:`EventRun.accountant`, or :class:`UnaccountableEvent` with the reason."""
    import dp_accounting

    if run.relation not in event_relations():
        raise UnaccountableEvent(
            f"dp_accounting {_installed_version()} cannot account a Gaussian "
            f"event in the {run.relation} relation ({ACCOUNTANT_RELATIONS[run.relation]}; it accounts "
            f"{', '.join(event_relations())} only): install dp-accounting >= 0.5"
        )
    relation = getattr(dp_accounting.NeighboringRelation, ACCOUNTANT_RELATIONS[run.relation])
    accountant = dp_accounting.pld.PLDAccountant(relation, value_discretization_interval=DISCRETISATION)
    event = run.member_event
    if not accountant.supports(event):
        raise UnaccountableEvent(
            f"dp_accounting's PLD accountant cannot account the claimed event in the {run.relation} relation: {event!r}"
        )
    return accountant.compose(event)


@functools.lru_cache(maxsize=64)
def _curve(run: EventRun) -> curves.TradeOffCurve:
    accountant = run.accountant()
    largest = accountant.get_epsilon(_PROFILE_FLOOR)
    if run.noise_multiplier == 0 or math.isinf(largest):
        return curves.TrivialCurve()
    epsilons = np.linspace(0.0, largest, _PROFILE_POINTS)
    return curves.ProfileCurve(epsilons=epsilons, deltas=np.minimum(_profile_deltas(accountant._pld, epsilons), 1.0))


def _profile_deltas(pld: Any, epsilons: np.ndarray) -> np.ndarray:
    r"""δ(ε) of dp_accounting's composed ``pld`` on the grid ``epsilons``, both directions (its remove pmf, and
    its add pmf unless symmetric): each pmf's :math:`\delta(\varepsilon) = m_\infty + \sum_{\ell_j > \varepsilon}
    p_j (1 - e^{\varepsilon - \ell_j})`, dp_accounting's own sum, here from suffix sums over the losses
    (its ``get_delta_for_epsilon`` walks every loss in Python, a third of a second a curve). The pmf
    attributes read are the same in dp_accounting 0.4 and 0.6."""

    def suffix_sums(values: np.ndarray) -> np.ndarray:
        return np.append(np.cumsum(values[::-1])[::-1], 0.0)

    pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
    deltas = []
    for pmf in (pmf.to_dense_pmf() for pmf in pmfs):
        losses = (np.arange(pmf.size) + pmf._lower_loss) * pmf._discretization
        above = np.searchsorted(losses, epsilons, side="right")  # the first loss above each ε
        upper, lower = suffix_sums(pmf._probs), suffix_sums(pmf._probs * np.exp(-losses))
        deltas.append(pmf._infinity_mass + upper[above] - np.exp(epsilons) * lower[above])
    return np.max(deltas, axis=0)
