"""JAX-Privacy 1.0.0 and 2.0.0 under audit: its core API, its Keras API, and deliberately buggy variants of each.

``jax-privacy-core`` trains the designated model with the library's building blocks: Poisson batches from
``batch_selection.CyclicPoissonSampling``, padded and masked with ``is_padding_example``; the clipped sum
from ``jax_privacy.clipped_grad``; noise from ``noise_addition.gaussian_privatizer``; the claim from the
library's ``DpsgdTrainingAccountant`` (PLD, as its Keras API configures it). ``jax-privacy-keras`` trains a
Keras 3 model (JAX backend) made private with ``keras_api.make_private``, Poisson sampling in ``fit``.
The variants change one of the library's two DP calls on either path (:mod:`dpverify_jaxprivacy._steps`).

``jax-privacy-keras-accumulation`` is the unmodified 2.0.0 Keras API with gradient accumulation and a
noise multiplier of the user's (the smallest its config accepts): its config checks the noise against the
physical batch while training samples at the accumulated one, so it states an ε its run does not have
(fixed upstream after the release, google-deepmind/jax_privacy PR #287).

``jax-privacy-core`` also trains each layer design (:data:`LAYERS`, :mod:`dpverify_jaxprivacy._layers`), and
``jax-privacy-embedding-norm``, ``-linear-bias-norm`` and ``-layer-norm-norm`` clip by a per-example norm
that under-counts one layer's leaves; only that layer's design audits them.

``jax-privacy-keras-fixed-batches`` is the unmodified Keras API at its default, ``poisson_sampling_in_fit=False``:
fixed-size batches of a shuffled dataset, accounted as Poisson sampling (google-deepmind/jax_privacy#84). At the
default profiles' q = 1 its one batch is the full batch, the same mechanism as Poisson sampling at q = 1.

``jax-privacy-dense-mf`` trains with a dense ``noise_addition.matrix_factorization_privatizer``, its stddev scaled by
the library's min-separation sensitivity for the fixed cyclic batches it runs, and claims ``GaussianDpEvent(σ)`` with
the strategy (:mod:`._matrix_factorization`); its variants and the known issue of a run longer than its noising
matrix (google-deepmind/jax_privacy PR #338) are there too.

On 1.0.0 (:mod:`._releases`, :mod:`._api`) the core path and its variants run as on 2.0.0 through that release's
calls; its Keras API has no Poisson sampling in ``fit`` and clips and noises with its ``dp_sgd`` gradient
computer, so of the Keras paths only ``jax-privacy-keras-fixed-batches`` runs and the others are ``n/a``.

``jax-privacy-bandmf`` trains with JAX-Privacy 2.0.0's primary entry point, ``BandMFExecutionPlanConfig``: its
plan's cyclic Poisson batches, clipped sum and streaming matrix-factorization noise, its claim the plan's
``dp_event`` stated with the banded strategy (:mod:`._bandmf`); its variants break the noise's scale, the batch
selection or the noising matrix (docs/bugs.md classes 13–15). ``n/a`` on 1.0.0.

This module imports neither jax nor jax_privacy: listing implementations works without them.
"""

from __future__ import annotations

from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest, noise_and_claim
from dpverify_jaxprivacy._bandmf import bandmf_implementations

__all__ = ["JaxPrivacy", "implementations"]

#: The library's two training paths.
PATHS: tuple[str, ...] = ("core", "keras")

_LIBRARY = dict(library="jax-privacy", requires=("jax", "jax_privacy", "keras"), extra="jax-privacy")
#: The Keras API's batch size is its normaliser and, over train_size, its sampling rate: it takes no
#: designated normaliser, so no two-world world applies (ImplementationInfo.designated_normaliser).
_KERAS = dict(_LIBRARY, designated_normaliser=False)

#: The layer designs the core path trains: the keys of ``_layers.LAYER_TYPES`` (a test checks them; this module
#: imports no jax).
LAYERS: tuple[str, ...] = ("embedding", "linear_3d", "layer_norm")

