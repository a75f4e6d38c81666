"""Opacus 1.6 training behind the contract: one loop for the correct library and all its variants.

A variant is a :class:`Tweak`: it may choose the data loader, Opacus' ``poisson_sampling`` flag, the step
count used for calibration, the forward/loss computation and the claimed relation, and it may change the
objects ``PrivacyEngine.make_private`` returned (mix a subclass into the DPOptimizer or the sampler, wrap
the accountant's step hook, ...). The correct implementations use the base :class:`Tweak`, which changes
nothing. This module imports torch and opacus; the package's ``__init__`` does not.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpverify.contract import PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.torch import (
    as_tensors,
    black_boxes,
    build_mlp,
    fast_math,
    hand_over_parameters,
    resolve_device,
    seeds_for,
    training_criterion,
)
from dpverify_opacus._releases import installed_version, make_private_call


class _EmptyPoissonBatchNotice(logging.Filter):
    """Drops Opacus' warning that a Poisson batch came out empty: with the one or two records of a
    two-world audit most batches are, which is what Poisson sampling means, and a warning per run would
    bury the audit's own output (hundreds of lines a world)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("First batch is empty")


logging.getLogger("opacus.data_loader").addFilter(_EmptyPoissonBatchNotice())

RDP_NAME = "opacus.rdp"
PRV_NAME = "opacus.prv"
GRAD_SAMPLE_MODES = ("hooks", "ghost")


@dataclass
class OpacusRun:
    """Everything one training run holds after ``make_private``; tweaks may change it in place."""

    request: TrainingRequest
    name: str
    grad_sample_mode: str
    module: nn.Module  # the GradSampleModule that make_private returned
    optimizer: Any  # the DPOptimizer (or DPOptimizerFastGradientClipping) that make_private returned
    criterion: Any  # DPLossFastGradientClipping in ghost mode, the request's criterion in hooks mode
    data_loader: DataLoader
    engine: PrivacyEngine
    device: torch.device
    steps_per_epoch: int
    tweak: Tweak
    batch_size: int = 0  # rows of the current batch, set before each step


class Tweak:
    """A change to the correct Opacus training path. This base class changes nothing."""

    #: passed to ``make_private``: ``False`` keeps our data loader as it is (Opacus then still accounts
    #: with Poisson sampling at rate 1/len(data_loader)).
    poisson_sampling: bool = True
    #: the neighbouring relation the claim names.
    relation: str = "add_remove"
    #: ``True``: the DPOptimizer divides by the request's designated ``expected_batch_size`` when it has
    #: one (its public attribute, which ``make_private`` sets to int(N·q)); ``False``: Opacus' own int(N·q).
    designated_normaliser: bool = True
    #: grad_sample_modes the tweak is written for.
    supported_modes: tuple[str, ...] = GRAD_SAMPLE_MODES

    def calibration_steps(self, steps: int) -> int:
        """The step count the noise multiplier is calibrated for when a target ε is given."""
        return steps

    def calibration_rate(self, rate: float) -> float:
        """The sampling rate the noise multiplier is calibrated for when a target ε is given."""
        return rate

    def data_loader(
        self, tensors: tuple[torch.Tensor, ...], *, steps_per_epoch: int, generator: torch.Generator
    ) -> DataLoader:
        """The loader handed to ``make_private``: an epoch of ``steps_per_epoch`` batches, so that Opacus'
        sample_rate = 1/len(data_loader) is the requested q."""
        chunks = np.array_split(np.arange(len(tensors[0])), steps_per_epoch)
        return batch_fetching_loader(tensors, batch_sampler=[c.tolist() for c in chunks], generator=generator)

    def apply(self, run: OpacusRun) -> None:
        """Change what ``make_private`` returned (called once, before training)."""

    def loss(self, run: OpacusRun, features: torch.Tensor, targets: torch.Tensor):
        """The loss whose ``backward()`` fills what the DP optimizer needs for a non-empty batch, or
        ``None`` when the batch holds no usable rows (the step then adds noise only)."""
        return run.criterion(run.module(features), targets)


@dataclass(frozen=True)
class FetchedBatch:
    """A batch's tensors, fetched; its length is its row count, so that Opacus' empty-batch wrapper
    (``CollateFnWithEmpty``) sees an empty Poisson batch as empty, as it sees an empty list of rows."""

    tensors: tuple[torch.Tensor, ...]

    def __len__(self) -> int:
        return len(self.tensors[0])


