"""Opacus the way its tutorials call it: ``make_private`` on a plain ``DataLoader(dataset, batch_size=B)``.

``opacus-ghost`` and the variants hand Opacus a loader of exactly 1/q batches, so Opacus' sampling rate
1/len(loader) is the requested q whatever the dataset's size, and Opacus #571 cannot show through them
(only its normaliser int(N·q) still reads N). Here Opacus derives everything from the user's loader, as
in a user's script: the sampling rate q = 1/len(loader) = 1/⌈N/B⌉, the normaliser
expected_batch_size = int(N·q), the steps of an epoch (1/q) and, for a target ε, σ via
``get_noise_multiplier(sample_rate=q, epochs=...)`` as ``make_private_with_epsilon`` does; training is
``for epoch in range(epochs): for x, y in loader: ...``, handing the parameters over after each step. Imports
torch and opacus.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
from opacus.accountants.utils import get_noise_multiplier
from torch.utils.data import DataLoader, TensorDataset

from dpverify.contract import TrainedModel, TrainingRequest
from dpverify.torch import black_boxes, fast_math, hand_over_parameters
from dpverify_opacus._training import Tweak, backward_batch, build_run, claim_from_accountant, trained_module


class UserDataLoader(Tweak):
    """The user's ``DataLoader(dataset, batch_size=B)``, its order and batches left to Opacus' Poisson sampler,
    and Opacus' normaliser int(N·q) left as ``make_private`` sets it (a designated one is not used)."""

    designated_normaliser = False

    def __init__(self, batch_size: int):
        self.batch_size = batch_size

    def data_loader(
        self, tensors: tuple[torch.Tensor, ...], *, steps_per_epoch: int, generator: torch.Generator
    ) -> DataLoader:
        return DataLoader(TensorDataset(*tensors), batch_size=self.batch_size, generator=generator)


def batch_size_for(request: TrainingRequest, batch_size: int | None) -> int:
    """``batch_size`` as given (a user's constant), or the one a user picks for the requested rate on this
    dataset, max(1, round(q·N))."""
    if batch_size is not None:
        return batch_size
    return max(1, round(request.hyperparameters.sampling_rate * request.num_records))


def train_opacus_dataloader(
    request: TrainingRequest, *, name: str, batch_size: int | None = None, grad_sample_mode: str = "ghost"
) -> TrainedModel:
    """Train through ``make_private`` on the user's loader for ``request.hyperparameters.epochs`` passes and
    return the black boxes and the claim Opacus' accountant states for the steps it saw."""
    hp = request.hyperparameters
    tweak = UserDataLoader(batch_size_for(request, batch_size))
    if hp.target_epsilon is not None:
        sample_rate = 1.0 / math.ceil(request.num_records / tweak.batch_size)  # 1/len(loader), as Opacus takes it
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Optimal order is the")
            sigma = get_noise_multiplier(
                target_epsilon=hp.target_epsilon,
                target_delta=hp.delta,
                sample_rate=sample_rate,
                epochs=hp.epochs,
                accountant="rdp",
            )
        calibrated = dataclasses.replace(hp, noise_multiplier=float(sigma), target_epsilon=None)
        request = dataclasses.replace(request, hyperparameters=calibrated)
    run = build_run(request, name=name, grad_sample_mode=grad_sample_mode, tweak=tweak)
    model, taken = trained_module(run), 0
    hand_over_parameters(request, 0, model)
    with fast_math(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for _ in range(hp.epochs):
            for inputs, targets in run.data_loader:
                backward_batch(run, inputs, targets)
                run.optimizer.step()
                taken += 1
                hand_over_parameters(request, taken, model)
    claim = claim_from_accountant(run.engine.accountant, hp.delta, name=name)
    return TrainedModel(**black_boxes(trained_module(run), request, run.device), claim=claim, device=run.device.type)
