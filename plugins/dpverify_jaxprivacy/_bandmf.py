"""Amplified banded matrix factorization (BandMF) on JAX-Privacy 2.0.0's execution plan. jax and jax_privacy
are imported when a plan is built or a run trains, so listing the implementations imports neither.

``BandMFExecutionPlanConfig`` ("our primary entry point") builds the whole mechanism: its plan's
``batch_selection_strategy`` (``CyclicPoissonSampling``: the records split into b = ``num_bands`` groups, step t
Poisson-samples group t mod b at ``sampling_prob``), its ``clipped_grad`` (the sum of per-example gradients
clipped to C, rescaled to unit norm, over ``normalize_by``), its ``noise_addition_transform`` (the streaming
``matrix_factorization_privatizer`` of the banded Toeplitz strategy's inverse, stddev σ·s·‖coef‖ with s the
clipped sum's sensitivity in the accountant's relation) and its ``dp_event`` (``amplified_bandmf_event``: ⌈T/b⌉
Poisson-sampled Gaussians of σ). One run trains the designated model (:mod:`._core`'s) with exactly that.

The audit's datasets are add/remove neighbours, so the plan is built with the accountant in that relation
(``PLDAccountant(ADD_OR_REMOVE_ONE)``), which the plan accepts with ``partition_type=INDEPENDENT`` only (each
record's group drawn uniformly and independently). s = 1/``normalize_by`` = 1 with the unit rescale, so the
released update in clip norms is y = G + τC⁻¹Z with τ = σ·‖coef‖: what the claim's event and structure state
(:func:`dpverify.stats.events.correlated_release`). The plan's strategy is the library's
``optimal_max_error_strategy_coefs(b)``, not ``default``'s RMSE optimisation (seconds of gradient descent per
configuration, and a strategy that changes with the optimiser).

The plan, its privatizer and the traced step depend only on the configuration: they are built once per
configuration and process, and each run gets the privatizer's state with its own key (the streaming
privatizer's state is (key, buffer), and ``update`` reads only the key it is given).

The variants change one of the plan's three parts while the claim stays the plan's (:data:`PLAN_FAULTS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from typing import Callable

import numpy as np

from dpverify.contract import Implementation, ImplementationInfo, PrivacyClaim, TrainedModel, TrainingRequest

__all__ = ["BANDS", "PLAN_FAULTS", "BandMF", "Plan", "bandmf_implementations", "build_plan", "train_bandmf"]

#: The strategy's bands b (and the cyclic batch selection's cycle): a record takes part every b-th step.
BANDS = 2

#: How each variant breaks the plan (docs/bugs.md classes 13–15), each in one of its library calls:
#: ``one_participation``: the privatizer's stddev is divided by √⌈T/b⌉, the noise of a calibration for one
#: participation while every record takes part ⌈T/b⌉ times (class 13); ``poisson_everywhere``: the batches are
#: Poisson-sampled over every record at each step (``cycle_length=1``) where the event accounts cyclic Poisson
#: (class 14); ``unbanded_noise``: the noising matrix is the inverse of the unbanded strategy (the same
#: coefficients' function cut at T instead of b) while the stddev, the event and the claimed structure are
#: the b-band strategy's (class 15).
PLAN_FAULTS: tuple[str, ...] = ("correct", "one_participation", "poisson_everywhere", "unbanded_noise")

_SWAP_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A built plan (``execution_plan.DPExecutionPlan``) and its claim: the plan's ``dp_event``, its add/remove
    ε at the request's δ by the plan's accountant, stated with the banded Toeplitz strategy of its T steps.
    Compared by identity: one per configuration and process (:func:`build_plan`), a traced step's cache key."""

    plan: object
    claim: PrivacyClaim


