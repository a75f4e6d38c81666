"""What differs between the TF-Privacy releases the plugin supports (0.8.12, 0.9.0) where it calls them, and
the findings that hold for each. Imports neither tensorflow nor tensorflow_privacy, so the registry and the
tests can ask it about any release.

The public calls are the same in both (``make_dp_model_class``, ``DPKerasSGDOptimizer``,
``compute_dp_sgd_privacy``, ``compute_noise``, the registry functions). The fast-clipping ``Dense`` registry
function is not (``registry_functions/dense.py``, read in both wheels):

- 0.8.12 takes each record's squared norm as (Σ|x|² + 1)·Σ|g|² over all of the record's positions when
  ``num_microbatches`` is ``None`` (its "special handling for better efficiency"), the 2-D formula
  |x|²|g|² + |g|². On a 3-D (sequence) input the bias term is Σ_t |g_t|², not |Σ_t g_t|², the norm of the
  bias gradient, which sums over the positions: up to T times too small, √T in the norm (Opacus #751's bug). The kernel
  term Σ_t|x_t|²·Σ_t|g_t|² bounds its true norm from above, so a record whose bias gradient dominates is
  clipped too weakly. Its microbatched branch (Gram matrices over the positions) is exact.
- 0.9.0 computes it with ``einsum_utils.compute_fast_einsum_squared_gradient_norm`` (first shipped there):
  ⟨XXᵀ, GGᵀ⟩ + |Σ_t g_t|², exact.
"""

from __future__ import annotations

from dpverify.releases import Finding, Library, installed_release

__all__ = ["LIBRARY", "DENSE_BIAS_3D", "installed_version", "missing_step"]

#: What dpverify gates of TF-Privacy (:mod:`dpverify.releases`): 0.8.12 (with tf-models-official 2.15.0 and
#: tensorflow-text 2.15.0, which its pin ~= 2.13 lets pip choose beside TF 2.15) and 0.9.0, in the torch
#: family's environment. 0.8.11 and earlier pin tensorflow-probability ~= 0.20.0 (built for TF 2.12), which
#: the family's 0.22.1 excludes.
LIBRARY = Library(
    package="tensorflow-privacy", extra="tf-privacy", family="torch", constraints="constraints.txt",
    implementations="tf-privacy-*", versions=("0.8.12", "0.9.0"),
)

#: The first release whose Dense norm is the einsum formula (and has ``compute_fast_einsum_squared_gradient_norm``).
EINSUM_NORM_FIRST = (0, 9)

#: TF-Privacy 0.8.12: the fast-clipping Dense norm states a 3-D input's bias part as Σ_t |g_t|². Its address is the
#: fixed release's ``dense.py``: we found no upstream issue or pull request about it.
DENSE_BIAS_3D = Finding(
    issue="https://github.com/tensorflow/privacy/blob/v0.9.0/tensorflow_privacy/privacy/fast_gradient_clipping/registry_functions/dense.py",
    first=(0, 8, 12),
    fixed=EINSUM_NORM_FIRST,
    summary="fast clipping's Dense registry function (registry_functions/dense.py, num_microbatches=None) takes "
    "a record's squared norm as (Σ|x|² + 1)·Σ|g|² over its positions, so on a 3-D (sequence) input the bias part "
    "is Σ_t |g_t|² instead of |Σ_t g_t|², up to T times too small (√T in the norm; Opacus #751's bug): a record whose bias "
    "gradient dominates is clipped too weakly. Fixed in 0.9.0, whose dense.py takes the norm with "
    "einsum_utils.compute_fast_einsum_squared_gradient_norm, which sums the bias gradient over the positions",
)


def installed_version() -> tuple[int, ...] | None:
    """The installed TF-Privacy release, or ``None`` when it is not installed."""
    return installed_release("tensorflow-privacy")



def missing_step(version: tuple[int, ...], step: str) -> str | None:
    """Why release ``version`` has no fast-clipping ``step`` to build, or ``None`` when it has one."""
    if step == "linear_bias_norm" and version < EINSUM_NORM_FIRST:
        return (
            "einsum_utils.compute_fast_einsum_squared_gradient_norm (first shipped in TF-Privacy 0.9.0) for the "
            "kernel's norm; the release's own Dense norm already takes a 3-D input's bias as Σ_t |g_t|², the bug "
            "this variant writes (tf-privacy-fast-clipping's linear_3d audit finds it)"
        )
    return None