class BatchFetchedTensors(TensorDataset):
    """In-memory tensors whose batch fetch indexes each tensor once with the batch's indices. torch's
    fetcher would otherwise take the rows one ``__getitem__`` at a time and ``default_collate`` would stack
    them: 6.9 s of an opacus-ghost audit's 9.2 s of training on an H100. ``index_select`` gathers the
    same rows as ``tensor[index]`` at a third of its time on the CPU (1250 rows of 2500 floats: 1.0 ms
    against 2.8 ms; the per-row fetch took 8 ms)."""

    def __getitems__(self, indices: list[int]) -> FetchedBatch:
        index = torch.as_tensor(indices, dtype=torch.long)
        return FetchedBatch(tuple(tensor.index_select(0, index) for tensor in self.tensors))


def collate_fetched(batch: FetchedBatch) -> list[torch.Tensor]:
    """The batch as ``default_collate`` makes it from rows of a ``TensorDataset``: a list of one tensor
    per column (Opacus keeps a copy of this structure for its empty batches)."""
    return list(batch.tensors)


def batch_fetching_loader(
    tensors: tuple[torch.Tensor, ...], *, batch_sampler: Iterable[list[int]], generator: torch.Generator
) -> DataLoader:
    """A loader over ``tensors`` whose batches ``batch_sampler`` draws (Opacus replaces it with its Poisson
    sampler) and :class:`BatchFetchedTensors` fetches."""
    return DataLoader(
        BatchFetchedTensors(*tensors), batch_sampler=batch_sampler, collate_fn=collate_fetched, generator=generator
    )


def mix_into(obj: Any, mutation: Callable[[type], type], **attributes: Any) -> Any:
    """Switch the live ``obj`` to the subclass ``mutation(type(obj))``, whose overrides wrap the library's
    real methods (called through ``super()``), and set ``attributes`` on it. Returns ``obj``."""
    obj.__class__ = mutation(type(obj))
    for key, value in attributes.items():
        setattr(obj, key, value)
    return obj


def endless_batches(loader: DataLoader) -> Iterator[Any]:
    """The loader's batches epoch after epoch, for a run that counts steps rather than epochs."""
    while True:
        yield from loader


def sampling_rate_for(request: TrainingRequest, name: str) -> tuple[int, float]:
    """``(steps_per_epoch, Opacus' sample rate)``; raise unless 1/steps_per_epoch is the requested q."""
    hp = request.hyperparameters
    k = hp.steps_per_epoch
    if not math.isclose(1.0 / k, hp.sampling_rate, rel_tol=1e-9):
        raise ValueError(
            f"{name}: Opacus samples at rate 1/len(data_loader), so the sampling rate must be 1/k for an "
            f"integer k; got q = {hp.sampling_rate} (nearest 1/{k} = {1.0 / k:.6g})"
        )
    return k, 1.0 / k


def noise_multiplier_for(request: TrainingRequest, tweak: Tweak, sample_rate: float) -> float:
    """σ as given, or calibrated to the target ε with Opacus' own ``get_noise_multiplier`` (RDP)."""
    hp = request.hyperparameters
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    return rdp_noise_multiplier(
        hp.target_epsilon, hp.delta, tweak.calibration_rate(sample_rate), tweak.calibration_steps(hp.steps)
    )


@functools.lru_cache(maxsize=256)
def rdp_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Opacus' ``get_noise_multiplier`` (RDP) for these four numbers. What ``make_private_with_epsilon`` does,
    but with the step count given exactly (it would use int(epochs / sample_rate), which floating point
    rounds one step short for e.g. 3 epochs at q = 1/75) and a tolerance relative to the target (its default
    is 0.01 absolute). A pure function of them, computed once per process: at q < 1 its bisection over
    fractional RDP orders takes seconds, and every pooled run of an audit asks it the same question."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the")  # bisection probes extreme σ
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant="rdp",
                epsilon_tolerance=0.005 * target_epsilon,
            )
        )


@dataclass(frozen=True)
class Task:
    """What a run trains: the model (from the request, an init seed and a device), the dataset's
    ``(inputs, targets)`` tensors on the CPU, and the criterion. The engine, sampling, noise, tweaks and
    accounting are the same for every task."""

    build_model: Callable[[Any, int, torch.device], nn.Module]
    tensors: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
    criterion: Callable[[Any], nn.Module]


#: The designated MLP (with its tag head when the request carries tags) on a :class:`TrainingRequest`.
CLASSIFICATION = Task(
    build_model=lambda request, seed, device: build_mlp(request, seed=seed, device=device),
    tensors=lambda request: as_tensors(request, "cpu"),
    criterion=training_criterion,
)