@contextlib.contextmanager
def _plan_fault(fault: str, *, steps: int, bands: int):
    """While the plan is built, the library call ``fault`` changes is the variant's (a lock keeps two
    threads from swapping at once; the library's own is back when the block ends)."""
    from jax_privacy import noise_addition
    from jax_privacy.matrix_factorization import toeplitz

    if fault in ("correct", "poisson_everywhere"):
        yield
        return
    if fault == "one_participation":
        module, name = noise_addition, "matrix_factorization_privatizer"
        own = module.matrix_factorization_privatizer
        rounds = -(-steps // bands)

        def changed(noising_matrix, *, stddev, **kwargs):
            return own(noising_matrix, stddev=stddev / math.sqrt(rounds), **kwargs)

    else:
        module, name = toeplitz, "inverse_as_streaming_matrix"
        own = module.inverse_as_streaming_matrix

        def changed(coef, column_normalize_for_n=None):
            return own(toeplitz.optimal_max_error_strategy_coefs(steps), column_normalize_for_n)

    with _SWAP_LOCK:
        setattr(module, name, changed)
        try:
            yield
        finally:
            setattr(module, name, own)


@functools.lru_cache(maxsize=16)
def build_plan(
    fault: str, *, steps: int, sampling_rate: float, clip_norm: float, noise_multiplier: float | None,
    target_epsilon: float | None, delta: float,
) -> Plan:
    """``BandMFExecutionPlanConfig(...).plan`` for the request's numbers (σ, or the target ε the plan
    calibrates σ for), as ``fault`` builds it; once per configuration and process."""
    import dp_accounting
    from jax_privacy import batch_selection
    from jax_privacy.experimental import execution_plan
    from jax_privacy.matrix_factorization import toeplitz

    from dpverify.stats.correlated import NoiseStructure

    if fault not in PLAN_FAULTS:
        raise ValueError(f"unknown BandMF plan fault {fault!r}; expected one of {', '.join(PLAN_FAULTS)}")
    bands = min(BANDS, steps)
    coefficients = np.asarray(toeplitz.optimal_max_error_strategy_coefs(bands), dtype=np.float64)
    config = execution_plan.BandMFExecutionPlanConfig(
        iterations=steps,
        strategy=coefficients,
        noise_multiplier=noise_multiplier,
        epsilon=target_epsilon,
        delta=None if target_epsilon is None else delta,
        l2_clip_norm=clip_norm,
        rescale_to_unit_norm=True,
        normalize_by=1.0,
        sampling_prob=sampling_rate,
        partition_type=batch_selection.PartitionType.INDEPENDENT,
        accountant=dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE),
    )
    with _plan_fault(fault, steps=steps, bands=bands):
        plan = config.plan
    if fault == "poisson_everywhere":
        plan = dataclasses.replace(
            plan, batch_selection_strategy=dataclasses.replace(plan.batch_selection_strategy, cycle_length=1)
        )
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    epsilon = dp_accounting.pld.PLDAccountant(relation).compose(plan.dp_event).get_epsilon(delta)
    claim = PrivacyClaim(
        epsilon=float(epsilon),
        delta=delta,
        accountant="jax_privacy.experimental.execution_plan (dp_accounting PLD, add/remove)",
        dp_event=plan.dp_event,
        relation="add_remove",
        noise_structure=NoiseStructure.banded_toeplitz(coefficients, steps=steps),
    )
    return Plan(plan=plan, claim=claim)


@functools.lru_cache(maxsize=64)
def _traced_step(plan: Plan, microbatch_size: int, forward: Callable):
    """The jitted step (params, noise state, x, y, padding, scale) -> (params, noise state): the plan's
    clipped sum and its privatizer's update, traced once per plan, model and padded batch shape."""

    import optax

    from dpverify_jaxprivacy._jax import jax

    def example_loss(params, features, labels):
        return optax.softmax_cross_entropy_with_integer_labels(forward(params, features), labels).sum()

    clipped_sum = plan.plan.clipped_grad(example_loss, batch_argnums=(1, 2), microbatch_size=microbatch_size)
    privatizer = plan.plan.noise_addition_transform

    @jax.jit
    def dp_step(params, noise_state, features, labels, is_padding, scale):
        grads = clipped_sum(params, features, labels, is_padding_example=is_padding)
        noisy, noise_state = privatizer.update(grads, noise_state)
        return jax.tree.map(lambda p, g: p - scale * g, params, noisy), noise_state

    return dp_step


def train_bandmf(request: TrainingRequest, fault: str) -> tuple[Callable[[np.ndarray], np.ndarray], PrivacyClaim]:
    """Train the designated model with the plan ``fault`` builds for the request; the black box and the
    plan's claim. The update is lr·C·noisy sum / normaliser (C undoes the unit rescale, as on the core path)."""
    from dpverify.seeds import seeds_for
    from dpverify_jaxprivacy._core import designated_model
    from dpverify_jaxprivacy._jax import jax, jnp
    from dpverify_jaxprivacy._mf_training import run_steps

    hp = request.hyperparameters
    plan = build_plan(
        fault, steps=hp.steps, sampling_rate=float(hp.sampling_rate), clip_norm=float(hp.max_grad_norm),
        noise_multiplier=None if hp.noise_multiplier is None else float(hp.noise_multiplier),
        target_epsilon=None if hp.target_epsilon is None else float(hp.target_epsilon), delta=float(hp.delta),
    )  # fmt: skip
    model = designated_model(request)
    seeds = seeds_for(request.seed)
    params = model.init_params(request, seeds.init)
    _, buffer = plan.plan.noise_addition_transform.init(params)
    noise_state = (jax.random.key(seeds.noise), buffer)  # the run's own key (module docstring)
    scale = jnp.float32(hp.learning_rate * hp.max_grad_norm / hp.normaliser(request.num_records))
    batches = plan.plan.batch_selection_strategy.batch_iterator(request.num_records, rng=seeds.sampling)

    def step_for(microbatch_size: int):
        dp_step = _traced_step(plan, microbatch_size, model.logits)
        return lambda p, state, x, y, padding: dp_step(p, state, x, y, padding, scale)

    black_box = run_steps(request, model=model, params=params, noise_state=noise_state, batches=batches, step_for=step_for)
    return black_box, plan.claim


