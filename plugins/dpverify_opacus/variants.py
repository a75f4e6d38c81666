"""Deliberately buggy variants of Opacus (classes of ``docs/bugs.md``), each a :class:`~._training.Tweak` that
changes the real Opacus code path: a subclass mixed into the DPOptimizer or the Poisson sampler that
``make_private`` returned (overriding ``add_noise``, ``accumulate``, ``scale_grad`` or ``__iter__`` and
calling the library's own method through ``super()``), an attribute of Opacus' ghost-clipping module, the
accountant's step hook, or Opacus' own ``poisson_sampling=False`` path. The claim stays what Opacus' own
accountant states for the numbers it was given.

Imports torch and opacus; :mod:`dpverify_opacus` maps variant names to these classes lazily.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpverify.torch import MultiTaskMLP
from dpverify_opacus._training import OpacusRun, Tweak, mix_into

# ---------------------------------------------------------------------------------------------------
# Mutations of Opacus' classes. Each is a function ``base -> subclass of base`` (base: the class of the
# object make_private returned, e.g. DPOptimizerFastGradientClipping) that overrides one method of the DP
# step and calls the library's own implementation through super(); ``mix_into`` switches the live
# object to that subclass. (A subclass of the real base keeps the object's memory layout, which a
# free-standing mixin class does not.)


def scaled_noise(base: type) -> type:
    class ScaledNoise(base):
        """``add_noise`` draws N(0, (s·σC)²) instead of N(0, (σC)²); σ itself, which the accountant hook
        reads after ``add_noise``, is left as it was."""

        dpverify_noise_scale: float = 1.0

        def add_noise(self):
            sigma = self.noise_multiplier
            self.noise_multiplier = sigma * self.dpverify_noise_scale
            try:
                super().add_noise()
            finally:
                self.noise_multiplier = sigma

    return ScaledNoise


def unnoised_parameters(base: type) -> type:
    class UnnoisedParameters(base):
        """After Opacus' ``add_noise``, the listed parameters get their clipped sum back without noise."""

        dpverify_unnoised: tuple = ()

        def add_noise(self):
            super().add_noise()
            for param in self.dpverify_unnoised:
                param.grad = param.summed_grad.detach().clone().view_as(param)

    return UnnoisedParameters


def unclipped_parameters(base: type) -> type:
    class UnclippedParameters(base):
        """Hooks mode's ``clip_and_accumulate`` with the listed parameters left out of the clipping: their
        per-sample gradients are summed as they are, and the per-sample norms (hence the clip factors of
        the other parameters) are taken without them."""

        dpverify_unclipped: tuple = ()

        def clip_and_accumulate(self):
            raw = [p.grad_sample.sum(dim=0) for p in self.dpverify_unclipped]
            for p in self.dpverify_unclipped:
                p.grad_sample.zero_()
            super().clip_and_accumulate()
            for p, summed in zip(self.dpverify_unclipped, raw):
                p.summed_grad += summed

    return UnclippedParameters


def scaled_clipping(base: type) -> type:
    class ScaledClipping(base):
        """Hooks mode's ``clip_and_accumulate`` clips at ``s``·C; ``add_noise`` still draws σ·C for the C
        it was given."""

        dpverify_clip_scale: float = 1.0

        def clip_and_accumulate(self):
            bound = self.max_grad_norm
            self.max_grad_norm = bound * self.dpverify_clip_scale
            try:
                super().clip_and_accumulate()
            finally:
                self.max_grad_norm = bound

    return ScaledClipping


def batch_clipping(base: type) -> type:
    class BatchClipping(base):
        """``accumulate`` (ghost mode's sum of rows, per-row clipping switched off in the module) clips
        the batch's gradient as one row: its mean over the expected batch size to C, i.e. the sum to B·C."""

        def accumulate(self):
            super().accumulate()
            summed = [p.summed_grad for p in self.params]
            total_norm = torch.stack([g.norm(2) for g in summed]).norm(2)
            bound = self.expected_batch_size * self.max_grad_norm
            factor = (bound / (total_norm + 1e-6)).clamp(max=1.0)
            for g in summed:
                g.mul_(factor)

    return BatchClipping


