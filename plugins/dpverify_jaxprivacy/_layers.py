"""The layer designs on JAX-Privacy's core path, and the variants whose per-example norm under-counts one layer
(imports jax and jax_privacy).

A layer design's model (:class:`~dpverify.contract.LayerArchitecture`) is :class:`dpverify.torch.LayerModel`'s:
each record lifted to ``positions`` equal positions, one zero-initialised layer on the sequence (``Embedding(d,
C)`` on the record's largest feature as its token; a dense ``(d, C)`` kernel with bias; a LayerNorm over d = C
with its scale and bias), the outputs weighted by the record's position regime and summed over the positions. Its parameters sit under the layer's name
(``{"embedding": {"w": ...}}``), each kernel in JAX's (inputs, outputs) layout, handed over transposed as the
other paths' are. Each layer type is one entry of :data:`LAYER_TYPES` (and of :data:`UNDERCOUNTS` for its
variant).

JAX-Privacy has no per-layer norm formula: ``clipped_grad`` takes each record's whole gradient by ``vmap`` and
clips the pytree by its global norm (``clipping.clip_pytree``, which ``clipped_fun`` looks up each time it
traces). A variant (:class:`UndercountingStep`) puts in its place, while the clipped sum traces, the library's
``clip_pytree`` given one layer's leaves divided by a factor for the norm and multiplied back after: the norm
under-counts that layer, the clipped gradient is still the record's whole one, scaled as the library scales
it. The factors are what the torch and TF-Privacy formula bugs state for T equal positions: the
embedding's and the linear bias's gradient taken as T separate rows, √(Σ_t |G/T|²) = |G|/√T; the LayerNorm's
averaged over the positions, |G|/T.
"""

from __future__ import annotations

import contextlib
import threading
import dataclasses
from dataclasses import dataclass
from typing import Callable

from dpverify_jaxprivacy._jax import jax, jnp

import numpy as np  # noqa: E402
from scipy.special import log_softmax  # noqa: E402

from dpverify.contract import LayerArchitecture, TrainingRequest, position_weights  # noqa: E402
from dpverify_jaxprivacy._api import clipping  # noqa: E402
from dpverify_jaxprivacy._steps import DPStep  # noqa: E402

__all__ = ["LAYER_TYPES", "LAYER_STEPS", "UNDERCOUNTS", "LayerType", "LayerModel", "Undercount", "UndercountingStep",
           "undercounting_clip_pytree", "layer_step"]  # fmt: skip

#: torch's ``nn.LayerNorm`` epsilon (the designs' model is torch's).
LAYER_NORM_EPSILON = 1e-5


def _sequence(features: jax.Array, positions: int) -> jax.Array:
    """Each record (n, d) lifted to ``positions`` equal positions, (n, T, d)."""
    return jnp.repeat(features[:, None, :], positions, axis=1)


def _embedding(params: dict, features: jax.Array, positions: int) -> jax.Array:
    tokens = jnp.repeat(jnp.argmax(features, axis=-1)[:, None], positions, axis=1)
    return params["w"][tokens]


def _linear(params: dict, features: jax.Array, positions: int) -> jax.Array:
    return _sequence(features, positions) @ params["w"] + params["b"]