_CORE_NOTES = (
    "jax_privacy core API: batch_selection.CyclicPoissonSampling(sampling_prob=q, iterations=steps) batches, "
    "padded with pad_to_multiple_of (64, or a quarter of the octave above 256) and masked with is_padding_example; jax_privacy.clipped_grad("
    "l2_clip_norm=C, rescale_to_unit_norm=True) sums per-example gradients clipped to C over unit norm; "
    "noise_addition.gaussian_privatizer(stddev=σ·l2_norm_bound) adds fresh noise; SGD update lr·C·noisy sum / "
    "normaliser (the designated public normaliser, else qN). Claim: jax_privacy.accounting."
    "DpsgdTrainingAccountant (PLD, discretisation 1e-3, add/remove); calibration with its "
    "calibrate_noise_multiplier. Layer designs: the same step on dpverify.torch.LayerModel's model (zero "
    "parameters under the layer's name, outputs summed over the positions), its per-example gradients by vmap."
)

_KERAS_NOTES = (
    "jax_privacy.keras_api.make_private on a Keras 3 model (JAX backend), DPKerasConfig(batch_size=qN, "
    "gradient_accumulation_steps=1, train_steps=steps, train_size=N, poisson_sampling_in_fit=True, "
    "rescale_to_unit_norm=True (its default)), SGD with learning rate lr·C (undoing the unit rescale); "
    "fit(epochs=1, steps_per_epoch=steps). The library's fit draws Poisson batches with probability "
    "batch_size/train_size, pads them, clips with clipped_grad(normalize_by=batch_size) and adds "
    "gaussian_privatizer noise in its own train_step. Claim: its accountant, as for jax-privacy-core. "
    "The model and its traced train step are built once per configuration and process and reused by every "
    "run: weights, optimizer state, step counter and noise key are reset each run."
)


