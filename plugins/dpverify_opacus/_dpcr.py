"""opacus-dpcr 1.0.0 under audit: DP continual release (binary-tree noise) through Opacus, as its code ships it.

``DPCREngine(dpcrGenerator=...)`` is Opacus' ``PrivacyEngine`` whose ``make_private`` wraps the DPOptimizer
in a ``DPCROptimizer``: each parameter's update −lr·(clipped sum)/B is fed to dpcrpy's continual-release
framework ``dpCrFw``, which runs the generator's mechanism over blocks of its size, restarts it after each
block, and releases the difference of its noisy prefix sums as the step's update. Its noise mechanism has
stddev σ·C·lr/B times the mechanism's L2 sensitivity for a record in *one* step (``BinMech(k)``: √(k + 1),
the nodes one step touches). The accountant is Opacus' RDP accountant, fed σ and q at every step: DP-SGD's
accounting, as if every step's noise were fresh.

- ``opacus-dpcr``: that engine with the binary tree ``BinMech(4)`` (blocks of 16 steps), claiming what its
  accountant states, with the tree's structure (:meth:`~dpverify.stats.correlated.NoiseStructure.binary_tree`).
  A known issue: the tree's nodes are shared by the steps they sum, so a record in many steps of a block
  moves node t by lowbit(t) clipped gradients; the noise, scaled for one step, is too small for that, and
  the every-update audit refutes the accountant's claim (docs/bugs.md class 13).
- ``opacus-dpcr-tree``: the same engine and noise, claiming the tree's exact Gaussian mechanism instead
  (σ_e = σ·√(k + 1)/‖C·1‖, a record in every step, :func:`tree_event_sigma`): the mechanism is right, only
  its accounting is not. Its variants change the library's code path and keep that claim.

This module imports torch, opacus and opacus_dpcr; the package's ``__init__`` does not.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import warnings
from typing import Callable

import numpy as np
import torch

from dpverify.contract import PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.stats.correlated import NoiseStructure
from dpverify.torch import as_tensors, black_boxes, build_mlp, fast_math, hand_over_parameters, resolve_device, seeds_for, training_criterion
from dpverify_opacus._training import (
    RDP_NAME,
    _epochs,
    batch_fetching_loader,
    mix_into,
    rdp_noise_multiplier,
    sampling_rate_for,
    stated_epsilons,
)

#: BinMech's order k: a tree of 2^k steps, restarted after each (dpcrpy's ``BinMech(kOrder)``).
TREE_ORDER = 4
#: The claims a run can state: Opacus' accountant's, or the tree's exact mechanism.
CLAIMS = ("accountant", "mechanism")
#: The code-path changes of the variants (:data:`dpverify_opacus.variants` names them).
TWEAKS = (None, "unscaled_noise", "unrestarted_tree")


def tree_event_sigma(noise_multiplier: float, *, steps: int, tree_order: int = TREE_ORDER) -> float:
    r"""σ_e of the ``GaussianDpEvent`` the binary tree is, for a record in every step: the library's node
    noise σ·√(k + 1) (clip norms) over the tree's sensitivity Δ = ‖C·1‖ (C ≥ 0 entrywise, so no record's
    gradients of norm ≤ 1 shift the whitened updates further: Σ_ij (CᵀC)_ij⟨g_i, g_j⟩ ≤ 1ᵀCᵀC1, the bound
    :func:`~dpverify.stats.correlated.min_separation_sensitivity` takes at separation 1).
    Its μ = Δ/(σ√(k + 1)); the accountant's claim is √steps/σ."""
    structure = NoiseStructure.binary_tree(steps=steps, tree_steps=2**tree_order)
    return noise_multiplier * math.sqrt(tree_order + 1) / float(np.linalg.norm(structure.strategy.sum(axis=1)))


@functools.lru_cache(maxsize=64)
def gaussian_sigma_for(epsilon: float, delta: float) -> float:
    """The ``GaussianDpEvent`` σ whose PLD ε at ``delta`` is ``epsilon`` (dp_accounting's calibration)."""
    import dp_accounting

    return float(
        dp_accounting.calibrate_dp_mechanism(
            dp_accounting.pld.PLDAccountant, dp_accounting.GaussianDpEvent, epsilon, delta
        )
    )