def build_run(
    request: TrainingRequest,
    *,
    name: str,
    grad_sample_mode: str = "ghost",
    tweak: Tweak | None = None,
    task: Task = CLASSIFICATION,
) -> OpacusRun:
    """Everything up to the first step: the task's model, SGD, ``PrivacyEngine(accountant="rdp").make_private``
    with Poisson sampling, seeded sampling and noise generators, the designated normaliser, then the tweak
    applied."""
    tweak = tweak if tweak is not None else Tweak()
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"{name}: grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {grad_sample_mode!r}")
    if grad_sample_mode not in tweak.supported_modes:
        raise ValueError(
            f"{name}: {type(tweak).__name__} is written for {tweak.supported_modes}, not {grad_sample_mode!r}"
        )
    if request.num_records < 1:
        raise ValueError(f"{name}: the request holds no records to train on")
    hp = request.hyperparameters
    steps_per_epoch, sample_rate = sampling_rate_for(request, name)
    sigma = noise_multiplier_for(request, tweak, sample_rate)

    device = resolve_device(request.device)
    seeds = seeds_for(request.seed)
    model = task.build_model(request, seeds.init, device)
    sampling_generator = torch.Generator(device="cpu").manual_seed(seeds.sampling)
    noise_generator = torch.Generator(device=device).manual_seed(seeds.noise)
    loader = tweak.data_loader(task.tensors(request), steps_per_epoch=steps_per_epoch, generator=sampling_generator)

    call = make_private_call(installed_version(), grad_sample_mode)  # as the installed release documents it
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        engine = PrivacyEngine(accountant="rdp")
        made = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=hp.learning_rate),
            **({"criterion": task.criterion(request)} if call.criterion else {}),
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=hp.max_grad_norm,
            poisson_sampling=tweak.poisson_sampling,
            noise_generator=noise_generator,
            grad_sample_mode=grad_sample_mode,
            clipping=call.clipping,
        )
    if grad_sample_mode == "ghost" and call.criterion:
        module, optimizer, criterion, dp_loader = made
    else:
        module, optimizer, dp_loader = made
        criterion = task.criterion(request)
        if call.double_backward:
            criterion = DoubleBackwardLoss(module, optimizer, criterion)
    if hp.expected_batch_size is not None and tweak.designated_normaliser:
        optimizer.expected_batch_size = hp.expected_batch_size
    run = OpacusRun(
        request=request,
        name=name,
        grad_sample_mode=grad_sample_mode,
        module=module,
        optimizer=optimizer,
        criterion=criterion,
        data_loader=dp_loader,
        engine=engine,
        device=device,
        steps_per_epoch=steps_per_epoch,
        tweak=tweak,
    )
    tweak.apply(run)
    return run


class DoubleBackwardLoss:
    """Ghost clipping's loss in Opacus 1.5.0–1.5.2, whose ``make_private`` does not take the criterion: the
    criterion per sample, and a ``backward()`` that runs the two passes those releases leave to the caller
    (1.5.2's ``opacus.utils.fast_gradient_clipping_utils.double_backward``, the same steps written out in
    1.5.0's tests): the mean loss's backward fills the per-sample norms, the module's clipping coefficients
    rescale each sample's loss, and a second backward with the hooks off leaves the clipped sum in ``.grad``.
    ``shape`` (the logits' (B, T, V)) makes a sequence's tokens one sample, as 1.5.3's DP loss does."""

    def __init__(self, module: nn.Module, optimizer: Any, criterion: nn.Module):
        self.module, self.optimizer, self.criterion = module, optimizer, criterion
        criterion.reduction = "none"

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, shape: tuple[int, ...] | None = None):
        per_sample = self.criterion(logits, targets)
        if shape is not None and per_sample.shape[0] == shape[0] * shape[1]:
            per_sample = per_sample.view(shape[0], shape[1]).mean(dim=1)
        return _DoubleBackward(self, per_sample)


@dataclass(frozen=True)
class _DoubleBackward:
    loss: DoubleBackwardLoss
    per_sample: torch.Tensor

    def backward(self) -> None:
        module, optimizer = self.loss.module, self.loss.optimizer
        torch.mean(self.per_sample).backward(retain_graph=True)
        optimizer.zero_grad()
        coefficients = module.get_coeff().to(self.per_sample.device)  # get_clipping_coef from 1.5.3 on
        module.disable_hooks()
        torch.sum(coefficients * self.per_sample).backward()
        module.enable_hooks()


def backward_batch(run: OpacusRun, features: torch.Tensor, targets: torch.Tensor) -> None:
    """Zero the gradients and fill what ``run.optimizer.step()`` needs for this batch.

    A Poisson batch can be empty. Opacus' mean-reduced loss is NaN on an empty batch and poisons the
    model, so an empty batch gets zero gradients instead (ghost mode: ``p.grad``; hooks mode: an empty
    ``p.grad_sample``) and Opacus' own step then adds the noise and counts the step, as DP-SGD does."""
    features, targets = features.to(run.device), targets.to(run.device)
    run.batch_size = int(features.shape[0])
    run.optimizer.zero_grad()
    loss = run.tweak.loss(run, features, targets) if run.batch_size else None
    if loss is not None:
        loss.backward()
        return
    for param in run.optimizer.params:
        if run.grad_sample_mode == "ghost":
            param.grad = torch.zeros_like(param)
        else:
            param.grad_sample = param.new_zeros((0, *param.shape))


