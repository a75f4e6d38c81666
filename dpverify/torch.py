"""Helpers for torch-based implementations under audit (imports torch; the core never imports this module).

Everything a torch DP-SGD implementation needs to honour the contract the same way the built-ins do:

- :func:`seeds_for` / :func:`seed_everything`: one request seed decides model init, sampling and noise;
- :func:`resolve_device`: ``"cuda"`` when asked for and available, else ``"cpu"`` (report the result);
- :func:`build_mlp`: the designated ``d -> hidden_width -> C`` ReLU network, seeded default init (with a
  separate tag head, :class:`MultiTaskMLP`, when the request carries tags), or a layer design's
  :class:`LayerModel`;
- :func:`as_tensors` and :func:`training_criterion`: the request's inputs, targets and loss;
- :func:`poisson_batches`: exactly ``steps`` Poisson-sampled batches of record indices;
- :func:`fast_math`: flush denormals to zero during training only;
- :func:`make_predictor`: the black box ``predict_log_proba(features) -> (n, C) float64`` array;
  :func:`black_boxes` both heads' black boxes as :class:`~dpverify.contract.TrainedModel` fields.

Poisson sampling draws ``torch.rand(N, generator=g) < q`` per step from a CPU generator, the same rule
Opacus' ``UniformWithReplacementSampler`` uses, so two implementations seeded alike sample alike.
"""

from __future__ import annotations

import contextlib
import random
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from dpverify.contract import CONV_KERNEL_SIZE, LAYERS, LayerArchitecture, TrainingRequest, position_weights
from dpverify.seeds import Seeds, seeds_for  # noqa: F401  (part of this module's helpers, see __all__)

__all__ = [
    "Seeds",
    "hand_over_parameters",
    "seeds_for",
    "seed_everything",
    "resolve_device",
    "fast_math",
    "denormals_flushed",
    "build_mlp",
    "MultiTaskMLP",
    "LayerModel",
    "MultiTaskLoss",
    "training_criterion",
    "poisson_batches",
    "make_predictor",
    "black_boxes",
    "as_tensors",
]


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators (all devices). Training code should still
    prefer the explicit generators of :func:`seeds_for`; this covers library code that uses the globals."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def resolve_device(requested: str) -> torch.device:
    """``cuda`` if it was asked for and is available, else ``cpu``. Put ``str(result.type)`` in the
    :class:`~dpverify.contract.TrainedModel` so the report says where training actually ran."""
    if requested == "cuda" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@contextlib.contextmanager
def fast_math() -> Iterator[None]:
    """Flush denormal floats to zero while training. The founders' prototype measured one audit at 62 s
    without and 22 s with it on this CPU; an A/B of our implementations (σ = 0, 0.6, 1) showed no
    difference, so it is kept as a guard against denormal slow-downs, not as a measured speed-up.

    ``torch.set_flush_denormal`` sets the flush-to-zero flags of the *calling thread* only, and torch's
    OpenMP worker threads copy the flags of the thread that created them, once. So in a process whose
    thread pool already exists (any earlier torch op), the workers keep computing with denormals: half
    of a 2-thread elementwise op stays slow (measured). :func:`_set_flush_denormal_everywhere` also runs
    the setting on every OpenMP worker (through libgomp, where torch uses it; elsewhere the calling
    thread only). On exit the flags are cleared again on all threads: numpy and scipy share the
    processor's flags, and left on they would change the auditor's own arithmetic (numpy warns that the
    smallest subnormal is zero). Do accounting and other numpy work outside this block."""
    _set_flush_denormal_everywhere(True)
    try:
        yield
    finally:
        _set_flush_denormal_everywhere(False)


def denormals_flushed() -> bool:
    """Whether a multi-threaded torch op flushes float32 denormals to zero on every intra-op thread."""
    probe = torch.full((1 << 20,), 1e-40)  # large enough for every thread to take a share
    return bool((probe * 1.0 == 0).all())


_GOMP_PARALLEL = None  # (libgomp's GOMP_parallel, callback type), found on first use; False: not available