@contextlib.contextmanager
def _wrapped_after_make_private(designated: bool):
    """While ``DPCREngine.make_private`` runs with a designated normaliser, it returns Opacus' DPOptimizer
    unwrapped, for the caller to wrap in ``DPCROptimizer`` once the normaliser is set: the engine's own wrap
    divides by Opacus' ``int(N·q)``, which is 0 on a dataset of fewer records than batches (the realised-batch
    world's), a ZeroDivisionError before the designated normaliser could replace it."""
    from opacus_dpcr import dpcr_engine

    if not designated:
        yield
        return
    own = dpcr_engine.DPCROptimizer
    dpcr_engine.DPCROptimizer = lambda optimizer, generator: optimizer
    try:
        yield
    finally:
        dpcr_engine.DPCROptimizer = own


def train_dpcr(request: TrainingRequest, *, name: str, claim: str = "accountant", tweak: str | None = None) -> TrainedModel:
    """Train the designated MLP with ``DPCREngine`` and the binary tree, hand over every update, and state
    ``claim`` (:data:`CLAIMS`); ``tweak`` (:data:`TWEAKS`) changes the library's code path."""
    import dpcrpy
    from opacus_dpcr import DPCREngine
    from opacus_dpcr.dpcrOptimizer import DPCROptimizer

    if claim not in CLAIMS:
        raise ValueError(f"{name}: claim must be one of {CLAIMS}, got {claim!r}")
    if tweak not in TWEAKS:
        raise ValueError(f"{name}: tweak must be one of {TWEAKS}, got {tweak!r}")
    hp = request.hyperparameters
    steps = hp.steps
    steps_per_epoch, sample_rate = sampling_rate_for(request, name)
    sigma = _noise_multiplier(request, claim, sample_rate)

    device = resolve_device(request.device)
    seeds = seeds_for(request.seed)
    model = build_mlp(request, seed=seeds.init, device=device)
    sampling = torch.Generator(device="cpu").manual_seed(seeds.sampling)
    chunks = np.array_split(np.arange(request.num_records), steps_per_epoch)
    loader = batch_fetching_loader(as_tensors(request, "cpu"), batch_sampler=[c.tolist() for c in chunks], generator=sampling)
    # A tree that never restarts within the run, its noise scaled for BinMech(TREE_ORDER)'s k + 1 nodes.
    order = max(TREE_ORDER, math.ceil(math.log2(steps))) if tweak == "unrestarted_tree" else TREE_ORDER
    generator = (lambda block: dpcrpy.BinMech(order)) if order == TREE_ORDER else _mis_scaled_tree(dpcrpy, order)
    designated = hp.expected_batch_size is not None
    with warnings.catch_warnings(), _wrapped_after_make_private(designated):
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        engine = DPCREngine(accountant="rdp", dpcrGenerator=generator)
        module, optimizer, dp_loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=hp.learning_rate),
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=hp.max_grad_norm,
            poisson_sampling=True,
        )
    if designated:  # the designated normaliser, before DPCROptimizer scales its noise by it
        optimizer.expected_batch_size = hp.expected_batch_size
        optimizer = DPCROptimizer(optimizer, engine.dpcrGenerator)
    if tweak == "unscaled_noise":
        for mechanism in optimizer.noiMeches:
            mix_into(mechanism, _ignoring_sensitivity)
    criterion = training_criterion(request)
    torch.manual_seed(seeds.noise)  # TensorGaussNoiMech draws from torch's global generator
    hand_over_parameters(request, 0, model)
    taken = 0
    with fast_math(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for inputs, targets in itertools.islice(_epochs(dp_loader), steps):
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            if len(inputs):
                criterion(module(inputs), targets).backward()
            else:  # an empty Poisson batch: Opacus clips nothing and DPCROptimizer still adds its noise
                for param in optimizer.params:
                    param.grad_sample = param.new_zeros((0, *param.shape))
                    param.grad = torch.zeros_like(param)
            optimizer.step()
            taken += 1
            hand_over_parameters(request, taken, model)
            if request.progress is not None:
                request.progress(taken, steps)
    if taken != steps:
        raise RuntimeError(f"{name}: the data loader gave {taken} batches, expected {steps}")
    structure = NoiseStructure.binary_tree(steps=steps, tree_steps=2**TREE_ORDER)
    stated = _accountant_claim if claim == "accountant" else _mechanism_claim
    return TrainedModel(
        **black_boxes(model, request, device), claim=stated(engine, sigma, structure, hp.delta), device=device.type
    )


def _noise_multiplier(request: TrainingRequest, claim: str, sample_rate: float) -> float:
    """The σ handed to ``make_private``. For the accountant's claim: σ as given, or calibrated to the target ε by
    Opacus' RDP. For the mechanism's: the claimed event's σ is the one given (as for any claim of correlated
    noise, docs/trainer.md) or calibrated to the target ε, and the library's σ is what makes the tree that
    event (:func:`tree_event_sigma`)."""
    hp = request.hyperparameters
    if claim == "accountant":
        if hp.noise_multiplier is not None:
            return float(hp.noise_multiplier)
        return rdp_noise_multiplier(hp.target_epsilon, hp.delta, sample_rate, hp.steps)
    event_sigma = hp.noise_multiplier if hp.noise_multiplier is not None else gaussian_sigma_for(hp.target_epsilon, hp.delta)
    return float(event_sigma) / tree_event_sigma(1.0, steps=hp.steps)


def _accountant_claim(engine, sigma: float, structure: NoiseStructure, delta: float) -> PrivacyClaim:
    """What opacus-dpcr's accountant states: Opacus' RDP ε of its history, as the event it accounts (``steps``
    Gaussians of σ, Poisson-sampled at q < 1), with the tree's structure."""
    import dp_accounting

    history = tuple(tuple(h) for h in engine.accountant.history)
    (noise, rate, steps), *others = history
    if others or noise != sigma:
        raise RuntimeError(f"opacus-dpcr's accountant recorded an unexpected history: {list(history)}")
    step = dp_accounting.GaussianDpEvent(noise)
    if rate < 1:
        step = dp_accounting.PoissonSampledDpEvent(rate, step)
    epsilon = stated_epsilons(history, delta)[0]
    return PrivacyClaim(
        epsilon=epsilon, delta=delta, accountant=RDP_NAME,
        dp_event=dp_accounting.SelfComposedDpEvent(step, int(steps)), noise_structure=structure,
    )  # fmt: skip


def _mechanism_claim(engine, sigma: float, structure: NoiseStructure, delta: float) -> PrivacyClaim:
    """The binary tree's exact Gaussian mechanism for a record in every step (:func:`tree_event_sigma`)."""
    import dp_accounting

    event_sigma = tree_event_sigma(sigma, steps=structure.steps)
    return PrivacyClaim(
        epsilon=gaussian_epsilon(event_sigma, delta), delta=delta, accountant="dp_accounting.pld",
        dp_event=dp_accounting.GaussianDpEvent(event_sigma), noise_structure=structure,
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def gaussian_epsilon(sigma: float, delta: float) -> float:
    """The PLD ε at ``delta`` of ``GaussianDpEvent(sigma)``, once per process (a two-world audit asks it in
    every one of its runs)."""
    import dp_accounting

    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    return float(accountant.get_epsilon(delta))


def _ignoring_sensitivity(base: type) -> type:
    """The noise mechanism that keeps sensitivity 1 whatever the tree sets (``DpcrMech.setNoiMech`` calls
    ``setSens(getL2Sens())``): nodes noised for one node, not the k + 1 a step touches (docs/bugs.md class 13)."""

    class IgnoringSensitivity(base):
        def setSens(self, sens):
            super().setSens(1.0)

    return IgnoringSensitivity


def _mis_scaled_tree(dpcrpy, order: int) -> Callable[[int], object]:
    """``BinMech(order)`` whose noise is scaled for ``BinMech(TREE_ORDER)``'s √(k + 1) nodes: a tree deeper
    than its noise and its accounting count (docs/bugs.md class 16)."""

    class DeeperTree(dpcrpy.BinMech):
        def getL2Sens(self):
            return math.sqrt(TREE_ORDER + 1)

    return lambda block: DeeperTree(order)