def run_steps(run: OpacusRun) -> PrivacyClaim:
    """Take exactly the request's steps and return the claim Opacus' accountant states for them."""
    steps = run.request.hyperparameters.steps
    taken = 0
    model = trained_module(run)
    hand_over_parameters(run.request, 0, model)
    with fast_math(), warnings.catch_warnings():
        # torch warns on every backward that Opacus' hooks fire on module outputs (inputs need no grad).
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        # Exactly `steps` steps: Opacus' sampler yields int(1/sample_rate) batches per pass, which is
        # one short of 1/q for some q (e.g. 1/93), so passes are chained rather than counted.
        for inputs, targets in itertools.islice(endless_batches(run.data_loader), steps):
            backward_batch(run, inputs, targets)
            run.optimizer.step()
            taken += 1
            hand_over_parameters(run.request, taken, model)
            if run.request.progress is not None:
                run.request.progress(taken, steps)
    if taken != steps:
        raise RuntimeError(f"{run.name}: the data loader gave {taken} batches, expected {steps}")
    return claim_from_accountant(
        run.engine.accountant, run.request.hyperparameters.delta, relation=run.tweak.relation, name=run.name
    )


def trained_module(run: OpacusRun) -> nn.Module:
    """The user's nn.Module inside the GradSampleModule."""
    return getattr(run.module, "_module", run.module)


def train_opacus(
    request: TrainingRequest, *, name: str, grad_sample_mode: str = "ghost", tweak: Tweak | None = None
) -> TrainedModel:
    """Train the designated MLP (with its tag head when the request carries tags) with Opacus'
    ``PrivacyEngine`` and return the black boxes and the claim."""
    run = build_run(request, name=name, grad_sample_mode=grad_sample_mode, tweak=tweak)
    claim = run_steps(run)
    return TrainedModel(**black_boxes(trained_module(run), request, run.device), claim=claim, device=run.device.type)


def claim_from_accountant(accountant, delta: float, *, relation: str = "add_remove", name: str) -> PrivacyClaim:
    """The claim as Opacus states it: RDP ε of the accountant's history; the PRV ε of the same history
    in ``other_epsilons['opacus.prv']``."""
    history = tuple(tuple(h) for h in accountant.history)
    if not history:
        raise RuntimeError(f"{name}: Opacus' accountant recorded no steps; no claim can be stated")
    sigmas = {float(h[0]) for h in history}
    rates = {float(h[1]) for h in history}
    if len(sigmas) != 1 or len(rates) != 1:
        raise RuntimeError(f"{name}: the accountant's history mixes noise multipliers or sampling rates: {list(history)}")
    sigma, rate = sigmas.pop(), rates.pop()
    accounted_steps = int(sum(h[2] for h in history))
    other: dict[str, float] = {}
    if sigma == 0.0:
        epsilon = math.inf
    else:
        epsilon, prv, failure = stated_epsilons(history, delta)
        if failure is None:
            other[PRV_NAME] = prv
        else:
            warnings.warn(f"{name}: Opacus' PRV accountant could not compute ε ({failure}); claim has RDP only")
    return PrivacyClaim(
        epsilon=epsilon,
        delta=delta,
        accountant=RDP_NAME,
        noise_multiplier=sigma,
        sampling_rate=rate,
        steps=accounted_steps,
        relation=relation,
        other_epsilons=other,
    )


@functools.lru_cache(maxsize=256)
def stated_epsilons(history: tuple, delta: float) -> tuple[float, float, str | None]:
    """``(RDP ε, PRV ε, why the PRV failed or None)`` that Opacus' accountants state for ``history`` (its
    ``(σ, q, steps)`` entries) at ``delta``. Both are pure functions of these, and at ~0.15 s a call they
    were four fifths of a two-world run of a small model, so each distinct history is computed once per
    process (a two-world audit repeats one history thousands of times)."""
    with warnings.catch_warnings():
        # Opacus' own remarks on its numbers, not the user's concern here: the RDP optimum at its largest
        # order (large σ), and the PRV's log of 0 at q = 1 (a full batch), which it handles.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        warnings.filterwarnings("ignore", message="divide by zero encountered in log", category=RuntimeWarning)
        rdp = RDPAccountant()
        rdp.history = list(history)
        prv = PRVAccountant()
        prv.history = list(history)
        epsilon = float(rdp.get_epsilon(delta))
        try:
            return epsilon, float(prv.get_epsilon(delta)), None
        except (ValueError, OverflowError, RuntimeError) as exc:  # PRV's domain fails for extreme ε
            return epsilon, math.nan, str(exc)
