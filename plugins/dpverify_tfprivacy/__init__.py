"""TF-Privacy under audit: its Keras DP-SGD optimizer, its DP Keras model with fast gradient clipping, and
deliberately buggy variants of each.

``tf-privacy-keras`` trains the designated MLP with ``tensorflow_privacy.DPKerasSGDOptimizer`` (one example
per microbatch, per-example losses, Poisson-sampled batches, plain SGD) and claims the ε that TF-Privacy's
own dp_accounting path states (``compute_dp_sgd_privacy``; calibration with its ``compute_noise``).
A request with tags (UniAud++) trains the same way with a separate tag head and returns both heads' black
boxes.
``tf-privacy-fast-clipping`` trains the same model as TF-Privacy's ``DPModel`` (``make_dp_model_class``)
with the fast-clipping layer registry (ghost norms), with the same sampler, seeds and claim.
The variants (classes 1-4 of ``docs/bugs.md``) change one piece of TF-Privacy's real step and keep the claim.
``tf-privacy-ftrl`` trains with ``DPFTRLTreeAggregationOptimizer`` (DP-FTRL, the tree restarted every epoch of
1/q batches) and claims what ``compute_rdp_tree_restart`` counts, with the tree's noise structure; its two
variants (classes 13 and 16) are in :mod:`dpverify_tfprivacy._ftrl`.
``tf-privacy-keras-fixed-batches`` is the unmodified optimizer fed as TF-Privacy's tutorial feeds it:
shuffled fixed-size batches, accounted by ``compute_dp_sgd_privacy`` as Poisson sampling (a known issue:
its own documentation says that it "assumes Poisson subsampling, which is rarely used in practice").

This module does not import tensorflow: listing implementations works without it. Training imports
:mod:`dpverify_tfprivacy._keras` (or ``_fast_clipping``) and :mod:`dpverify_tfprivacy._accounting`, which do.
"""

from __future__ import annotations

from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest, noise_and_claim

__all__ = ["TFPrivacyFTRL", "TFPrivacyKeras", "implementations"]

#: The two DP code paths: TF-Privacy's Keras optimizer, and its DP Keras model with fast gradient clipping.
PATHS: tuple[str, ...] = ("optimizer", "fast_clipping")

_LIBRARY = dict(
    library="tensorflow-privacy", requires=("tensorflow", "tensorflow_privacy"), extra="tf-privacy", microbatches=True
)

_NOTES = (
    "DPKerasSGDOptimizer (GenericDPSGDOptimizer over GaussianSumQuery), num_microbatches=None = one example "
    "per microbatch, per-example losses (Reduction.NONE), SGD. Per-example rows: the tape handed to "
    "minimize computes the optimizer's jacobian record by record (tf.vectorized_map over each record's own "
    "forward and backward pass), the rows GradientTape.jacobian of the batch loss gives, in O(B) instead of "
    "O(B²) work; the optimizer and its query clip, sum, noise and normalise them. Sampling: TF-Privacy's accountant assumes "
    "Poisson sampling while its usual input pipeline shuffles into fixed-size batches (its own privacy "
    "statement warns that Poisson sampling 'is not usually done in training pipelines'); here the input "
    "pipeline samples each record independently with probability q every step, so the accountant's "
    "assumption holds. Normalisation: the optimizer divides the noisy sum by the number of microbatches, "
    "i.e. the batch it is handed, and has no setting for a public normaliser; with Poisson batches that is "
    "the realised batch size, which reads the private data (docs/bugs.md class 7: the two-world dataset-size world "
    "separates 2 from 3 records in every run). So each step's learning rate is scaled by B_t over the "
    "designated normaliser (expected_batch_size, else qN): the update is the noisy sum over the public "
    "normaliser, TF-Privacy still clipping, noising and dividing. An empty Poisson batch (probability (1-q)^N) skips the "
    "update, because the optimizer cannot take a batch of size 0. Claim: add/remove ε from "
    "tensorflow_privacy.compute_dp_sgd_privacy (RDP); microbatches of one example need no doubling of "
    "the sensitivity. Multi-task requests (UniAud++): a separate tag head on the shared encoder, one "
    "output [main | tags] and one loss per record, so each record's whole gradient (tag head included) "
    "is clipped."
)