def _layer_norm(params: dict, features: jax.Array, positions: int) -> jax.Array:
    sequence = _sequence(features, positions)
    centred = sequence - sequence.mean(axis=-1, keepdims=True)
    variance = jnp.square(centred).mean(axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(variance + LAYER_NORM_EPSILON) * params["scale"] + params["bias"]


def _layer_norm_shapes(dimension: int, num_classes: int) -> tuple[tuple[int, ...], ...]:
    if dimension != num_classes:
        raise ValueError(
            f"the layer_norm design's outputs are its inputs' normalised coordinates, so the features' "
            f"dimension must equal num_classes, got dimension={dimension}, num_classes={num_classes}"
        )
    return (dimension,), (dimension,)


@dataclass(frozen=True)
class LayerType:
    """One layer type of the designs: its parameters' ``names`` in the designated order (weight, then bias),
    their ``shapes`` for d inputs and C outputs, and its ``outputs(params, features (n, d), positions)``, (n, T,
    C) at each position."""

    names: tuple[str, ...]
    shapes: Callable[[int, int], tuple[tuple[int, ...], ...]]
    outputs: Callable[[dict, jax.Array, int], jax.Array]


LAYER_TYPES: dict[str, LayerType] = {
    "embedding": LayerType(names=("w",), shapes=lambda d, c: ((d, c),), outputs=_embedding),
    "linear_3d": LayerType(names=("w", "b"), shapes=lambda d, c: ((d, c), (c,)), outputs=_linear),
    "layer_norm": LayerType(names=("scale", "bias"), shapes=_layer_norm_shapes, outputs=_layer_norm),
}


@dataclass(frozen=True)
class LayerModel:
    """A layer design's model on JAX: :meth:`init_params`, :meth:`logits`, :meth:`order` and :meth:`black_box`
    (what :mod:`dpverify_jaxprivacy._core` calls for the softmax regression and the MLP)."""

    layer: str
    positions: int

    @classmethod
    def of(cls, architecture: LayerArchitecture) -> "LayerModel":
        if architecture.layer not in LAYER_TYPES:
            raise ValueError(
                f"jax-privacy-core trains the layer designs {', '.join(LAYER_TYPES)}, got layer={architecture.layer!r}"
            )
        return cls(layer=architecture.layer, positions=architecture.positions)

    def init_params(self, request: TrainingRequest, seed: int) -> dict[str, dict[str, jax.Array]]:
        """Zeros (``seed`` is not used: the designs start at a known point)."""
        if request.num_tags:
            raise ValueError("the JAX-Privacy trainers take no UniAud++ tags; audit them with the synthetic designs")
        kind = LAYER_TYPES[self.layer]
        shapes = kind.shapes(request.dimension, request.num_classes)
        return {self.layer: {name: jnp.zeros(shape, jnp.float32) for name, shape in zip(kind.names, shapes)}}

    def logits(self, params: dict, features: jax.Array) -> jax.Array:
        """The layer's outputs weighted by each record's position regime (:func:`~dpverify.contract.position_weights`)
        and summed over the positions."""
        table = jnp.asarray(position_weights(self.positions))
        weights = table[jnp.argmax(features, axis=-1) % table.shape[0]]
        return jnp.einsum("ntc,nt->nc", LAYER_TYPES[self.layer].outputs(params[self.layer], features, self.positions), weights)

    def order(self, params: dict) -> list[jax.Array]:
        """The parameters in the designated order (a jitted step returns the dict with its keys sorted)."""
        return [params[self.layer][name] for name in LAYER_TYPES[self.layer].names]

    def black_box(self, params: dict) -> Callable[[np.ndarray], np.ndarray]:
        """``predict_log_proba``: :meth:`logits` run eagerly (the auditor queries each model once or twice),
        float32, log-softmax in float64."""
        trained = jax.tree.map(np.asarray, params)

        def predict_log_proba(features: np.ndarray) -> np.ndarray:
            logits = self.logits(trained, jnp.asarray(np.asarray(features, dtype=np.float32)))
            return log_softmax(np.asarray(logits).astype(np.float64), axis=1)

        return predict_log_proba


@dataclass(frozen=True)
class Undercount:
    """How a variant's per-example norm under-counts its layer: the leaves ``leaves`` enter the global norm
    divided by positions ** ``power``."""

    leaves: tuple[str, ...]
    power: float


UNDERCOUNTS: dict[str, Undercount] = {
    "embedding": Undercount(leaves=("w",), power=0.5),  # positions as rows: 4× at T = 16
    "linear_3d": Undercount(leaves=("b",), power=0.5),  # the bias's positions as rows (Opacus #751): 2.8× at T = 9
    "layer_norm": Undercount(leaves=("scale", "bias"), power=1.0),  # averaged over the positions: 4× at T = 4
}

#: The layer variants' steps (``JaxPrivacy(step=...)``) and the layer each breaks.
LAYER_STEPS: dict[str, str] = {"embedding_norm": "embedding", "linear_bias_norm": "linear_3d", "layer_norm_norm": "layer_norm"}

_LIBRARY_CLIP_PYTREE = clipping.clip_pytree
_SWAP_LOCK = threading.RLock()


def undercounting_clip_pytree(layer: str, positions: int) -> Callable:
    """``clipping.clip_pytree`` whose norm under-counts ``layer``'s leaves (:data:`UNDERCOUNTS`): the library's
    own function given those leaves divided by the factor, and its clipped result multiplied back. A pytree
    without the layer is clipped by the library's function as it is."""
    undercount = UNDERCOUNTS[layer]
    factor = float(positions) ** undercount.power

    def scaled(pytree, by: float):
        own = {name: leaf * by if name in undercount.leaves else leaf for name, leaf in pytree[layer].items()}
        return {**pytree, layer: own}

    def clip_pytree(pytree, *args, **kwargs):
        if not isinstance(pytree, dict) or layer not in pytree:
            return _LIBRARY_CLIP_PYTREE(pytree, *args, **kwargs)
        clipped, stated_norm = _LIBRARY_CLIP_PYTREE(scaled(pytree, 1.0 / factor), *args, **kwargs)
        return scaled(clipped, factor), stated_norm

    return clip_pytree


@contextlib.contextmanager
def _clip_pytree_is(function: Callable):
    """While the block runs (a trace of the clipped sum), ``clipping.clip_pytree`` is ``function``."""
    with _SWAP_LOCK:
        clipping.clip_pytree = function
        try:
            yield
        finally:
            clipping.clip_pytree = _LIBRARY_CLIP_PYTREE


@dataclass(frozen=True, kw_only=True)
class UndercountingStep(DPStep):
    """The correct DP step (``kind="correct"``) whose clipped sum, each time it is traced, clips by
    :func:`undercounting_clip_pytree` for ``layer`` at ``positions``; noise and claim are the library's."""

    layer: str
    positions: int

    def clipped_grad(self, fun, *args, **kwargs) -> clipping.BoundedSensitivityCallable:
        library = super().clipped_grad(fun, *args, **kwargs)
        clip_pytree = undercounting_clip_pytree(self.layer, self.positions)

        def undercounted(*call_args, **call_kwargs):
            with _clip_pytree_is(clip_pytree):
                return library.fun(*call_args, **call_kwargs)

        return dataclasses.replace(library, fun=undercounted)  # its bound and the rest of the library's fields


def layer_step(kind: str, *, clip_norm: float, batch_size: float, architecture) -> DPStep:
    """The DP step of the layer variant ``kind`` (:data:`LAYER_STEPS`): :class:`UndercountingStep` on its own
    layer's design; on another model, which has no such layer, the library's step."""
    layer = LAYER_STEPS[kind]
    if isinstance(architecture, LayerArchitecture) and architecture.layer == layer:
        return UndercountingStep(
            kind="correct", clip_norm=clip_norm, batch_size=batch_size, layer=layer, positions=architecture.positions
        )
    return DPStep(kind="correct", clip_norm=clip_norm, batch_size=batch_size)
