"""The DP step of JAX-Privacy, correct or broken in one place, on both of the library's paths.

A JAX-Privacy DP step is two library calls: ``jax_privacy.clipped_grad`` (the sum of per-example gradients,
each clipped to ``l2_clip_norm``; a callable whose ``l2_norm_bound`` is the sum's sensitivity) and
``jax_privacy.noise_addition.gaussian_privatizer(stddev=σ · l2_norm_bound)`` (fresh Gaussian noise on that
sum). A :class:`DPStep` is those two calls as a variant makes them. The core path (:mod:`._core`) calls a
step's methods directly; the Keras API (:mod:`._keras`) calls the library's module attributes from inside
its own ``train_step``, so :func:`library_calls` puts a step's methods in their place while a ``fit`` runs.

Each variant changes exactly one thing and keeps the claim:

- ``no_noise`` (docs/bugs.md class 1): the privatizer is built with stddev 0;
- ``no_clipping`` (class 2): rows are clipped at an unreachable norm while the callable still states the
  nominal bound, so the noise stays σ times it;
- ``noise_for_mean`` (class 3): the privatizer's stddev is divided by the batch size, the noise meant for the
  mean of the batch added to its sum;
- ``noise_for_clip_norm`` (row 2's class: noise for a norm the sum does not have): with
  ``rescale_to_unit_norm=True`` (the Keras API's default) the clipped sum's sensitivity is 1, and the noise is
  computed as σ · C from the clip norm instead of σ · ``l2_norm_bound``. At C < 1 that is C times too
  little noise (C = 0.5 in the quick profile: a 2× deficit); at C > 1 it errs on the safe side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from dataclasses import dataclass, field

import jax_privacy
from jax_privacy import noise_addition

from dpverify_jaxprivacy._api import GAUSSIAN_PRIVATIZER

__all__ = ["DP_STEPS", "UNCLIPPED_NORM", "DPStep", "library_calls"]

DP_STEPS: tuple[str, ...] = ("correct", "no_noise", "no_clipping", "noise_for_mean", "noise_for_clip_norm")

#: The clip norm of the no-clipping variant: no gradient of a finite float32 model reaches it.
UNCLIPPED_NORM = 1e30

#: The library's own clipped_grad, kept before :func:`library_calls` ever replaces it (its privatizer is
#: kept in :mod:`._api`).
_CLIPPED_GRAD = jax_privacy.clipped_grad
_SWAP_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class DPStep:
    """JAX-Privacy's two DP calls as the variant ``kind`` makes them, for clip norm ``clip_norm`` and a batch
    of ``batch_size`` (what ``noise_for_mean`` divides by). Steps that differ only in ``batch_size`` compare
    equal: it sizes the noise (:meth:`noise_stddev`), never the clipped sum, so they share a traced step."""

    kind: str
    clip_norm: float
    batch_size: float = field(compare=False)

    def __post_init__(self) -> None:
        if self.kind not in DP_STEPS:
            raise ValueError(f"unknown DP step {self.kind!r}; expected one of {', '.join(DP_STEPS)}")

    def clipped_grad(self, fun, *args, **kwargs):
        """``jax_privacy.clipped_grad(fun, ...)``; the no-clipping variant clips at :data:`UNCLIPPED_NORM`
        (scaling as the unit-norm rescale would) and states the nominal bound."""
        if self.kind != "no_clipping":
            return _CLIPPED_GRAD(fun, *args, **kwargs)
        rescale = kwargs.pop("rescale_to_unit_norm", False)
        clip_norm, normalize_by = kwargs["l2_clip_norm"], kwargs.get("normalize_by", 1.0)
        kwargs["l2_clip_norm"] = UNCLIPPED_NORM
        if rescale:  # the rescale divides by the clip norm: keep that scale, drop the clipping
            kwargs["normalize_by"] = normalize_by * clip_norm
        unclipped = _CLIPPED_GRAD(fun, *args, **kwargs)
        nominal = (1.0 if rescale else clip_norm) / normalize_by  # what the library states for these arguments
        return dataclasses.replace(unclipped, l2_norm_bound=nominal)

    def noise_stddev(self, stddev: float) -> float:
        """The standard deviation the variant gives ``gaussian_privatizer`` where the library gives ``stddev``."""
        if self.kind == "no_noise":
            stddev = 0.0
        elif self.kind == "noise_for_mean":
            stddev = stddev / self.batch_size
        elif self.kind == "noise_for_clip_norm":
            stddev = stddev * self.clip_norm
        if not math.isfinite(stddev):
            raise ValueError(f"the noise's standard deviation is {stddev}")
        return stddev

    def privatizer(self, *, stddev: float, **kwargs):
        """``gaussian_privatizer(stddev=...)`` as the variant calls it."""
        return GAUSSIAN_PRIVATIZER(stddev=self.noise_stddev(stddev), **kwargs)


@contextlib.contextmanager
def library_calls(step: DPStep):
    """While the block runs, ``jax_privacy.clipped_grad`` and ``gaussian_privatizer`` are ``step``'s (the
    Keras API looks both up on the library's modules each time it traces its train step). A lock keeps two
    threads from swapping at once; the library's own functions are back when the block ends."""
    if step.kind == "correct":
        yield
        return
    with _SWAP_LOCK:
        jax_privacy.clipped_grad = step.clipped_grad
        noise_addition.gaussian_privatizer = step.privatizer
        try:
            yield
        finally:
            jax_privacy.clipped_grad = _CLIPPED_GRAD
            noise_addition.gaussian_privatizer = GAUSSIAN_PRIVATIZER