class JaxPrivacy(Implementation):
    """JAX-Privacy on ``path`` with the DP step ``step`` (``_steps.DP_STEPS``)."""

    def __init__(
        self, info: ImplementationInfo, step: str = "correct", *, path: str = "core", call: dict | None = None
    ) -> None:
        if path not in PATHS:
            raise ValueError(f"unknown JAX-Privacy path {path!r}; expected one of {', '.join(PATHS)}")
        if call and path != "keras":
            raise ValueError("only the Keras path takes a call (accumulation, user_noise, fixed_batches)")
        self.info = info
        self.step = step
        self.path = path
        self.call = dict(call or {})

    def unavailable_reason(self) -> str | None:
        """Also ``n/a`` where the installed release has no such path (:func:`._releases.missing_path`:
        1.0.0's Keras API samples no Poisson batches in ``fit`` and calls neither of the variants' calls)."""
        from importlib import metadata

        from dpverify_jaxprivacy._releases import installed_version, missing_path

        version = None if super().unavailable_reason() else installed_version()
        reason = None if version is None else missing_path(
            version, self.path, poisson_in_fit=not self.call.get("fixed_batches", False), variant=self.step != "correct"
        )
        if reason is None:
            return super().unavailable_reason()
        return f"n/a: {self.info.name} needs {reason}; installed: JAX-Privacy {metadata.version('jax-privacy')}"

    def train(self, request: TrainingRequest) -> TrainedModel:
        if self.path == "keras":
            from dpverify_jaxprivacy._keras import KerasCall, train_keras

            try:
                run = train_keras(request, self.step, KerasCall(**self.call))
            except (FloatingPointError, ValueError) as exc:
                raise RuntimeError(f"{self.info.name}: {exc}") from exc
            return TrainedModel(predict_log_proba=run.predict_log_proba, claim=run.claim, device=_device())
        return self._train_core(request)

    def _train_core(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_jaxprivacy import _accounting

        hp = request.hyperparameters
        sigma, claim = noise_and_claim(
            self.info.name,
            "JAX-Privacy",
            hp,
            calibrate=lambda: _accounting.calibrate_noise_multiplier(
                hp.target_epsilon, *_accounting.batch_and_size(hp.sampling_rate), hp.steps, hp.delta
            ),
            claim=lambda sigma: _accounting.claim(sigma, hp.sampling_rate, hp.steps, hp.delta),
        )
        from dpverify_jaxprivacy._core import train_core

        try:
            predict = train_core(request, self.step, sigma)
        except (FloatingPointError, ValueError) as exc:
            raise RuntimeError(f"{self.info.name}: {exc}") from exc
        return TrainedModel(predict_log_proba=predict, claim=claim, device=_device())


def _device() -> str:
    """Where JAX ran: ``cuda`` on a GPU backend, else ``cpu``."""
    import jax

    return "cuda" if jax.default_backend() == "gpu" else "cpu"


#: What each variant breaks.
_BREAKS = {
    "no_noise": (1, "Gaussian noise N(0, σ²C²) must be added to the sum of clipped rows every step; none is."),
    "no_clipping": (
        2,
        "Each per-example gradient row must be clipped to norm C before summing; rows pass unclipped while the "
        "noise stays σ times the nominal bound.",
    ),
    "noise_for_mean": (
        3,
        "The noise on the sum of clipped rows must have standard deviation σ·C; it is σ·C/B, the noise meant "
        "for the mean of B rows.",
    ),
    "noise_for_clip_norm": (
        2,
        "The noise must be σ times the clipped sum's sensitivity (clipped_grad's l2_norm_bound, 1 with "
        "rescale_to_unit_norm); it is σ·C, computed from the clip norm, which at C < 1 is C times too little.",
    ),
}

_HOW = {
    "no_noise": "gaussian_privatizer is built with stddev 0 while the accountant is given σ.",
    "no_clipping": "clipped_grad clips at 1e30 and its callable states the nominal l2_norm_bound.",
    "noise_for_mean": "gaussian_privatizer's stddev is divided by the batch size B.",
    "noise_for_clip_norm": "gaussian_privatizer's stddev is σ·C instead of σ·l2_norm_bound (= σ after the unit rescale).",
}

_DETECTABILITY = {"no_noise": "D1", "no_clipping": "D1", "noise_for_mean": "D1", "noise_for_clip_norm": "D2"}


def _variant(path: str, step: str) -> JaxPrivacy:
    bug, breaks = _BREAKS[step]
    info = ImplementationInfo(
        name=f"jax-privacy{'-keras' if path == 'keras' else ''}-{step.replace('_', '-')}",
        expected="violation",
        breaks=breaks,
        bug=bug,
        detectability=_DETECTABILITY[step],
        notes=f"{_HOW[step]} The claim is the correct run's. " + (_KERAS_NOTES if path == "keras" else _CORE_NOTES),
        **(_KERAS if path == "keras" else _LIBRARY),
    )
    return JaxPrivacy(info, step, path=path)


#: The variants whose per-example norm under-counts one layer (docs/bugs.md class 2 for that layer, D2): (step, layer,
#: how). ``clipping.clip_pytree`` is swapped while the clipped sum traces (``_layers.UndercountingStep``).
_LAYER_VARIANTS = (
    ("embedding_norm", "embedding",
     "clip_pytree takes the norm with the embedding table's gradient divided by √T, what a norm formula that takes "
     "the record's T positions as separate rows states (√(Σ_t |G/T|²)); sensitivity 4C in the embedding design."),
    ("linear_bias_norm", "linear_3d",
     "clip_pytree takes the norm with the dense layer's bias gradient divided by √T, the bias's positions as "
     "separate rows (Opacus #751's bug), the kernel's counted whole; sensitivity 2.8C in the linear_3d design."),
    ("layer_norm_norm", "layer_norm",
     "clip_pytree takes the norm with the LayerNorm's scale and bias gradients averaged over the T positions "
     "(divided by T); sensitivity 4C in the layer_norm design."),
)


def _layer_variant(step: str, layer: str, how: str) -> JaxPrivacy:
    info = ImplementationInfo(
        name=f"jax-privacy-{step.replace('_', '-')}",
        expected="violation",
        breaks="each record's gradient must be clipped by its whole norm; here the per-example norm under-counts "
        "one layer's gradient, so its records are clipped too weakly",
        bug=2,
        detectability="D2",
        notes=f"{how} The clipped gradient is the record's whole one, scaled as the library scales it; the claim "
        "is the correct run's. " + _CORE_NOTES,
        layers=(layer,),
        **_LIBRARY,
    )
    return JaxPrivacy(info, step)


_ACCUMULATION_NOTES = (
    "jax_privacy.keras_api as above, called as its documentation shows with gradient accumulation: "
    "DPKerasConfig(batch_size=qN/8 rounded down, gradient_accumulation_steps=8, train_steps=8·steps, "
    "train_size=8·batch_size (the last N mod 8 records are left out, so every run states q = 1/8 exactly "
    "and pooled runs make one claim), poisson_sampling_in_fit=True) and the user's noise_multiplier: the smallest the config accepts for the "
    "target ε (bisection on DPKerasConfig itself). Its _validate_params accounts that σ at the physical batch "
    "(q = batch_size/train_size), while fit samples and noises per physical batch with σ/√8 and the "
    "optimizer averages 8 of them per update, so the config states an ε the run does not have. The claim is "
    "the library's accountant on the numbers its check used."
)

_FIXED_BATCH_NOTES = (
    "jax_privacy.keras_api.make_private as for jax-privacy-keras, at the config's default "
    "poisson_sampling_in_fit=False: DPKerasConfig(batch_size=B, train_size=N, train_steps=steps, "
    "gradient_accumulation_steps=1) with B = round(qN) (the designated expected_batch_size when given), and "
    "fit given shuffled fixed-size batches: each epoch a uniform random order cut into N // B batches of B, "
    "the N mod B records left over sitting that epoch out, exactly the request's steps epoch after epoch. "
    "Keras' own fit(x, y, batch_size=B) cannot be used when B does not divide N: it hands over a short last "
    "batch, which the library's train step refuses with a ValueError (its batch size must equal "
    "DPKerasConfig.batch_size), so a user must drop the remainder. The library's train step clips with "
    "clipped_grad(normalize_by=B), adds gaussian_privatizer noise and SGD steps with lr·C; nothing is "
    "padded. Claim: its accountant (PLD), Poisson sampling at q = B/N for the run's steps: the mechanism it "
    "accounts is not the one it runs (a record sits in exactly one batch an epoch, or none, beside B - 1 "
    "others), which jax_privacy#84 reports; 2.0.0 states its claim without a warning. 1.0.0's DPKerasConfig has no "
    "poisson_sampling_in_fit: fixed batches are its fit's only batching, clipped and noised by its dp_sgd gradient "
    "computer (DpsgdGradientComputer: noise σ/B on the mean of the unit-rescaled clipped rows), accounted the same way."
)


def implementations() -> list[Implementation]:
    """The entry point ``dpverify_jaxprivacy:implementations``; imports no jax."""
    from dpverify_jaxprivacy._matrix_factorization import implementations as dense_matrix_factorization

    return (
        [
            JaxPrivacy(ImplementationInfo(name="jax-privacy-core", notes=_CORE_NOTES, layers=LAYERS, **_LIBRARY)),
            JaxPrivacy(ImplementationInfo(name="jax-privacy-keras", notes=_KERAS_NOTES, **_KERAS), path="keras"),
            JaxPrivacy(
                ImplementationInfo(
                    name="jax-privacy-keras-accumulation",
                    expected="known-issue",
                    issue="https://github.com/google-deepmind/jax_privacy/pull/287",
                    bug=8,  # the accountant is fed the physical batch's q
                    notes=_ACCUMULATION_NOTES,
                    **_KERAS,
                ),
                path="keras",
                call=dict(accumulation=8, user_noise=True),
            ),
            JaxPrivacy(
                ImplementationInfo(
                    name="jax-privacy-keras-fixed-batches",
                    expected="known-issue",
                    bug=9,  # shuffled fixed-size batches accounted as Poisson sampling
                    issue="https://github.com/google-deepmind/jax_privacy/issues/84",
                    notes=_FIXED_BATCH_NOTES,
                    **_KERAS,
                ),
                path="keras",
                call=dict(fixed_batches=True),
            ),
        ]
        + [_variant("core", step) for step in _BREAKS]
        + [_variant("keras", step) for step in _BREAKS]
        + [_layer_variant(*row) for row in _LAYER_VARIANTS]
        + dense_matrix_factorization()
        + bandmf_implementations()
    )
