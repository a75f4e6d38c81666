"""One traced DP step per configuration, reused by every run of it in the process (imports tensorflow).

Why: building the Keras model and TF-Privacy's optimizer or DP model and tracing their ``tf.function`` step
took about 1 s a run on the 2-core CPU, ~90 % of a small run, and a two-world audit trains thousands of
runs of one configuration. A :class:`ReusedStep` keeps the model and its DP step, traced once as a
concrete function of a batch ``(x, y)`` with a ``None`` batch dimension (Poisson batch sizes never
retrace it). :meth:`ReusedStep.start` puts every variable the step captures back to its value when it was
traced (the optimizer's step counter, metric states), the weights to the run's initial weights, and the
noise to the run's own seed. The step's code is TF-Privacy's, unchanged: it clips, noises and normalises;
only the source of its standard normal draws differs (:func:`noise_from`).

Noise: TF-Privacy 0.9 draws it with stateful ``RandomStandardNormal`` ops (``GaussianSumQuery`` through
``tf.random_normal_initializer``, the DP Keras model through ``tf.random.normal``) whose seeds are
attributes fixed at trace time from the global seed. Reused, such an op continues its stream, so a run's
noise would depend on the runs before it; ``tf.random.set_seed`` rewinds the stream to the traced seeds,
so every run would draw the same noise (both measured in ``tests/test_tfprivacy_reuse.py``). So while the
step is traced every standard normal draw comes from a ``tf.random.Generator`` (stateless Philox ops
reading a state variable) that each run resets from its noise seed, and a trace still holding a stateful
random op is refused.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Hashable

from dpverify_tfprivacy._tf import tf  # first: it imports tensorflow without its CUDA-factory noise

import numpy as np  # noqa: E402
from tensorflow.python.ops import gen_random_ops  # noqa: E402

__all__ = ["CACHE_SIZE", "LOCK", "ReusedStep", "captured_variables", "noise_from", "reused_step", "stateful_random_ops"]

#: How many traced steps a process keeps (least recently used dropped first): one per configuration an
#: audit trains, a few at once (a two-world audit alternates one configuration's two datasets).
CACHE_SIZE = 4

#: Held while a run trains on a shared model or a black box loads its weights into one.
LOCK = threading.RLock()

#: TensorFlow's stateful random ops: seeded when traced, then a stream that runs on across calls.
STATEFUL_RANDOM_OPS = frozenset(
    {
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
        "ParameterizedTruncatedNormal",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "Multinomial",
    }
)


@contextlib.contextmanager
def noise_from(generator: tf.random.Generator):
    """While tracing: TensorFlow's standard normal op, behind ``tf.random.normal`` and
    ``tf.random_normal_initializer`` (which scale and shift its draws), draws from ``generator``. The patch
    is process-wide: steps are traced under :data:`LOCK`, and TensorFlow code traced by another thread
    meanwhile would draw from the generator too."""

    def standard_normal(shape, dtype, seed=0, seed2=0, name=None):  # the op's signature; its seeds are unused
        return generator.normal(shape, dtype=dtype, name=name)

    original = gen_random_ops.random_standard_normal
    gen_random_ops.random_standard_normal = standard_normal
    try:
        yield
    finally:
        gen_random_ops.random_standard_normal = original


def stateful_random_ops(function) -> list[str]:
    """The stateful random ops in a concrete function's graph and the functions it calls (loop bodies,
    ``vectorized_map``), as ``"type name"``."""
    graph = function.graph.as_graph_def()
    nodes = list(graph.node) + [node for library in graph.library.function for node in library.node_def]
    return sorted(f"{node.op} {node.name}" for node in nodes if node.op in STATEFUL_RANDOM_OPS)


def captured_variables(function, *written: tf.Variable) -> list[tf.Variable]:
    """Every variable a concrete function captures, i.e. all the state it can read or write. Its
    ``variables`` lists those it reads; ``written`` names those it only writes (the optimizer's step
    counter is only incremented); ``RuntimeError`` for a captured resource that is neither, since a run
    could not reset it."""
    known = {id(v.handle): v for v in (*function.variables, *written)}
    resources = [t for t in function.captured_inputs if t.dtype == tf.resource]
    unknown = [t for t in resources if id(t) not in known]
    if unknown:
        raise RuntimeError(f"the traced DP step captures {len(unknown)} resource(s) that no run would reset")
    return [known[id(t)] for t in resources]


@dataclass(eq=False)
class ReusedStep:
    """A model, its DP step traced once, the optimizer it steps with, the step's variables as traced, and
    the generator of its noise."""

    model: tf.keras.Model
    step: Callable[[tf.Tensor, tf.Tensor], None]
    optimizer: tf.keras.optimizers.legacy.Optimizer
    noise: tf.random.Generator
    traced_state: tuple[tuple[tf.Variable, np.ndarray], ...]

    @classmethod
    def trace(cls, make_step: Callable, specs: tuple[tf.TensorSpec, ...], sample: tuple[tf.Tensor, ...]) -> ReusedStep:
        """Build with ``make_step(*sample)`` (model, DP step on a batch ``(x, y)``, optimizer) and trace the
        step for ``specs``; ``RuntimeError`` if its noise would not come from the generator or it holds
        state a run could not reset.

        TensorFlow's global seed is set (to 0) first: with op determinism on, TensorFlow wants one when a
        random op is traced, although no op seed it gives reaches a draw here. Setting it clears
        TensorFlow's kernel caches, which costs each traced step a new instantiation (~0.2 s), so runs
        that reuse a step leave it alone."""
        tf.random.set_seed(0)
        noise = tf.random.Generator.from_seed(0)
        model, step, optimizer = make_step(*sample)
        with noise_from(noise):
            traced = tf.function(step).get_concrete_function(*specs)
        stateful = stateful_random_ops(traced)
        if stateful:
            raise RuntimeError(f"the traced DP step still draws from stateful random ops: {', '.join(stateful)}")
        state = tuple((v, v.numpy()) for v in captured_variables(traced, optimizer.iterations))
        return cls(model=model, step=traced, optimizer=optimizer, noise=noise, traced_state=state)

    @property
    def iterations(self) -> tf.Variable:
        return self.optimizer.iterations

    def start(self, weights: list[np.ndarray], noise_seed: int) -> None:
        """Reset for a run: every variable as traced, then the model's ``weights``, and the noise generator
        from ``noise_seed``."""
        for variable, value in self.traced_state:
            variable.assign(value)
        self.model.set_weights(weights)
        self.noise.reset_from_seed(noise_seed)


_CACHE: collections.OrderedDict[Hashable, ReusedStep] = collections.OrderedDict()


def reused_step(key: Hashable, trace: Callable[[], ReusedStep]) -> ReusedStep:
    """The step cached under ``key`` (everything its trace depends on), else ``trace()`` cached, keeping at
    most :data:`CACHE_SIZE` steps."""
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    _CACHE[key] = entry = trace()
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return entry