_FAST_NOTES = (
    "tensorflow_privacy.privacy.keras_models.dp_keras_model.make_dp_model_class(tf.keras.Model) with the "
    "fast-clipping layer registry (make_default_layer_registry: Dense, Embedding; with TF-Privacy's own "
    "LayerNormalization function inserted for the layer_norm design), use_xla=False, "
    "num_microbatches=None, compiled with legacy SGD and a mean-reduced per-record loss; its train_step "
    "takes the fast path: per-record gradient norms from the Dense layers' inputs and output gradients "
    "(ghost norms), the loss reweighted by C / max(C, norm), noise N(0, (σC/B)²) on the mean of clipped rows "
    "(σC on the sum, divided by the realised batch size B). A model with a trainable layer outside the "
    "registry is refused. Sampling, empty batches and the claim as for tf-privacy-keras: Poisson batches "
    "from the input pipeline, tensorflow_privacy.compute_dp_sgd_privacy (RDP). Multi-task requests: a "
    "separate tag head, one Keras loss per record over [main | tags], so each record's whole gradient "
    "(both heads) is what its norm measures."
)


class TFPrivacyKeras(Implementation):
    """TF-Privacy's Keras DP-SGD on ``path`` (``"optimizer"``: ``_keras.DP_STEPS``; ``"fast_clipping"``:
    ``_fast_clipping.FAST_STEPS``), correct (``step="correct"``) or one of its mutations."""

    def __init__(
        self,
        info: ImplementationInfo,
        step: str = "correct",
        *,
        path: str = "optimizer",
        realised_normaliser: bool = False,
        fixed_batches: bool = False,
    ) -> None:
        if path not in PATHS:
            raise ValueError(f"unknown TF-Privacy path {path!r}; expected one of {', '.join(PATHS)}")
        self.info = info
        self.step = step
        self.path = path
        self.realised_normaliser = realised_normaliser
        self.fixed_batches = fixed_batches

    def unavailable_reason(self) -> str | None:
        """Also ``n/a`` where the installed release has no piece to build this step from (:mod:`._releases`)."""
        from dpverify_tfprivacy._releases import installed_version, missing_step

        version = installed_version()
        reason = None if version is None or self.path != "fast_clipping" else missing_step(version, self.step)
        if reason is None:
            return super().unavailable_reason()
        return f"n/a: {self.info.name} needs {reason}; installed: TF-Privacy {'.'.join(map(str, version))}"

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_tfprivacy import _keras  # first: tensorflow without its CUDA-factory noise
        from dpverify_tfprivacy import _accounting

        hp = request.hyperparameters
        # Fixed batches: the tutorial gives the accountant n = N and batch_size = B, so it states q = B/N.
        q = hp.fixed_batch_size(request.num_records) / request.num_records if self.fixed_batches else hp.sampling_rate
        sigma, claim = noise_and_claim(
            self.info.name,
            "TF-Privacy",
            hp,
            calibrate=lambda: _accounting.calibrate_noise_multiplier(hp.target_epsilon, q, hp.steps, hp.delta),
            claim=lambda sigma: _accounting.claim(sigma, q, hp.steps, hp.delta),
        )
        if self.path == "fast_clipping":
            from dpverify_tfprivacy import _fast_clipping as trainer
        else:
            trainer = _keras
        try:
            run = trainer.train_mlp(
                request, self.step, sigma, realised_normaliser=self.realised_normaliser, fixed_batches=self.fixed_batches
            )
        except (FloatingPointError, ValueError) as exc:
            raise RuntimeError(f"{self.info.name}: {exc}") from exc
        return TrainedModel(
            predict_log_proba=run.predict_log_proba,
            predict_tag_log_proba=run.predict_tag_log_proba,
            claim=claim,
            device=run.device,
        )


class TFPrivacyFTRL(Implementation):
    """TF-Privacy's DP-FTRL (``DPFTRLTreeAggregationOptimizer``, the tree restarted every epoch) and its
    accountant ``compute_rdp_tree_restart``, correct (``step="correct"``) or one of its mutations
    (:data:`dpverify_tfprivacy._ftrl.FTRL_STEPS`); the claim is always the correct run's."""

    def __init__(self, info: ImplementationInfo, step: str = "correct") -> None:
        self.info = info
        self.step = step

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_tfprivacy import _ftrl

        hp = request.hyperparameters
        period = _ftrl.epoch_steps(hp.sampling_rate)
        epochs = tuple(_ftrl.tree_epochs(hp.steps, period))
        sigma, claim = noise_and_claim(
            self.info.name,
            "TF-Privacy",
            hp,
            calibrate=lambda: _ftrl.calibrate_noise_multiplier(hp.target_epsilon, epochs, hp.delta),
            claim=lambda sigma: _ftrl.claim(sigma, steps=hp.steps, period=period, delta=hp.delta),
        )
        try:
            run = _ftrl.train_ftrl(request, self.step, sigma)
        except (FloatingPointError, ValueError) as exc:
            raise RuntimeError(f"{self.info.name}: {exc}") from exc
        return TrainedModel(predict_log_proba=run.predict_log_proba, claim=claim, device=run.device)


