"""Import JAX (and Keras 3 on its JAX backend) the way every module of this plugin needs it.

Keras reads ``KERAS_BACKEND`` once, at its first import, and JAX-Privacy's Keras API refuses any backend but
JAX; setting it here, before anything imports keras, makes the plugin work whatever the caller's
environment says (a caller who already imported keras with another backend gets a clear error from
:func:`keras_on_jax`).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

__all__ = ["jax", "jnp", "keras_on_jax"]


def keras_on_jax():
    """The ``keras`` module, checked to run on the JAX backend."""
    import keras

    if keras.config.backend() != "jax":
        raise RuntimeError(
            f"JAX-Privacy's Keras API needs Keras on the JAX backend, but keras was imported with the "
            f"{keras.config.backend()!r} backend; set KERAS_BACKEND=jax before anything imports keras"
        )
    return keras