def realised_batch_scaling(base: type) -> type:
    class RealisedBatchScaling(base):
        """``scale_grad`` divides the noisy sum by the realised batch size instead of the expected one."""

        dpverify_realised_batch_size: Callable[[], int]

        def scale_grad(self):
            if self.loss_reduction == "mean":
                size = max(1, int(self.dpverify_realised_batch_size()))
                for p in self.params:
                    p.grad /= size * self.accumulated_iterations

    return RealisedBatchScaling


def reused_noise(base: type) -> type:
    class ReusedNoise(base):
        """The noise generator is reset to one seed before every ``add_noise``: the same noise vector
        is added at every step."""

        dpverify_noise_seed: int = 0

        def add_noise(self):
            self.generator.manual_seed(self.dpverify_noise_seed)
            super().add_noise()

    return ReusedNoise


def duplicating_sampler(base: type) -> type:
    class DuplicatingSampler(base):
        """Opacus' Poisson sampler, with every sampled index repeated ``dpverify_copies`` times."""

        dpverify_copies: int = 2

        def __iter__(self):
            for indices in super().__iter__():
                yield list(indices) * self.dpverify_copies

    return DuplicatingSampler


# ---------------------------------------------------------------------------------------------------
# Tweaks (ghost mode unless stated).


class ScaledNoise(Tweak):
    """Rows 1, 3 and ``noise_scaled(k)``: the noise std times ``scale`` (0: no noise; ``"per_batch"``:
    1/expected batch size, i.e. σC noise on the averaged gradient)."""

    def __init__(self, scale: float | str):
        if scale != "per_batch" and not (isinstance(scale, (int, float)) and scale >= 0):
            raise ValueError(f"scale must be a number >= 0 or 'per_batch', got {scale!r}")
        self.scale = scale

    def apply(self, run: OpacusRun) -> None:
        scale = 1.0 / run.optimizer.expected_batch_size if self.scale == "per_batch" else float(self.scale)
        mix_into(run.optimizer, scaled_noise, dpverify_noise_scale=scale)


class NoClipping(Tweak):
    """Row 2: Opacus' ghost-clipping module clips at an infinite norm; the optimizer still adds σ·C noise
    for the nominal C."""

    supported_modes = ("ghost",)

    def apply(self, run: OpacusRun) -> None:
        run.module.max_grad_norm = math.inf


class BatchClipping(Tweak):
    """Row 4: no per-row clipping; the batch gradient is clipped as one row (mean to C)."""

    supported_modes = ("ghost",)

    def apply(self, run: OpacusRun) -> None:
        run.module.max_grad_norm = math.inf
        mix_into(run.optimizer, batch_clipping)


class UnnoisedLayer(Tweak):
    """Row 5: the output layer (the last ``nn.Linear``: weight and bias; both heads of a multi-task
    model) gets no noise."""

    def apply(self, run: OpacusRun) -> None:
        inner = getattr(run.module, "_module", run.module)
        if isinstance(inner, MultiTaskMLP):
            outputs = (inner.main_head, inner.tag_head)
        else:
            outputs = ([m for m in inner.modules() if isinstance(m, nn.Linear)][-1],)
        unnoised = tuple(p for layer in outputs for p in layer.parameters())
        mix_into(run.optimizer, unnoised_parameters, dpverify_unnoised=unnoised)


def _embeddings(run: OpacusRun) -> tuple[nn.Parameter, ...]:
    """The parameters of the model's ``nn.Embedding`` layers (a transformer's token and position embeddings)."""
    inner = getattr(run.module, "_module", run.module)
    return tuple(p for layer in inner.modules() if isinstance(layer, nn.Embedding) for p in layer.parameters())


class UnnoisedEmbedding(Tweak):
    """The embeddings (every ``nn.Embedding``: token and position) get no noise."""

    def apply(self, run: OpacusRun) -> None:
        mix_into(run.optimizer, unnoised_parameters, dpverify_unnoised=_embeddings(run))


class UnclippedEmbedding(Tweak):
    """The embeddings' per-sample gradients are left out of the clipping (hooks mode: ghost clipping
    reweights the whole loss per sample, so it has no per-layer path to leave out)."""

    supported_modes = ("hooks",)

    def apply(self, run: OpacusRun) -> None:
        mix_into(run.optimizer, unclipped_parameters, dpverify_unclipped=_embeddings(run))


