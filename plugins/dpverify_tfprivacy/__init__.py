"""TF-Privacy under audit: its Keras DP-SGD optimizer and three deliberately buggy variants of it.

``tf-privacy-keras`` trains the designated MLP with ``tensorflow_privacy.DPKerasSGDOptimizer`` (one example
per microbatch, per-example losses, Poisson-sampled batches, plain SGD) and claims the ε that TF-Privacy's
own dp_accounting path states (``compute_dp_sgd_privacy``; calibration with its ``compute_noise``).
A request with tags (UniAud++) trains the same way with a separate tag head and returns both heads' black
boxes.
The variants (rows 1-3 of ``bugs.md``) change one piece of TF-Privacy's real step and keep the claim.

This module does not import tensorflow: listing implementations works without it. Training imports
:mod:`dpverify_tfprivacy._keras` and :mod:`dpverify_tfprivacy._accounting`, which do.
"""

from __future__ import annotations

from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest

__all__ = ["TFPrivacyKeras", "implementations"]

_LIBRARY = dict(library="tensorflow-privacy", requires=("tensorflow", "tensorflow_privacy"), extra="tf-privacy")

_NOTES = (
    "DPKerasSGDOptimizer (GenericDPSGDOptimizer over GaussianSumQuery), num_microbatches=None = one example "
    "per microbatch, per-example losses (Reduction.NONE), SGD. Sampling: TF-Privacy's accountant assumes "
    "Poisson sampling while its usual input pipeline shuffles into fixed-size batches (its own privacy "
    "statement warns that Poisson sampling 'is not usually done in training pipelines'); here the input "
    "pipeline samples each record independently with probability q every step, so the accountant's "
    "assumption holds. Normalisation: the optimizer divides the noisy sum by the number of microbatches, "
    "i.e. the realised batch size, not the constant qN (the behaviour of bugs.md row 7, D2-D3); that is "
    "TF-Privacy's real behaviour and is kept. An empty Poisson batch (probability (1-q)^N) skips the "
    "update, because the optimizer cannot take a batch of size 0. Claim: add/remove ε from "
    "tensorflow_privacy.compute_dp_sgd_privacy (RDP); microbatches of one example need no doubling of "
    "the sensitivity. Multi-task requests (UniAud++): a separate tag head on the shared encoder, one "
    "output [main | tags] and one loss per record, so each record's whole gradient (tag head included) "
    "is clipped."
)


class TFPrivacyKeras(Implementation):
    """TF-Privacy's Keras DP-SGD (``step="correct"``) or one of its mutations (see ``_keras.DP_STEPS``)."""

    def __init__(self, info: ImplementationInfo, step: str = "correct") -> None:
        self.info = info
        self.step = step

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_tfprivacy import _keras  # first: it quiets TensorFlow's C++ log before tensorflow loads
        from dpverify_tfprivacy import _accounting

        hp = request.hyperparameters
        try:
            if hp.noise_multiplier is not None:
                sigma = float(hp.noise_multiplier)
            else:
                sigma = _accounting.calibrate_noise_multiplier(
                    hp.target_epsilon, hp.sampling_rate, hp.steps, hp.delta
                )
            claim = _accounting.claim(sigma, hp.sampling_rate, hp.steps, hp.delta)
        except Exception as exc:
            raise RuntimeError(f"{self.info.name}: TF-Privacy's accountant could not state a claim: {exc}") from exc
        try:
            run = _keras.train_mlp(request, self.step, sigma)
        except FloatingPointError as exc:
            raise RuntimeError(f"{self.info.name}: {exc}") from exc
        return TrainedModel(
            predict_log_proba=run.predict_log_proba,
            predict_tag_log_proba=run.predict_tag_log_proba,
            claim=claim,
            device=run.device,
        )


def _variant(name: str, step: str, bug: int, breaks: str, how: str) -> TFPrivacyKeras:
    info = ImplementationInfo(
        name=name,
        expected="violation",
        breaks=breaks,
        bug=bug,
        detectability="D1",
        notes=f"{how} The claim is the correct run's. " + _NOTES,
        **_LIBRARY,
    )
    return TFPrivacyKeras(info, step)


def implementations() -> list[Implementation]:
    """The entry point ``dpverify_tfprivacy:implementations``; imports no tensorflow."""
    return [
        TFPrivacyKeras(ImplementationInfo(name="tf-privacy-keras", notes=_NOTES, **_LIBRARY), "correct"),
        _variant(
            "tf-privacy-no-noise",
            "no_noise",
            1,
            "Gaussian noise N(0, σ²C²) must be added to the sum of clipped rows every step; none is.",
            "A GaussianSumQuery subclass returns the clipped sum instead of its noised result.",
        ),
        _variant(
            "tf-privacy-no-clipping",
            "no_clipping",
            2,
            "Each per-example gradient row must be clipped to norm C before summing; rows pass unclipped "
            "while the noise stays σ·C for the nominal C.",
            "The GaussianSumQuery clips at a huge norm (1e30) with stddev σ·C for the nominal C.",
        ),
        _variant(
            "tf-privacy-noise-for-mean",
            "noise_for_mean",
            3,
            "The noise on the sum of clipped rows must have standard deviation σ·C; it is σ·C/B, "
            "the noise meant for the mean of B rows.",
            "A GenericDPSGDOptimizer subclass divides the query's stddev by the realised batch size B "
            "before TF-Privacy's own gradient computation.",
        ),
    ]