_FTRL_NOTES = (
    "tensorflow_privacy.DPFTRLTreeAggregationOptimizer (SGD over TreeResidualSumQuery, the efficient tree), "
    "num_microbatches=None, restart_period = P = 1/q: no sampling, one shuffle split into P batches, the same "
    "batches in the same order every epoch, so a record is in exactly one step an epoch, the tree restarted every epoch. The Keras optimizer "
    "keeps the tree's state in a Python attribute, which a traced step cannot carry across calls, so the step "
    "is traced with that state as its input and output. Normaliser: the learning rate scaled by the batch over the designated normaliser, as for "
    "tf-privacy-keras. Claim: ε from compute_rdp_tree_restart(σ, [P, ...]) (RDP, add/remove), stated as the "
    "nodes the accountant counts, SelfComposedDpEvent(SelfComposedDpEvent(GaussianDpEvent(σ), ⌊log₂P⌋ + 1), epochs) "
    "(no sampling: the event is not amplified), and the tree's "
    "noise structure (NoiseStructure.tree_aggregation(steps, restart_period=P))."
)

#: The DP-FTRL variants: (name, step, docs/bugs.md class, detectability, what breaks, how it is built).
_FTRL_VARIANTS = (
    ("tf-privacy-ftrl-no-restart", "no_restart", 16, "D3",
     "DP-FTRL's tree must restart at every epoch the accountant counts; it never restarts, so a record's "
     "epochs share one tree whose nodes hold several of its gradients.",
     "The optimizer is built without restart_period (one tree for the whole run) while the accountant "
     "counts a tree per epoch."),
    ("tf-privacy-ftrl-one-epoch-noise", "one_epoch_noise", 13, "D3",
     "The tree's node noise must be σ·C for the accountant's sensitivity over every epoch; it is scaled "
     "for one epoch's tree, σ·C/√epochs.",
     "The optimizer is given the noise multiplier σ/√epochs (the sensitivity of one epoch's tree) while the "
     "accountant counts every epoch at σ."),
)


def _ftrl_variant(name: str, step: str, bug: int, detectability: str, breaks: str, how: str) -> TFPrivacyFTRL:
    info = ImplementationInfo(
        name=name, expected="violation", breaks=breaks, bug=bug, detectability=detectability,
        notes=f"{how} The claim is the correct run's. {_FTRL_NOTES}", sampler=FTRL_SAMPLER, **_FTRL_SHARED,
    )  # fmt: skip
    return TFPrivacyFTRL(info, step)


#: What draws DP-FTRL's batches: one shuffle split into 1/q batches, the same every epoch (:func:`._ftrl.epoch_batches`).
FTRL_SAMPLER = "dpverify_tfprivacy.epoch_batches"
#: What every DP-FTRL path shares: the library, and a claim of correlated noise that no sampling amplifies (its
#: every-update audit designates epochs of several steps, config.EVERY_UPDATE_EPOCHS_SETTING).
_FTRL_SHARED = dict(
    library="tensorflow-privacy", requires=("tensorflow", "tensorflow_privacy"), extra="tf-privacy",
    correlated_noise=True, amplified=False,
)


#: What each docs/bugs.md class breaks, whichever path carries it.
_BREAKS = {
    1: "Gaussian noise N(0, σ²C²) must be added to the sum of clipped rows every step; none is.",
    2: "Each per-example gradient row must be clipped to norm C before summing; rows pass unclipped "
    "while the noise stays σ·C for the nominal C.",
    3: "The noise on the sum of clipped rows must have standard deviation σ·C; it is σ·C/B, "
    "the noise meant for the mean of B rows.",
    7: "The noisy sum must be divided by a data-independent constant (the designated normaliser); it is "
    "divided by the realised batch size, which at q = 1 is the dataset's size.",
    4: "Each record's gradient must be clipped to C; the batch-mean gradient is clipped to C as one row, so "
    "one record can move it by up to 2C against noise σ·C (a record's pull on the mean is diluted by B, "
    "so an audit sees it only where one record dominates the batch).",
}