class ScaledClipping(Tweak):
    """Clipping at ``scale``·C while the noise is σ·C: in ghost mode Opacus' ghost-clipping module's
    ``max_grad_norm``, in hooks mode the DPOptimizer's clipping step; the optimizer keeps C for the noise."""

    def __init__(self, scale: float):
        if not (isinstance(scale, (int, float)) and scale > 0):
            raise ValueError(f"scale must be a number > 0, got {scale!r}")
        self.scale = float(scale)

    def apply(self, run: OpacusRun) -> None:
        if run.grad_sample_mode == "ghost":
            run.module.max_grad_norm = run.optimizer.max_grad_norm * self.scale
        else:
            mix_into(run.optimizer, scaled_clipping, dpverify_clip_scale=self.scale)


class DuplicatedRows(Tweak):
    """Row 6: each sampled record appears ``copies`` times in its step, each copy a clipped row."""

    def __init__(self, copies: int = 2):
        if copies < 2:
            raise ValueError(f"copies must be >= 2, got {copies}")
        self.copies = copies

    def apply(self, run: OpacusRun) -> None:
        mix_into(run.data_loader.batch_sampler, duplicating_sampler, dpverify_copies=self.copies)


class RealisedBatchNormalisation(Tweak):
    """Row 7: divide the noisy sum by the realised batch size (the rows the training loop fed this step)."""

    def apply(self, run: OpacusRun) -> None:
        mix_into(run.optimizer, realised_batch_scaling, dpverify_realised_batch_size=lambda: run.batch_size)


class AccountantSkipsSteps(Tweak):
    """Row 8: the accountant's step hook records only every ``every``-th step (a hard-coded step count);
    a target ε is calibrated for that count too."""

    def __init__(self, every: int = 4):
        if every < 2:
            raise ValueError(f"every must be >= 2, got {every}")
        self.every = every

    def calibration_steps(self, steps: int) -> int:
        return math.ceil(steps / self.every)

    def apply(self, run: OpacusRun) -> None:
        hook = run.optimizer.step_hook
        calls = 0
        every = self.every

        def every_kth_step(optimizer):
            nonlocal calls
            calls += 1
            if (calls - 1) % every == 0:
                hook(optimizer)

        run.optimizer.attach_step_hook(every_kth_step)


class AccountantUnderstatesRate(Tweak):
    """Row 8: the accountant is told a sampling rate ``factor`` times too small (jax_privacy #287: q read
    from the physical batch under gradient accumulation); a target ε is calibrated at that rate too."""

    def __init__(self, factor: int = 4):
        if factor < 2:
            raise ValueError(f"factor must be >= 2, got {factor}")
        self.factor = factor

    def calibration_rate(self, rate: float) -> float:
        return rate / self.factor

    def apply(self, run: OpacusRun) -> None:
        accountant, rate = run.engine.accountant, self.calibration_rate(1.0 / run.steps_per_epoch)

        def understated_rate(optimizer):
            accountant.step(noise_multiplier=optimizer.noise_multiplier, sample_rate=rate)

        run.optimizer.attach_step_hook(understated_rate)


class ShuffledBatches(Tweak):
    """Opacus' documented ``make_private(poisson_sampling=False)`` on a user's
    ``DataLoader(dataset, batch_size=B, shuffle=True)`` with B = ⌈N/k⌉ for k = 1/q batches an epoch (the
    last one short when B does not divide N, as a data loader leaves it); Opacus still accounts Poisson
    sampling at rate 1/len(data_loader). The designated normaliser stays, so this is shuffling alone, not
    Opacus #571's int(N·q)."""

    poisson_sampling = False

    def data_loader(
        self, tensors: tuple[torch.Tensor, ...], *, steps_per_epoch: int, generator: torch.Generator
    ) -> DataLoader:
        records = len(tensors[0])
        batch_size = math.ceil(records / steps_per_epoch)
        loader = DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=True, generator=generator)
        if len(loader) != steps_per_epoch:
            raise ValueError(
                f"{records} records in batches of {batch_size} make {len(loader)} batches an epoch, not the "
                f"{steps_per_epoch} of q = 1/{steps_per_epoch}: choose a record count whose ⌈N/k⌉-sized "
                "batches number k"
            )
        return loader


class ReplaceOneClaim(Tweak):
    """Row 10: Opacus' add/remove ε is stated as a replace-one ε."""

    relation = "replace_one"