_NOTES = (
    "jax_privacy.experimental.execution_plan.BandMFExecutionPlanConfig(iterations=T, strategy="
    "toeplitz.optimal_max_error_strategy_coefs(b), b = min(2, T), noise_multiplier=σ or (epsilon, delta), "
    "l2_clip_norm=C, rescale_to_unit_norm=True, normalize_by=1, sampling_prob=q, partition_type=INDEPENDENT, "
    "accountant=PLDAccountant(ADD_OR_REMOVE_ONE)).plan: its batch_selection_strategy (cyclic Poisson, b groups), "
    "clipped_grad, noise_addition_transform (streaming matrix_factorization_privatizer of the strategy's inverse, "
    "stddev σ·‖coef‖) and dp_event (amplified_bandmf_event: ⌈T/b⌉ Poisson-sampled Gaussians of σ). SGD update "
    "lr·C·noisy sum / normaliser. Claim: PrivacyClaim(dp_event=plan.dp_event, relation='add_remove', "
    "noise_structure=NoiseStructure.banded_toeplitz(coef, steps=T)), ε by the plan's accountant. The plan and its "
    "traced step are built once per configuration and process; each run keys the privatizer with its seed."
)

#: Each variant: (fault, docs/bugs.md class, detectability, what it breaks, how).
_VARIANTS = (
    ("one_participation", 13, "D1",
     "The correlated noise must be σ times the strategy's sensitivity for the participations that happen "
     "(the event composes ⌈T/b⌉ of them, each of σ·‖coef‖); it is √⌈T/b⌉ times less, a calibration for one "
     "participation (jax_privacy PR #238's class).",
     "matrix_factorization_privatizer is given stddev σ·‖coef‖/√⌈T/b⌉ while the plan is built."),
    ("poisson_everywhere", 14, "D2",
     "Each record must take part only in its group's steps, every b-th step (cyclic Poisson, what the event "
     "accounts); the batches are Poisson-sampled over every record at every step, so records take part b times "
     "as often, at steps whose strategy columns overlap.",
     "The plan's CyclicPoissonSampling is replaced by the same sampler with cycle_length=1."),
    ("unbanded_noise", 15, "D3",
     "The noise must be correlated by the inverse of the strategy the claim and the stddev are computed for "
     "(b bands); it is the inverse of the unbanded strategy (the same coefficients cut at T), the noise stream "
     "and the accounting drifting apart.",
     "toeplitz.inverse_as_streaming_matrix is given optimal_max_error_strategy_coefs(T) while the plan is built."),
)

_LIBRARY = dict(library="jax-privacy", requires=("jax", "jax_privacy", "dp_accounting"), extra="jax-privacy")


class BandMF(Implementation):
    """JAX-Privacy's BandMF execution plan as ``fault`` builds it (:data:`PLAN_FAULTS`)."""

    def __init__(self, info: ImplementationInfo, fault: str = "correct") -> None:
        if fault not in PLAN_FAULTS:
            raise ValueError(f"unknown BandMF plan fault {fault!r}; expected one of {', '.join(PLAN_FAULTS)}")
        self.info = info
        self.fault = fault

    def unavailable_reason(self) -> str | None:
        """Also ``n/a`` before JAX-Privacy 2.0.0, which has no execution plan."""
        from dpverify_jaxprivacy._releases import missing_since_2

        return super().unavailable_reason() or missing_since_2(self.info.name, "jax_privacy.experimental.execution_plan")

    def train(self, request: TrainingRequest) -> TrainedModel:
        if request.num_tags:
            raise ValueError("the JAX-Privacy trainers take no UniAud++ tags; audit them with the synthetic designs")
        try:
            predict, claim = train_bandmf(request, self.fault)
        except (FloatingPointError, ValueError) as exc:
            raise RuntimeError(f"{self.info.name}: {exc}") from exc
        from dpverify_jaxprivacy._jax import jax

        return TrainedModel(predict_log_proba=predict, claim=claim, device="cuda" if jax.default_backend() == "gpu" else "cpu")


def bandmf_implementations() -> list[Implementation]:
    """``jax-privacy-bandmf`` and its variants (imports no jax)."""
    variants = [
        BandMF(
            ImplementationInfo(
                name=f"jax-privacy-bandmf-{fault.replace('_', '-')}", expected="violation", breaks=breaks, bug=bug,
                detectability=detectability, notes=f"{how} The claim is the correct plan's. {_NOTES}", **_LIBRARY,
            ),
            fault,
        )
        for fault, bug, detectability, breaks, how in _VARIANTS
    ]
    return [BandMF(ImplementationInfo(name="jax-privacy-bandmf", notes=_NOTES, **_LIBRARY))] + variants
