"""The reference DP-SGD step and training loop, in plain torch."""

from __future__ import annotations

import math

import torch
from torch import nn

from dpverify.contract import PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.torch import (
    as_tensors,
    black_boxes,
    build_mlp,
    fast_math,
    hand_over_parameters,
    training_criterion,
    poisson_batches,
    resolve_device,
    seeds_for,
)
from dpverify_reference import accounting


def clipped_gradient_sum(
    model: nn.Module,
    features: torch.Tensor,
    targets: torch.Tensor,
    max_grad_norm: float,
    *,
    criterion: nn.Module | None = None,
):
    """Sum over the batch of per-example gradients, each clipped to ``max_grad_norm`` by its global norm.

    Returns ``(clipped_sum, per_example_norms)``; ``clipped_sum`` is a list aligned with
    ``model.parameters()``. ``criterion`` (reduction "none"; default cross-entropy) gives one loss per
    example. Works for models whose parameters all sit in ``nn.Linear`` layers, each applied once to 2-D
    inputs (the designated MLP, with or without its tag head). Per-example norms use the ghost-norm
    identity: for a linear layer with input a_i and output gradient g_i, the weight's per-example gradient
    is g_i a_iᵀ with ‖g_i a_iᵀ‖² = ‖g_i‖²‖a_i‖², and the bias's is g_i. The clipped sum is the gradient of
    Σ_i w_i ℓ_i with w_i = min(1, C/‖grad_i‖) held fixed.
    """
    params = list(model.parameters())
    if features.shape[0] == 0:
        return [torch.zeros_like(p) for p in params], features.new_zeros(0)
    for module in model.modules():
        if not isinstance(module, nn.Linear) and any(True for _ in module.parameters(recurse=False)):
            raise TypeError(f"the reference DP-SGD supports nn.Linear and parameter-free layers, got {module}")
    layer_inputs, layer_outputs, linears = [], [], []

    def record(layer, inputs, output):
        linears.append(layer)
        layer_inputs.append(inputs[0])
        layer_outputs.append(output)

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        outputs = model(features)
    finally:
        for hook in hooks:
            hook.remove()
    criterion = criterion if criterion is not None else nn.CrossEntropyLoss(reduction="none")
    losses = criterion(outputs, targets)

    # ℓ_i depends on example i's activations only, so the gradient of Σ ℓ_i with respect to a layer's
    # output holds every example's own output gradient g_i in its row i.
    output_grads = torch.autograd.grad(losses.sum(), layer_outputs, retain_graph=True)
    squared_norms = torch.zeros_like(losses)
    for layer, a, g in zip(linears, layer_inputs, output_grads):
        g_sq = g.pow(2).sum(dim=1)
        squared_norms += g_sq * a.detach().pow(2).sum(dim=1)
        if layer.bias is not None:
            squared_norms += g_sq
    norms = squared_norms.sqrt()
    weights = (max_grad_norm / norms).clamp(max=1.0)  # a zero norm gives inf, clamped to 1

    clipped_sum = torch.autograd.grad((weights.detach() * losses).sum(), params)
    return list(clipped_sum), norms


def dp_sgd_step(
    model: nn.Module,
    features: torch.Tensor,
    targets: torch.Tensor,
    *,
    max_grad_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    learning_rate: float,
    generator: torch.Generator,
    criterion: nn.Module | None = None,
) -> None:
    """One DP-SGD step on the sampled batch: clip rows, sum, add N(0, σ²C²) per coordinate, divide by
    the expected batch size, SGD update. The noise is drawn parameter by parameter in
    ``model.parameters()`` order (nothing is drawn when σ = 0)."""
    clipped_sum, _ = clipped_gradient_sum(model, features, targets, max_grad_norm, criterion=criterion)
    std = noise_multiplier * max_grad_norm
    with torch.no_grad():
        for param, grad in zip(model.parameters(), clipped_sum):
            if std > 0:
                grad = grad + torch.normal(0.0, std, size=param.shape, generator=generator, device=param.device)
            param.add_(grad / expected_batch_size, alpha=-learning_rate)


def train_reference(request: TrainingRequest, *, name: str = "reference-dpsgd") -> TrainedModel:
    hp = request.hyperparameters
    steps = hp.steps
    if hp.noise_multiplier is not None:
        sigma = float(hp.noise_multiplier)
    else:
        sigma = accounting.calibrate_noise_multiplier(hp.target_epsilon, hp.sampling_rate, steps, hp.delta)

    device = resolve_device(request.device)
    seeds = seeds_for(request.seed)
    model = build_mlp(request, seed=seeds.init, device=device)
    features, targets = as_tensors(request, device)
    criterion = training_criterion(request, reduction="none")
    noise_generator = torch.Generator(device=device).manual_seed(seeds.noise)
    expected_batch_size = hp.normaliser(request.num_records)

    taken = 0
    hand_over_parameters(request, 0, model)
    with fast_math():
        for batch in poisson_batches(request.num_records, hp.sampling_rate, steps, seed=seeds.sampling):
            batch = batch.to(device)
            dp_sgd_step(
                model,
                features[batch],
                targets[batch],
                max_grad_norm=hp.max_grad_norm,
                noise_multiplier=sigma,
                expected_batch_size=expected_batch_size,
                learning_rate=hp.learning_rate,
                generator=noise_generator,
                criterion=criterion,
            )
            taken += 1
            hand_over_parameters(request, taken, model)
            if request.progress is not None:
                request.progress(taken, steps)
    if taken != steps:  # pragma: no cover - poisson_batches yields exactly `steps`
        raise RuntimeError(f"{name} took {taken} steps, expected {steps}")

    epsilon = accounting.rdp_epsilon(sigma, hp.sampling_rate, steps, hp.delta)
    other = {}
    if math.isfinite(epsilon):
        other[accounting.PLD_NAME] = accounting.pld_epsilon(sigma, hp.sampling_rate, steps, hp.delta)
    claim = PrivacyClaim(
        epsilon=epsilon,
        delta=hp.delta,
        accountant=accounting.RDP_NAME,
        noise_multiplier=sigma,
        sampling_rate=hp.sampling_rate,
        steps=steps,
        relation="add_remove",
        other_epsilons=other,
    )
    return TrainedModel(**black_boxes(model, request, device), claim=claim, device=device.type)