def _set_flush_denormal_everywhere(enabled: bool) -> None:
    torch.set_flush_denormal(enabled)
    parallel = _gomp_parallel()
    if not parallel or torch.get_num_threads() < 2:
        return
    gomp_parallel, callback_type = parallel

    def on_each_thread(_data) -> None:
        torch.set_flush_denormal(enabled)

    callback = callback_type(on_each_thread)
    try:
        gomp_parallel(callback, None, torch.get_num_threads(), 0)  # ctypes releases the GIL meanwhile
    except Exception:  # pragma: no cover - defensive: keep the calling thread's setting
        pass


def _gomp_parallel():
    """libgomp's ``GOMP_parallel`` as loaded by torch (Linux wheels), or ``False``."""
    global _GOMP_PARALLEL
    if _GOMP_PARALLEL is not None:
        return _GOMP_PARALLEL
    _GOMP_PARALLEL = False
    try:
        import ctypes

        if "OpenMP" not in torch.__config__.parallel_info():
            return _GOMP_PARALLEL
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
        if len(paths) != 1:  # none, or several copies: unclear which one torch's pool uses
            return _GOMP_PARALLEL
        library = ctypes.CDLL(paths.pop())  # the already loaded copy
        callback_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        gomp_parallel = library.GOMP_parallel
        gomp_parallel.argtypes = [callback_type, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        gomp_parallel.restype = None
        _GOMP_PARALLEL = (gomp_parallel, callback_type)
    except (OSError, AttributeError, ValueError):
        pass
    return _GOMP_PARALLEL


class MultiTaskMLP(nn.Module):
    """UniAud++'s model: a shared encoder ``Linear(d, h), ReLU``, the main head ``Linear(h, C)`` and a
    separate tag head ``Linear(h, |E|)``. ``forward`` returns ``[main logits | tag logits]`` as one
    (n, C + |E|) tensor, so a DP library sees one output and clips each record's whole gradient."""

    def __init__(self, dimension: int, hidden_width: int, num_classes: int, num_tags: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dimension, hidden_width), nn.ReLU())
        self.main_head = nn.Linear(hidden_width, num_classes)
        self.tag_head = nn.Linear(hidden_width, num_tags)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(features)
        return torch.cat([self.main_head(hidden), self.tag_head(hidden)], dim=-1)


