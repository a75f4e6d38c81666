"""Helpers for torch-based implementations under audit (imports torch; the core never imports this module).

Everything a torch DP-SGD implementation needs to honour the contract the same way the built-ins do:

- :func:`seeds_for` / :func:`seed_everything`: one request seed decides model init, sampling and noise;
- :func:`resolve_device`: ``"cuda"`` when asked for and available, else ``"cpu"`` (report the result);
- :func:`build_mlp`: the designated ``d -> hidden_width -> C`` ReLU network, seeded default init;
- :func:`poisson_batches`: exactly ``steps`` Poisson-sampled batches of record indices;
- :func:`fast_math`: flush denormals to zero during training only;
- :func:`make_predictor`: the black box ``predict_log_proba(features) -> (n, C) float64`` array.

Poisson sampling draws ``torch.rand(N, generator=g) < q`` per step from a CPU generator, the same rule
Opacus' ``UniformWithReplacementSampler`` uses, so two implementations seeded alike sample alike.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from dpverify.contract import TrainingRequest

__all__ = [
    "Seeds",
    "seeds_for",
    "seed_everything",
    "resolve_device",
    "fast_math",
    "denormals_flushed",
    "build_mlp",
    "poisson_batches",
    "make_predictor",
    "as_tensors",
]


@dataclass(frozen=True)
class Seeds:
    """Independent seeds for the three random parts of a DP-SGD run, derived from one request seed."""

    init: int
    sampling: int
    noise: int


def seeds_for(seed: int) -> Seeds:
    """Derive independent init, sampling and noise seeds from ``seed`` (numpy ``SeedSequence``)."""
    init, sampling, noise = np.random.SeedSequence(seed).generate_state(3, dtype=np.uint32)
    return Seeds(init=int(init), sampling=int(sampling), noise=int(noise))


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


def build_mlp(
    request: TrainingRequest, *, seed: int | None = None, device: torch.device | str = "cpu"
) -> nn.Sequential:
    """The designated model ``d -> hidden_width -> C`` with one ReLU and torch's default (Kaiming-uniform)
    init, drawn from a generator seeded with ``seed`` (default: the request's init seed).

    Layers are ``Linear, ReLU, Linear`` in an ``nn.Sequential``; parameters in order W1, b1, W2, b2."""
    if seed is None:
        seed = seeds_for(request.seed).init
    # nn.Linear initialises from the global generator: fork it so the caller's RNG state is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(request.dimension, request.architecture.hidden_width),
            nn.ReLU(),
            nn.Linear(request.architecture.hidden_width, request.num_classes),
        )
    return model.to(device)


def as_tensors(request: TrainingRequest, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The request's canaries as ``(float32 features, int64 labels)`` tensors on ``device``."""
    features = torch.from_numpy(np.ascontiguousarray(request.features)).to(device)
    labels = torch.from_numpy(np.ascontiguousarray(request.labels)).to(device)
    return features, labels


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
    model: nn.Module, device: torch.device | str = "cpu", *, batch_size: int = 4096
) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap a trained classifier as the black box: ``features (n, d) -> log-probabilities (n, C)``.

    Runs in eval mode without gradients, in batches of ``batch_size`` rows; log-softmax is taken in float64
    so that differences of log-probabilities near 0 keep their precision. NaN/inf parameters give NaN/inf
    outputs: they are returned as they are, for the auditor to report."""
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
                for start in range(0, features.shape[0], batch_size):
                    chunk = torch.as_tensor(features[start : start + batch_size], dtype=torch.float32, device=device)
                    logits = model(chunk)
                    outputs.append(torch.log_softmax(logits.double(), dim=1).cpu().numpy())
        finally:
            model.train(was_training)
        if not outputs:
            out_features = _out_features(model)
            return np.zeros((0, out_features), dtype=np.float64)
        return np.concatenate(outputs, axis=0)

    return predict_log_proba


def _out_features(model: nn.Module) -> int:
    last = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not last:
        raise ValueError("cannot tell the number of classes of a model without nn.Linear layers")
    return int(last[-1].out_features)