#: The buggy variants: (name, path, step, docs/bugs.md class, detectability, how it is built).
_VARIANTS = (
    ("tf-privacy-no-noise", "optimizer", "no_noise", 1, "D1",
     "A GaussianSumQuery subclass returns the clipped sum instead of its noised result."),
    ("tf-privacy-no-clipping", "optimizer", "no_clipping", 2, "D1",
     "The GaussianSumQuery clips at a huge norm (1e30) with stddev σ·C for the nominal C."),
    ("tf-privacy-noise-for-mean", "optimizer", "noise_for_mean", 3, "D1",
     "A GenericDPSGDOptimizer subclass divides the query's stddev by the realised batch size B "
     "before TF-Privacy's own gradient computation."),
    ("tf-privacy-fast-clipping-no-noise", "fast_clipping", "no_noise", 1, "D1",
     "The DP model is built with noise_multiplier 0, so its train_step skips add_aggregate_noise, while "
     "the accountant is given the claimed σ."),
    ("tf-privacy-fast-clipping-no-clipping", "fast_clipping", "no_clipping", 2, "D1",
     "The layer registry's Dense function (TF-Privacy's own, wrapped) reports every record's squared "
     "norm as 0, so every clip weight is 1."),
    ("tf-privacy-fast-clipping-noise-for-mean", "fast_clipping", "noise_for_mean", 3, "D1",
     "A DP model subclass runs the library's train_step with its noise multiplier divided by the realised "
     "batch size B."),
    ("tf-privacy-fast-clipping-batch-clipping", "fast_clipping", "batch_clipping", 4, "D3",
     "The DP model is built with num_microbatches=1: TF-Privacy's microbatch path clips the mean loss's "
     "gradient over the one microbatch and adds noise σ·C to it."),
    ("tf-privacy-realised-batch-norm", "optimizer", "correct", 7, "D3",
     "TF-Privacy's optimizer called as its API makes easy with Poisson batches: the learning rate is not "
     "rescaled, so the noisy sum is divided by the realised batch size B_t."),
)

#: The layer designs TF-Privacy's fast clipping trains (its registry's Dense, Embedding, LayerNormalization).
#: ``conv`` is n/a: the registry has no convolution (dense, einsum_dense, embedding, layer_normalization,
#: multi_head_attention, nlp_* only), so fast clipping has no Conv norm formula to audit.
_LAYERS = ("embedding", "linear_3d", "layer_norm")

#: The variants whose fast-clipping registry function for one layer undercounts its records' norms
#: (docs/bugs.md class 2 for that layer, D2): (name, step, layer, how it is built). Only their layer design audits them.
_LAYER_VARIANTS = (
    ("tf-privacy-fast-clipping-embedding-norm", "embedding_norm", "embedding",
     "The registry's Embedding function (TF-Privacy's own) takes its norm with embedding_sqr_norm_fn given each "
     "position's id as a token of its own, so a token repeated within a record is not grouped: √(Σ_t |g_t|²); "
     "the embedding design's 16 equal positions make the sensitivity 4C."),
    ("tf-privacy-fast-clipping-linear-bias-norm", "linear_bias_norm", "linear_3d",
     "The registry's Dense function (TF-Privacy's own) takes the bias norm on a 3-D input by its 2-D formula, "
     "Σ_t |g_t|² (Opacus #751's bug), the kernel's by the library's einsum formula: sensitivity 2.8C in the "
     "linear_3d design."),
    ("tf-privacy-fast-clipping-layer-norm-norm", "layer_norm_norm", "layer_norm",
     "The registry's LayerNormalization function (TF-Privacy's own) averages the per-record gradient over the "
     "positions: its squared norm divided by T², sensitivity 4C in the layer_norm design."),
)


def _variant(name: str, path: str, step: str, bug: int, detectability: str, how: str) -> TFPrivacyKeras:
    info = ImplementationInfo(
        name=name,
        expected="violation",
        breaks=_BREAKS[bug],
        bug=bug,
        detectability=detectability,
        notes=f"{how} The claim is the correct run's. " + (_NOTES if path == "optimizer" else _FAST_NOTES),
        **_LIBRARY,
    )
    # Row 7 is the correct step without the rescale to the public normaliser (see _NOTES).
    return TFPrivacyKeras(info, step, path=path, realised_normaliser=bug == 7)