class Microbatches(Tweak):
    """Row 11: consecutive records of a batch form microbatches of ``size``; Opacus' ghost clipping clips
    each microbatch's mean-loss gradient (the records of a microbatch are its sequence positions), the
    accountant is told σ as if each record were clipped alone. A batch's leftover records are dropped.
    The noisy sum is divided by the expected number of microbatches."""

    supported_modes = ("ghost",)

    def __init__(self, size: int = 2):
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        self.size = size

    def apply(self, run: OpacusRun) -> None:
        run.optimizer.expected_batch_size = run.optimizer.expected_batch_size / self.size

    def loss(self, run: OpacusRun, features: torch.Tensor, targets: torch.Tensor):
        usable = features.shape[0] // self.size * self.size
        if usable == 0:
            return None
        grouped = features[:usable].reshape(usable // self.size, self.size, features.shape[1])
        logits = run.module(grouped)
        return run.criterion(logits.reshape(usable, -1), targets[:usable], shape=logits.shape)


class ReusedNoise(Tweak):
    """Row 12: the same noise vector at every step (the noise generator is reseeded before each draw)."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def apply(self, run: OpacusRun) -> None:
        if run.optimizer.generator is None:
            raise RuntimeError("ReusedNoise needs make_private to have been given a noise generator")
        mix_into(run.optimizer, reused_noise, dpverify_noise_seed=self.seed)


def positions_as_rows_embedding(layer: nn.Embedding, activations, backprops):
    """Opacus' own Embedding norm sampler, given each position's token as a token of its own (the id offset
    by position × vocabulary), so that a token repeated within a record is not grouped: the record's norm
    becomes √(Σ_t |g_t|²) instead of the norm of its row's summed gradient (the kind of per-layer formula bug
    private-transformers and Opacus' norm samplers have had)."""
    from opacus.grad_sample.embedding import compute_embedding_norm_sample  # from Opacus 1.5.3 on

    input_ids = activations[0].reshape(activations[0].shape[0], -1)
    offsets = torch.arange(input_ids.shape[1], device=input_ids.device) * layer.num_embeddings
    return compute_embedding_norm_sample(layer, [input_ids + offsets], backprops)


def _exact_squared_norms(activations: torch.Tensor, backprops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear's exact per-record squared norms on a 3-D input (n, T, ·): the weight's Σᵢⱼ (aᵢ·aⱼ)(gᵢ·gⱼ) and
    the bias's Σᵢⱼ gᵢ·gⱼ = |Σ_t g_t|² (the Gram matrices' inner products, as Opacus 1.5.4's norm sampler)."""
    grams = torch.einsum("nik,njk->nij", backprops, backprops)
    inputs = torch.einsum("nik,njk->nij", activations, activations)
    return torch.einsum("nij,nij->n", grams, inputs).clamp(min=0), grams.sum(dim=(1, 2)).clamp(min=0)


def _without_diagonal(activations: torch.Tensor, backprops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact sums with the i = j terms (each position with itself) missing."""
    weight, bias = _exact_squared_norms(activations, backprops)
    own = torch.einsum("nik,nik->ni", backprops, backprops)
    return (weight - (own * torch.einsum("nik,nik->ni", activations, activations)).sum(1)).clamp(min=0), (bias - own.sum(1)).clamp(min=0)


#: Per-record norm formulas of a Linear on a 3-D input (n, T, ·): ``name -> (activations, backprops) -> (weight,
#: bias)``, the two norms (not squared). ``exact`` is right; each other one is a wrong formula of the kind fast
#: clipping has shipped or could ship: ``squared_gram``, Opacus 1.5.0–1.5.3's bias √(Σᵢⱼ (gᵢ·gⱼ)²) (PR #751);
#: ``rows``, the 2-D bias formula √(Σ_t |g_t|²), the positions' norms combined instead of the norm of their sum
#: (TF-Privacy 0.8.12's Dense bias); ``mean``, the gradient averaged over the positions instead of summed;
#: ``root``, the norm's square root (a root too many); ``unsquared_gram``, the bias as √(Σᵢⱼ √|gᵢ·gⱼ|) (the
#: inner products' root instead of their square); ``no_bias``, the bias term missing; ``no_diagonal``, each
#: position's product with itself missing; ``first_position``, T times the first position's norms (positions
#: assumed equal).
LINEAR_NORM_FORMULAS: dict[str, Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    "exact": lambda a, g: tuple(part.sqrt() for part in _exact_squared_norms(a, g)),
    "squared_gram": lambda a, g: (
        _exact_squared_norms(a, g)[0].sqrt(),
        torch.einsum("nik,njk->nij", g, g).square().sum(dim=(1, 2)).sqrt(),
    ),
    "rows": lambda a, g: (_exact_squared_norms(a, g)[0].sqrt(), torch.einsum("nik,nik->n", g, g).sqrt()),
    "mean": lambda a, g: tuple(part.sqrt() / g.shape[1] for part in _exact_squared_norms(a, g)),
    "root": lambda a, g: tuple(part.sqrt().sqrt() for part in _exact_squared_norms(a, g)),
    "unsquared_gram": lambda a, g: (
        _exact_squared_norms(a, g)[0].sqrt(),
        torch.einsum("nik,njk->nij", g, g).abs().sqrt().sum(dim=(1, 2)).sqrt(),
    ),
    "no_bias": lambda a, g: (_exact_squared_norms(a, g)[0].sqrt(), torch.zeros(g.shape[0], device=g.device)),
    "no_diagonal": lambda a, g: tuple(part.sqrt() for part in _without_diagonal(a, g)),
    "first_position": lambda a, g: (
        g.shape[1] * g[:, 0].norm(dim=-1) * a[:, 0].norm(dim=-1),
        g.shape[1] * g[:, 0].norm(dim=-1),
    ),
}


def linear_norm_sampler(formula: str) -> Callable:
    """Opacus' own Linear norm sampler (``compute_linear_norm_sample``, from Opacus 1.5.0 on) with a 3-D input's
    norms taken by ``formula`` (:data:`LINEAR_NORM_FORMULAS`); a 2-D input's are the library's."""
    if formula not in LINEAR_NORM_FORMULAS:
        raise ValueError(f"formula must be one of {', '.join(LINEAR_NORM_FORMULAS)}, got {formula!r}")

    def sampler(layer: nn.Linear, activations, backprops):
        from opacus.grad_sample.linear import compute_linear_norm_sample

        norms = compute_linear_norm_sample(layer, activations, backprops)
        if backprops.dim() != 3:
            return norms
        weight, bias = LINEAR_NORM_FORMULAS[formula](activations[0], backprops)
        if layer.weight.requires_grad:
            norms[layer.weight] = weight
        if layer.bias is not None and layer.bias.requires_grad:
            norms[layer.bias] = bias
        return norms

    sampler.__name__ = sampler.__qualname__ = f"linear_norm_sampler_{formula}"
    return sampler


def positions_averaged_layer_norm(layer: nn.LayerNorm, activations, backprops):
    """Opacus' own LayerNorm grad sampler, its per-record gradients averaged over the positions instead of
    summed (what fast gradient clipping takes the norms of, where no norm sampler is registered)."""
    from opacus.grad_sample.layer_norm import compute_layer_norm_grad_sample

    grads = compute_layer_norm_grad_sample(layer, activations, backprops)
    positions = backprops[0].numel() // max(1, layer.weight.numel())
    return {param: grad / positions for param, grad in grads.items()}


def positions_as_rows_conv(layer: nn.Conv1d, activations, backprops):
    """Ghost clipping's Conv1d norm with each output position taken as a record of its own: the rows (n, positions)
    hold each position's gradient norm, so the norm Opacus takes of them is √(Σ_q |g_q|²), the unfold formula
    with its sum over the positions q dropped, instead of the norm of the gradient summed over them. Position q's
    gradient is the outer product of its backprop b_q with its (dilated) input window x_q, of norm |b_q|·|x_q|
    (the bias's: |b_q|): the norms Opacus' own grad sampler gives each position alone, without materialising
    the (n, positions, *parameter) gradients. For an unpadded, ungrouped Conv1d (the conv design's)."""
    if layer.padding not in ((0,), "valid"):
        raise ValueError(f"positions_as_rows_conv takes an unpadded Conv1d, got padding={layer.padding!r}")
    if layer.groups != 1:
        raise ValueError(f"positions_as_rows_conv takes an ungrouped Conv1d, got groups={layer.groups}")
    span = layer.dilation[0] * (layer.kernel_size[0] - 1) + 1
    windows = activations[0].unfold(-1, span, layer.stride[0])[..., :: layer.dilation[0]]  # (n, d, positions, k)
    backprop_norms = backprops.norm(dim=1)  # (n, positions)
    rows = {layer.weight: backprop_norms * windows.square().sum(dim=(1, 3)).sqrt()}
    if layer.bias is not None:
        rows[layer.bias] = backprop_norms
    return rows


#: The formula-breaking samplers by layer design: the registry of Opacus' ghost-clipping module they replace
#: an entry of, the layer type, and the sampler.
UNDERCOUNTING_NORM_SAMPLERS: dict[str, tuple[str, type, Callable]] = {
    "embedding": ("NORM_SAMPLERS", nn.Embedding, positions_as_rows_embedding),
    "linear_3d": ("NORM_SAMPLERS", nn.Linear, linear_norm_sampler("rows")),
    "layer_norm": ("GRAD_SAMPLERS", nn.LayerNorm, positions_averaged_layer_norm),
    "conv": ("GRAD_SAMPLERS", nn.Conv1d, positions_as_rows_conv),
}


class UndercountingNormSampler(Tweak):
    """Row 2 for one layer type: ghost clipping's per-layer norm formula for ``layer`` takes a record's
    sequence positions as separate rows or averages them (:data:`UNDERCOUNTING_NORM_SAMPLERS`; for ``linear_3d``, a
    ``formula`` of :data:`LINEAR_NORM_FORMULAS` in its place), so it states
    too small a norm and the record is clipped too weakly; the real gradient is still the whole one. The
    run's ghost-clipping module gets its own copy of Opacus' ``NORM_SAMPLERS`` (or, for a layer without a
    norm sampler, ``GRAD_SAMPLERS``) registry with the one entry replaced (the class's registry, shared by
    every other run, is left alone)."""

    supported_modes = ("ghost",)

    def __init__(self, layer: str, formula: str | None = None):
        if layer not in UNDERCOUNTING_NORM_SAMPLERS:
            raise ValueError(f"layer must be one of {', '.join(UNDERCOUNTING_NORM_SAMPLERS)}, got {layer!r}")
        if formula is not None and layer != "linear_3d":
            raise ValueError(f"a formula (LINEAR_NORM_FORMULAS) replaces the linear_3d design's norm sampler, got layer={layer!r}")
        self.layer = layer
        self.sampler = None if formula is None else linear_norm_sampler(formula)

    def apply(self, run: OpacusRun) -> None:
        registry_name, layer_type, sampler = UNDERCOUNTING_NORM_SAMPLERS[self.layer]
        sampler = self.sampler or sampler
        registry = getattr(type(run.module), registry_name)
        if layer_type not in registry:
            raise RuntimeError(f"{run.name}: this Opacus has no {registry_name} entry for {layer_type.__name__}")
        setattr(run.module, registry_name, {**registry, layer_type: sampler})


TWEAKS: dict[str, type[Tweak]] = {
    "scaled_noise": ScaledNoise,
    "no_clipping": NoClipping,
    "batch_clipping": BatchClipping,
    "unnoised_layer": UnnoisedLayer,
    "unnoised_embedding": UnnoisedEmbedding,
    "unclipped_embedding": UnclippedEmbedding,
    "scaled_clipping": ScaledClipping,
    "duplicated_rows": DuplicatedRows,
    "realised_batch": RealisedBatchNormalisation,
    "accountant_steps": AccountantSkipsSteps,
    "accountant_rate": AccountantUnderstatesRate,
    "shuffled_batches": ShuffledBatches,
    "replace_one_claim": ReplaceOneClaim,
    "microbatches": Microbatches,
    "reused_noise": ReusedNoise,
    "undercounting_norm": UndercountingNormSampler,
}


def make_tweak(kind: str | None, **kwargs) -> Tweak:
    """The tweak named ``kind`` (``None``: the correct path)."""
    if kind is None:
        return Tweak()
    try:
        return TWEAKS[kind](**kwargs)
    except KeyError:
        raise KeyError(f"unknown Opacus tweak {kind!r}; known: {', '.join(sorted(TWEAKS))}") from None