class LayerModel(nn.Module):
    """A layer design's model (:class:`~dpverify.contract.LayerArchitecture`): each record lifted to a
    sequence of ``positions`` equal positions, one zero-initialised layer on the sequence, the outputs weighted
    by the record's position regime (:func:`~dpverify.contract.position_weights`, a constant buffer) and summed
    over the positions. ``embedding``: the token is the record's largest feature, ``Embedding(d, C)``;
    ``linear_3d``: ``Linear(d, C)`` with bias on the (n, positions, d) input; ``layer_norm``: ``LayerNorm(d)``
    with its affine weight and bias on it (d = C); ``conv``: ``Conv1d(d, C, CONV_KERNEL_SIZE)`` with bias on
    the (n, d, positions + kernel - 1) input, ``positions`` outputs."""

    def __init__(self, dimension: int, num_classes: int, *, layer: str, positions: int) -> None:
        super().__init__()
        self.positions = positions
        if layer == "embedding":
            self.layer: nn.Module = nn.Embedding(dimension, num_classes)
        elif layer == "linear_3d":
            self.layer = nn.Linear(dimension, num_classes)
        elif layer == "layer_norm":
            if dimension != num_classes:
                raise ValueError(
                    f"the layer_norm design's outputs are its inputs' normalised coordinates, so the features' "
                    f"dimension must equal num_classes, got dimension={dimension}, num_classes={num_classes}"
                )
            self.layer = nn.LayerNorm(dimension)
        elif layer == "conv":
            self.layer = nn.Conv1d(dimension, num_classes, CONV_KERNEL_SIZE)
        else:
            raise ValueError(f"layer must be one of {', '.join(LAYERS)}, got {layer!r}")
        if getattr(self.layer, "bias", None) is not None:
            nn.init.zeros_(self.layer.bias)
        nn.init.zeros_(self.layer.weight)
        self.register_buffer("position_weights", torch.from_numpy(position_weights(positions)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        regime = features.argmax(dim=-1)
        weights = self.position_weights[regime % self.position_weights.shape[0]]  # (n, positions)
        if isinstance(self.layer, nn.Embedding):
            sequence = regime.unsqueeze(-1).repeat(1, self.positions)  # Opacus views it flat
        elif isinstance(self.layer, nn.Conv1d):  # channels first; its outputs (n, C, positions)
            sequence = features.unsqueeze(-1).expand(-1, -1, self.positions + CONV_KERNEL_SIZE - 1)
            return (self.layer(sequence) * weights.unsqueeze(1)).sum(dim=-1)
        else:
            sequence = features.unsqueeze(1).expand(-1, self.positions, -1)
        return (self.layer(sequence) * weights.unsqueeze(-1)).sum(dim=1)


class MultiTaskLoss(nn.Module):
    """Per record ``CE(main, y) + tag_weight · mean_h CE(tag head, e_h)`` over the tags the record carries
    (targets ``(n, 1 + H)``: the label, then H tags, −1 = no tag; 0 tag loss for an untagged record).

    ``reduction`` ("mean", "sum" or "none") is an attribute because Opacus' ghost clipping sets
    ``criterion.reduction = "none"`` to get one loss per record."""

    def __init__(self, *, num_classes: int, tag_weight: float, reduction: str = "mean") -> None:
        super().__init__()
        self.num_classes = num_classes
        self.tag_weight = tag_weight
        self.reduction = reduction

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        main, tag_logits = outputs[..., : self.num_classes], outputs[..., self.num_classes :]
        main_loss = nn.functional.cross_entropy(main, targets[..., 0], reduction="none")
        tags = targets[..., 1:]
        carried = tags >= 0
        tag_log_probs = torch.log_softmax(tag_logits, dim=-1)
        picked = tag_log_probs.gather(-1, tags.clamp(min=0))  # (n, H); masked below where no tag
        per_tag = -(picked * carried)
        tag_loss = per_tag.sum(dim=-1) / carried.sum(dim=-1).clamp(min=1)
        losses = main_loss + self.tag_weight * tag_loss
        if self.reduction == "none":
            return losses
        if self.reduction == "sum":
            return losses.sum()
        return losses.mean()


def build_mlp(
    request: TrainingRequest, *, seed: int | None = None, device: torch.device | str = "cpu"
) -> nn.Module:
    """The designated model ``d -> hidden_width -> C`` with one ReLU and torch's default (Kaiming-uniform)
    init, drawn from a generator seeded with ``seed`` (default: the request's init seed).

    Without tags: ``Linear, ReLU, Linear`` in an ``nn.Sequential``; parameters in order W1, b1, W2, b2.
    Softmax regression (``hidden_width=0``): ``Sequential(Linear(d, C))``, weight and bias zero.
    With tags: a :class:`MultiTaskMLP` (encoder, main head, tag head, initialised in that order).
    A :class:`~dpverify.contract.LayerArchitecture`: its :class:`LayerModel`, zero-initialised."""
    if seed is None:
        seed = seeds_for(request.seed).init
    # nn.Linear initialises from the global generator: fork it so the caller's RNG state is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        architecture = request.architecture
        if isinstance(architecture, LayerArchitecture):
            model: nn.Module = LayerModel(
                request.dimension, request.num_classes, layer=architecture.layer, positions=architecture.positions
            )
        elif request.num_tags:
            model = MultiTaskMLP(
                request.dimension, request.architecture.hidden_width, request.num_classes, request.num_tags
            )
        elif request.architecture.is_softmax_regression:
            model = nn.Sequential(nn.Linear(request.dimension, request.num_classes))
            nn.init.zeros_(model[0].weight)
            nn.init.zeros_(model[0].bias)
        else:
            model = nn.Sequential(
                nn.Linear(request.dimension, request.architecture.hidden_width),
                nn.ReLU(),
                nn.Linear(request.architecture.hidden_width, request.num_classes),
            )
    return model.to(device)


def training_criterion(request: TrainingRequest, *, reduction: str = "mean") -> nn.Module:
    """The loss the request designates: cross-entropy, or :class:`MultiTaskLoss` when it carries tags."""
    if request.num_tags:
        return MultiTaskLoss(num_classes=request.num_classes, tag_weight=request.tag_weight, reduction=reduction)
    return nn.CrossEntropyLoss(reduction=reduction)


def as_tensors(request: TrainingRequest, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The request's records as ``(float32 features, int64 targets)`` tensors on ``device``: the labels,
    or with tags the packed ``(n, 1 + H)`` targets ``[label | tags]`` that :class:`MultiTaskLoss` reads."""
    features = torch.from_numpy(np.ascontiguousarray(request.features)).to(device)
    targets = request.labels if request.tags is None else np.column_stack([request.labels, request.tags])
    return features, torch.from_numpy(np.ascontiguousarray(targets)).to(device)


def poisson_batches(num_records: int, sampling_rate: float, steps: int, *, seed: int) -> Iterator[torch.Tensor]:
    """Yield exactly ``steps`` batches of record indices (int64, CPU, ascending); each step includes every
    record independently with probability ``sampling_rate``. Batches may be empty."""
    if num_records < 1:
        raise ValueError(f"num_records must be >= 1, got {num_records}")
    if not 0.0 < sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(steps):
        mask = torch.rand(num_records, generator=generator) < sampling_rate
        yield mask.nonzero(as_tuple=False).reshape(-1)


def make_predictor(
    model: nn.Module, device: torch.device | str = "cpu", *, batch_size: int = 4096, columns: slice = slice(None)
) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap a trained classifier as the black box: ``features (n, d) -> log-probabilities (n, C)``.

    Runs in eval mode without gradients, in batches of ``batch_size`` rows; log-softmax over the output
    ``columns`` (one head of a :class:`MultiTaskMLP`) is taken in float64 so that differences of
    log-probabilities near 0 keep their precision. NaN/inf parameters give NaN/inf outputs: they are
    returned as they are, for the auditor to report."""
    device = torch.device(device)

    def predict_log_proba(features: np.ndarray) -> np.ndarray:
        features = np.asarray(features)
        if features.ndim != 2:
            raise ValueError(f"features must be a 2-D array, got shape {features.shape}")
        was_training = model.training
        model.eval()
        try:
            outputs = []
            with torch.no_grad():
                for start in range(0, max(features.shape[0], 1), batch_size):
                    chunk = torch.as_tensor(features[start : start + batch_size], dtype=torch.float32, device=device)
                    logits = model(chunk)[:, columns]
                    outputs.append(torch.log_softmax(logits.double(), dim=1).cpu().numpy())
        finally:
            model.train(was_training)
        return np.concatenate(outputs, axis=0)

    return predict_log_proba


def black_boxes(model: nn.Module, request: TrainingRequest, device: torch.device | str = "cpu") -> dict[str, Callable]:
    """``predict_log_proba`` (the main head) and ``predict_tag_log_proba`` (the tag head, ``None``
    without tags) of a model from :func:`build_mlp`, as keyword arguments of ``TrainedModel``."""
    if not request.num_tags:
        return {"predict_log_proba": make_predictor(model, device), "predict_tag_log_proba": None}
    return {
        "predict_log_proba": make_predictor(model, device, columns=slice(0, request.num_classes)),
        "predict_tag_log_proba": make_predictor(model, device, columns=slice(request.num_classes, None)),
    }


def hand_over_parameters(request: TrainingRequest, step: int, model: nn.Module) -> None:
    """Hand the model's parameters after DP step ``step`` (0: before the first) to the request's
    :attr:`~dpverify.contract.Request.observe_update`, if it has one: copies on the CPU, in
    ``model.parameters()`` order, which for :func:`build_mlp`'s models is the designated order."""
    if request.observe_update is not None:
        with torch.no_grad():
            request.observe_update(step, tuple(p.detach().cpu().numpy().copy() for p in model.parameters()))