def _layer_variant(name: str, step: str, layer: str, how: str) -> TFPrivacyKeras:
    info = ImplementationInfo(
        name=name,
        expected="violation",
        breaks="each record's gradient must be clipped by its whole norm; here fast clipping's norm formula for "
        "one layer type states too little, so its records are clipped too weakly",
        bug=2,
        detectability="D2",
        notes=f"{how} The claim is the correct run's. " + _FAST_NOTES,
        layers=(layer,),
        **_LIBRARY,
    )
    return TFPrivacyKeras(info, step, path="fast_clipping")


_FIXED_BATCH_NOTES = (
    "TF-Privacy's tutorial pipeline (classification_privacy): the dataset shuffled with a buffer of all N "
    "records and cut into fixed-size batches, dataset.shuffle(N).batch(B) with B = round(qN) (the designated "
    "expected_batch_size when given), reshuffled every epoch, the last batch of an epoch N mod B records short "
    "(drop_remainder=False); exactly the request's steps are taken, epoch after epoch. The step is the "
    "unmodified DPKerasSGDOptimizer (num_microbatches=None, per-example losses, the request's σ and learning "
    "rate), which divides each noisy sum by its batch's size: B, and the short batch's own size. Claim: "
    "tensorflow_privacy.compute_dp_sgd_privacy with n = N and batch_size = B, i.e. Poisson sampling at "
    "q = B/N for the run's steps (RDP, add/remove), which its documentation says it assumes although "
    "Poisson sampling 'is rarely used in practice'. Shuffled fixed batches are not that mechanism: a "
    "record sits in exactly one batch an epoch, beside B - 1 others, and an adversary who sees every "
    "update can tell a batch holding it from one without. The batches are drawn with numpy (a uniform "
    "order per epoch, what a full shuffle buffer draws) so that the seed alone decides them."
)

#: What draws both correct paths' batches (:attr:`dpverify.contract.ImplementationInfo.sampler`): the input
#: pipeline's Poisson sampling (:func:`._sampling.poisson_batches`).
POISSON_SAMPLER = "dpverify_tfprivacy.poisson_batches"

_FIXED_BATCH_ISSUE = (
    "https://github.com/tensorflow/privacy/blob/master/tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_lib.py"
)


def _fast_clipping_info() -> ImplementationInfo:
    """``tf-privacy-fast-clipping``, expected private; on the releases whose Dense norm undercounts a sequence's
    bias (:data:`._releases.DENSE_BIAS_3D`, 0.8.12) a known issue of its linear_3d design alone, the one design
    that finds it, so that its other audits still count and fail on a new bug."""
    from dpverify_tfprivacy._releases import DENSE_BIAS_3D, installed_version

    finding = DENSE_BIAS_3D.at(installed_version())
    layer_issues = () if finding is None else (("linear_3d", finding.issue),)
    notes = _FAST_NOTES if finding is None else f"{_FAST_NOTES} Installed release: {finding.summary}."
    return ImplementationInfo(
        name="tf-privacy-fast-clipping", notes=notes, layers=_LAYERS, layer_issues=layer_issues, sampler=POISSON_SAMPLER, **_LIBRARY
    )


def implementations() -> list[Implementation]:
    """The entry point ``dpverify_tfprivacy:implementations``; imports no tensorflow."""
    return [
        TFPrivacyKeras(ImplementationInfo(name="tf-privacy-keras", notes=_NOTES, sampler=POISSON_SAMPLER, **_LIBRARY), "correct"),
        TFPrivacyKeras(_fast_clipping_info(), "correct", path="fast_clipping"),
    ] + [_variant(*row) for row in _VARIANTS] + [_layer_variant(*row) for row in _LAYER_VARIANTS] + [
        TFPrivacyKeras(
            ImplementationInfo(
                name="tf-privacy-keras-fixed-batches",
                expected="known-issue",
                bug=9,  # shuffled fixed-size batches accounted as Poisson sampling
                issue=_FIXED_BATCH_ISSUE,
                notes=_FIXED_BATCH_NOTES,
                designated_normaliser=False,
                **_LIBRARY,
            ),
            "correct",
            fixed_batches=True,
        ),
        TFPrivacyFTRL(ImplementationInfo(name="tf-privacy-ftrl", notes=_FTRL_NOTES, sampler=FTRL_SAMPLER, **_FTRL_SHARED)),
    ] + [_ftrl_variant(*row) for row in _FTRL_VARIANTS]
