"""The contract between the auditor and a DP training implementation under audit.

The auditor designates the task in a :class:`Request` (hyperparameters, seed, device) whose payload is the
task's: a :class:`TrainingRequest` (canaries for an MLP classifier, optionally with UniAud++ tags) or a
:class:`SequenceRequest` (token sequences for a causal transformer). The implementation trains with its own
DP code and hands back a black box and its own :class:`PrivacyClaim`: a :class:`TrainedModel` (features to
per-class log-probabilities) or a :class:`SequenceModel` (sequences to next-token log-probabilities).
Nothing else crosses back, and the auditor's secret membership bits never cross at all. This module is
framework-free: it imports numpy only.
"""

from __future__ import annotations

import abc
import copy
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Literal, Mapping

import numpy as np

from dpverify._validation import check_choice, check_int, check_real

Relation = Literal["add_remove", "replace_one", "zero_out"]
Expected = Literal["private", "violation", "known-issue"]
EXPECTATIONS: tuple[str, ...] = ("private", "violation", "known-issue")
Detectability = Literal["D1", "D2", "D3", "D4"]
Task = Literal["classification", "language"]

#: Neighbouring relations a claim can be stated in: add/remove one record, replace one record by another,
#: and zero-out (replace one record by a null record whose clipped gradient is 0: dp_accounting's
#: ``REPLACE_SPECIAL``, which JAX-Privacy uses when ``num_examples`` is set).
RELATIONS: tuple[str, ...] = ("add_remove", "replace_one", "zero_out")
DETECTABILITY_CLASSES: tuple[str, ...] = ("D1", "D2", "D3", "D4")
#: The numbers of the bug classes in the project's catalogue, ``docs/bugs.md`` (class n at anchor ``bug-n``).
BUG_CLASSES: tuple[int, ...] = tuple(range(1, 17))
#: Where a bug class is described, relative to the project's root: ``BUG_CATALOGUE.format(bug=9)``.
BUG_CATALOGUE = "docs/bugs.md#bug-{bug}"
TASKS: tuple[str, ...] = ("classification", "language")
TransformerInit = Literal["random", "dirac"]
TRANSFORMER_INITS: tuple[str, ...] = ("random", "dirac")

#: ``progress(step, steps)``: a trainer's report that DP step ``step`` of ``steps`` is done.
StepProgress = Callable[[int, int], None]
#: ``observe_update(step, parameters)``: a trainer's hand-over of the model's parameters after DP step
#: ``step`` (0: the initial parameters, before the first step); see :attr:`Request.observe_update`.
UpdateObserver = Callable[[int, "tuple[np.ndarray, ...]"], None]


@dataclass(frozen=True, kw_only=True)
class MLPArchitecture:
    """The designated model: ``d -> hidden_width -> C`` with one ReLU, randomly initialised by the trainer;
    or, with ``hidden_width=0``, softmax regression: one affine layer ``d -> C`` whose weights and bias
    start at zero.

    A wide two-layer ReLU network can memorise any labelling of m points (Zhang et al. 2017), which is
    what lets uncorrelated canaries separate members from non-members, and it is the model to audit
    when the code under test trains hidden layers. Softmax regression with Dirac canaries (each canary
    owns one input coordinate) is the sharp audit of DP-SGD itself: a canary moves only its own column
    of weights, so canaries do not interfere, and starting at zero leaves the noise of the mechanism
    as the only noise on a canary's score.
    """

    hidden_width: int = 1000

    def __post_init__(self) -> None:
        check_int("hidden_width", self.hidden_width, low=0)

    @property
    def is_softmax_regression(self) -> bool:
        return self.hidden_width == 0


@dataclass(frozen=True, kw_only=True)
class TransformerArchitecture:
    """The designated model: a causal transformer of ``layers`` pre-norm blocks, ``width``-dimensional
    token and position embeddings, ``heads`` attention heads and an LM head, randomly initialised.

    ``init="dirac"`` starts the token embedding and the LM head (weights and bias) at zero, the rest as
    ``"random"``: the hidden state then depends on the positions only, and with a zero head no gradient
    reaches upstream at the first step, so a sequence's gradient lies on the head rows of its own targets
    (what Dirac token canaries, :mod:`dpverify.canaries.tokens`, need)."""

    layers: int = 1
    width: int = 64
    heads: int = 4
    max_sequence_length: int = 32
    init: TransformerInit = "random"

    def __post_init__(self) -> None:
        check_int("layers", self.layers, low=1)
        check_int("width", self.width, low=1)
        check_int("heads", self.heads, low=1)
        check_int("max_sequence_length", self.max_sequence_length, low=2)
        check_choice("init", self.init, TRANSFORMER_INITS)
        if self.width % self.heads:
            raise ValueError(f"width must be a multiple of heads, got width={self.width}, heads={self.heads}")


Layer = Literal["embedding", "linear_3d", "layer_norm", "conv"]
#: The layer types a :class:`LayerArchitecture` designates, each a per-layer norm formula of fast clipping.
LAYERS: tuple[str, ...] = ("embedding", "linear_3d", "layer_norm", "conv")
#: The width of the ``conv`` design's kernel (a convolution's common 3): a record's input sequence is
#: ``positions + CONV_KERNEL_SIZE - 1`` long, so that the convolution has ``positions`` outputs.
CONV_KERNEL_SIZE = 3
#: How many times √(T/2) the ``heavy`` regime's one weighted position is (:data:`POSITION_REGIMES`): its record's
#: gradient norm, and its one position's, is 4 times the others' (11.3 at T = 16), so that a formula whose error grows
#: with the norm (a root too many states √11.3 = 3.4 times too little there) shows.
HEAVY_SCALE = 4.0
#: A layer design's position regimes (:func:`position_weights`): name, its length as a function of the design's T
#: positions, its weight at position t of its length, and its row's sum in units of √(T/2). ``small``: T positions
#: of 1/√(2T), each position's output gradient of norm near 1/√(2T), well below 1 (a formula that squares its dot
#: products, Opacus 1.5.0–1.5.3's Linear bias, states 5.4 times too little here; one that takes the positions as
#: rows, TF-Privacy 0.8.12's Dense bias, 3.9 times); ``heavy``: a sequence of T/2 + 1 positions whose last one alone
#: is weighted, by ``HEAVY_SCALE``·√(T/2), so that one position's gradient is well above 1 (a root too many, the dot
#: products' roots, each position's product with itself dropped, or T times the first position state too little
#: here); ``ramp``: T unequal positions, 1, 2, …, T (T times the first position states 8.5 times too little here,
#: the squared dot products 4.2 times). ``small`` is there twice, so that half the records are in it, where the
#: formula bugs the libraries shipped show. The ``small`` and ``ramp`` rows sum to √(T/2), so that a clipped step
#: moves their canaries' logits as much; the ``heavy`` row's 4 times more moves its canaries' logits (signal and
#: noise) 4 times more, which the audit's ranking of a run's scores favours: its last position, not its first,
#: carries the weight, so that a formula that overcounts it (T times the first position) does not silence the
#: ranking's ends (benchmarks/results/layer-formulas.md: every formula of the family refuted).
POSITION_REGIMES: tuple[tuple[str, Callable[[int], int], Callable[[int, int], float], float], ...] = (
    ("small", lambda positions: positions, lambda t, length: 1.0, 1.0),
    ("heavy", lambda positions: positions // 2 + 1, lambda t, length: float(t == length - 1), HEAVY_SCALE),
    ("ramp", lambda positions: positions, lambda t, length: t + 1.0, 1.0),
    ("small", lambda positions: positions, lambda t, length: 1.0, 1.0),
)


def position_weights(positions: int) -> np.ndarray:
    """The (R, ``positions``) float32 weights of a layer design's position regimes (:data:`POSITION_REGIMES`):
    row r weighs each position's outputs in the logits of a record in regime r, zero past the regime's length
    (a shorter sequence, its padding masked out of the pooling), and sums to its scale times √(T/2). A record's
    regime is its largest feature's index modulo R (:func:`position_regime`)."""
    check_int("positions", positions, low=1)
    weights = np.zeros((len(POSITION_REGIMES), positions), dtype=np.float64)
    scales = np.array([scale for *_, scale in POSITION_REGIMES])
    for row, (_, length_of, weight, _) in zip(weights, POSITION_REGIMES):
        length = length_of(positions)
        row[:length] = [weight(t, length) for t in range(length)]
    return (weights * (scales[:, None] * math.sqrt(positions / 2) / weights.sum(axis=1, keepdims=True))).astype(np.float32)


def position_regime(features: np.ndarray) -> np.ndarray:
    """Each record's position regime (a row of :func:`position_weights`): its largest feature's index modulo R,
    as the models compute it (with owned labels, its label modulo R when d ≥ R; a Dirac token's index modulo R)."""
    return np.argmax(features, axis=-1) % len(POSITION_REGIMES)


@dataclass(frozen=True, kw_only=True)
class LayerArchitecture:
    """The designated model of a layer design: one ``layer`` that the libraries' fast (ghost) clipping
    computes per-record norms for by a formula of its own, on a sequence, zero-initialised.

    A record x (a row of d features) is lifted to a sequence of ``positions`` equal positions, the layer
    maps each position to C outputs, and the logits are the outputs weighted by the record's position regime
    and summed over the positions (:func:`position_weights`: a weighted pooling, zero weights masking the
    positions past the regime's length), so that the records' per-position output gradients span the regimes
    a norm formula meets: norms well below 1 and well above 1, unequal positions, two sequence lengths (T and T/2 + 1):

    - ``embedding``: the position's token is x's largest coordinate (Dirac features: canary j is token j);
      ``Embedding(d, C)``. Canary j alone moves row j, by its regime's pooled weights times one position's gradient.
    - ``linear_3d``: ``Linear(d, C)`` with bias on the (n, positions, d) sequence. With owned labels
      (:mod:`dpverify.canaries.synthetic`, mode ``owned_labels``) canary j alone moves its label's row of
      the weight and its coordinate of the bias, whose gradient sums over the positions (Opacus #751).
    - ``layer_norm``: ``LayerNorm(d)`` with its affine weight and bias on the (n, positions, d) sequence, d = C
      (its outputs are the logits). With owned labels whose feature sits on the label's coordinate, canary j
      alone moves its label's coordinates of the weight and the bias.
    - ``conv``: ``Conv1d(d, C, CONV_KERNEL_SIZE)`` with bias, no padding, on the (n, d, positions + kernel - 1)
      sequence, so that it has ``positions`` outputs. With owned labels, as ``linear_3d``, canary j alone moves
      its label's row of the weight (every kernel offset) and its coordinate of the bias, each a sum over the
      output positions.

    Zero weights make every gradient first order from the first step. A norm formula that takes a record's
    positions as separate rows (squared norms summed, not the gradient summed first) states |Σ_t c_t| / √(Σ_t
    c_t²) times too little (√length for equal weights c_t), so the record is clipped that much too weakly: a
    noise deficit the audit's curve test sees."""

    layer: Layer = "embedding"
    positions: int = 16

    def __post_init__(self) -> None:
        check_choice("layer", self.layer, LAYERS)
        check_int("positions", self.positions, low=1)

    @property
    def is_softmax_regression(self) -> bool:
        """A layer design is not the softmax regression of :class:`MLPArchitecture` (its model differs)."""
        return False


@dataclass(frozen=True, kw_only=True)
class DPHyperparameters:
    """DP-SGD hyperparameters as the auditor designates them.

    Exactly one of ``noise_multiplier`` (σ; 0 means non-private training) and ``target_epsilon`` (the
    implementation calibrates σ with its own accountant) is given. Training takes
    ``epochs * round(1 / sampling_rate)`` Poisson-sampled steps, see :attr:`steps`.

    ``expected_batch_size`` is the public constant the noisy sum is divided by. DP-SGD's add/remove
    guarantee needs it independent of the private dataset: a normaliser q·N reveals N, the size of the
    dataset (Opacus #571). ``None`` lets the implementation use q·N, which is harmless where the auditor
    fixes N (a one-run audit's canaries); an audit that compares datasets of different sizes designates
    it, the same number in both, see :meth:`normaliser`.
    """

    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    sampling_rate: float = 0.1
    epochs: int = 20
    learning_rate: float = 0.5
    delta: float = 1e-5
    expected_batch_size: float | None = None

    def __post_init__(self) -> None:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(
                "give exactly one of noise_multiplier and target_epsilon, got "
                f"noise_multiplier={self.noise_multiplier!r}, target_epsilon={self.target_epsilon!r}"
            )
        if self.noise_multiplier is not None:
            check_real("noise_multiplier", self.noise_multiplier, low=0.0)
        if self.target_epsilon is not None:
            check_real("target_epsilon", self.target_epsilon, low=0.0, low_open=True)
        check_real("max_grad_norm", self.max_grad_norm, low=0.0, low_open=True)
        check_real("sampling_rate", self.sampling_rate, low=0.0, high=1.0, low_open=True)
        check_int("epochs", self.epochs, low=1)
        check_real("learning_rate", self.learning_rate, low=0.0, low_open=True)
        check_real("delta", self.delta, low=0.0, high=1.0, low_open=True, high_open=True)
        if self.expected_batch_size is not None:
            check_real("expected_batch_size", self.expected_batch_size, low=0.0, low_open=True)

    def normaliser(self, num_records: int) -> float:
        """What the noisy sum of a step is divided by: the designated :attr:`expected_batch_size`, else
        q·``num_records``."""
        if self.expected_batch_size is not None:
            return self.expected_batch_size
        return self.sampling_rate * num_records

    def fixed_batch_size(self, num_records: int) -> int:
        """The batch size B of an API that takes fixed-size batches of a shuffled dataset and divides by B
        (it takes no other normaliser): the designated :attr:`expected_batch_size`, which must then be a
        whole number, else round(q·``num_records``), at least 1."""
        normaliser = self.normaliser(num_records)
        batch_size = max(1, round(normaliser))
        if self.expected_batch_size is not None and batch_size != normaliser:
            raise ValueError(
                f"a fixed-batch API divides by its whole batch size; expected_batch_size must be a whole number "
                f">= 1, got {self.expected_batch_size:g}"
            )
        return batch_size

    @property
    def steps_per_epoch(self) -> int:
        return max(1, round(1.0 / self.sampling_rate))

    @property
    def steps(self) -> int:
        """Number of DP-SGD steps every implementation must take (and account for)."""
        return self.epochs * self.steps_per_epoch


@dataclass(frozen=True, kw_only=True, eq=False)
class Request:
    """What every request carries, whatever the task: the DP hyperparameters, the trainer's seed and the
    device to train on. The task's payload (canaries and an MLP, token sequences and a transformer) is a
    subclass: :class:`TrainingRequest` or :class:`SequenceRequest`.

    ``progress``, when given, is called as ``progress(step, steps)`` after each DP step (step counts from
    1 to ``steps``), so that a person watching a minutes-long audit sees it move. It must be cheap (the
    auditor's callback only redraws a line), it cannot change training, and an implementation may ignore
    it: nothing in the audit depends on it being called.

    ``observe_update``, when given, is the adversary of a DP-SGD claim that sees *every* released update,
    not only the final model (the accountant's ε composes all T releases and bounds exactly that
    adversary). The trainer calls ``observe_update(0, parameters)`` before its first step and
    ``observe_update(t, parameters)`` after step t, with the designated model's parameters as float arrays
    (copies) in the designated order: layer by layer from input to output, each layer's weight as
    (outputs, inputs) then its bias (outputs,) — torch's ``nn.Linear`` layout; a Keras kernel is
    transposed. An every-update audit reads the released updates as differences of consecutive
    parameters; a trainer that never calls it is audited on its final model only, and its every-update
    audits say that they did not run (never a pass)."""

    hyperparameters: DPHyperparameters
    seed: int = 0
    device: str = "cpu"
    progress: StepProgress | None = None
    observe_update: UpdateObserver | None = None

    def __post_init__(self) -> None:
        check_int("seed", self.seed, low=0)
        check_choice("device", self.device, ("cpu", "cuda"))


def hand_over_kernels(request: Request, step: int, weights: Callable[[], Iterable[np.ndarray]]) -> None:
    """Hand the parameters after DP step ``step`` (0: before the first) of a model kept in the kernel layout
    of Keras and JAX (each layer's kernel (inputs, outputs), then its bias) to the request's
    :attr:`~Request.observe_update`, if it has one: ``weights()`` is read only then, and each kernel is
    transposed to the designated (outputs, inputs); copies, as float arrays."""
    if request.observe_update is not None:
        request.observe_update(step, tuple(np.array(np.asarray(w).T, copy=True) for w in weights()))


@dataclass(frozen=True, kw_only=True, eq=False)
class TrainingRequest(Request):
    """A classification request: canaries, the number of classes and the designated MLP (or softmax
    regression, see :class:`MLPArchitecture`).

    A multi-task request (UniAud++, paper section 5) also carries ``tags`` ((n, H) int64 in
    [0, ``num_tags``), −1 where a record carries no tag) for a separate tag head of ``num_tags`` classes on
    the shared encoder; each record's loss is CE(main, y) + ``tag_weight`` · mean over its tags of
    CE(tag head, e_h) (the tag term is 0 for untagged records). ``num_tags`` is 0 exactly when ``tags`` is
    ``None``.
    """

    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    architecture: MLPArchitecture | LayerArchitecture = field(default_factory=MLPArchitecture)
    tags: np.ndarray | None = None
    num_tags: int = 0
    tag_weight: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_classes", self.num_classes, low=2)
        if self.features.ndim != 2 or self.features.dtype != np.float32:
            raise ValueError(
                f"features must be a 2-D float32 array, got shape {self.features.shape} dtype {self.features.dtype}"
            )
        if self.labels.shape != (self.features.shape[0],) or self.labels.dtype != np.int64:
            raise ValueError(
                f"labels must be an int64 array of shape ({self.features.shape[0]},), "
                f"got shape {self.labels.shape} dtype {self.labels.dtype}"
            )
        if self.features.shape[0] and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes - 1}]")
        self._check_tags()

    def _check_tags(self) -> None:
        check_int("num_tags", self.num_tags, low=0)
        check_real("tag_weight", self.tag_weight, low=0.0, low_open=True)
        if self.tags is None:
            if self.num_tags:
                raise ValueError(f"num_tags must be 0 when no tags are given, got {self.num_tags}")
            return
        if self.num_tags < 2:
            raise ValueError(f"num_tags must be >= 2 when tags are given, got {self.num_tags}")
        if self.architecture.is_softmax_regression:
            raise ValueError(
                "tags need the shared encoder of an MLP (UniAud++'s tag head sits on its hidden layer), "
                "got hidden_width=0 (softmax regression); set hidden_width >= 1"
            )
        n = self.features.shape[0]
        if self.tags.ndim != 2 or self.tags.shape[0] != n or self.tags.shape[1] < 1 or self.tags.dtype != np.int64:
            raise ValueError(
                f"tags must be an int64 array of shape ({n}, H) with H >= 1, got shape {self.tags.shape} "
                f"dtype {self.tags.dtype}"
            )
        if self.tags.size and (self.tags.min() < -1 or self.tags.max() >= self.num_tags):
            raise ValueError(f"tags must lie in [0, {self.num_tags - 1}] or be -1 (no tag)")

    @property
    def num_records(self) -> int:
        return int(self.features.shape[0])

    @property
    def dimension(self) -> int:
        return int(self.features.shape[1])


@dataclass(frozen=True, kw_only=True, eq=False)
class SequenceRequest(Request):
    """A language-model request: token sequences, their loss mask and the designated transformer.

    ``sequences`` (n, T) int64 token ids in [0, vocab_size); ``loss_mask`` (n, T) bool marks the *target*
    positions t whose token x_t, predicted from x_<t, counts in the loss (the suffix only; position 0 has
    no context and never counts). ``vocab_size`` is the base vocabulary plus the new tokens.
    """

    sequences: np.ndarray
    loss_mask: np.ndarray
    vocab_size: int
    architecture: TransformerArchitecture = field(default_factory=TransformerArchitecture)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("vocab_size", self.vocab_size, low=2)
        if self.sequences.ndim != 2 or self.sequences.dtype != np.int64:
            raise ValueError(
                f"sequences must be a 2-D int64 array, got shape {self.sequences.shape} dtype {self.sequences.dtype}"
            )
        n, length = self.sequences.shape
        if not 2 <= length <= self.architecture.max_sequence_length:
            raise ValueError(
                f"sequence length must be in [2, {self.architecture.max_sequence_length}] "
                f"(architecture.max_sequence_length), got {length}"
            )
        if n and (self.sequences.min() < 0 or self.sequences.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size - 1}]")
        if self.loss_mask.shape != self.sequences.shape or self.loss_mask.dtype != np.bool_:
            raise ValueError(
                f"loss_mask must be a bool array of shape {self.sequences.shape}, "
                f"got shape {self.loss_mask.shape} dtype {self.loss_mask.dtype}"
            )
        if n and self.loss_mask[:, 0].any():
            raise ValueError("loss_mask must be False at position 0: the first token has no context to predict it")
        if n and not self.loss_mask.any(axis=1).all():
            raise ValueError("loss_mask must mark at least one target position in every sequence")

    @property
    def num_records(self) -> int:
        return int(self.sequences.shape[0])


@dataclass(frozen=True, kw_only=True)
class PrivacyClaim:
    """The ε an implementation states for the run it performed, from its own accountant, and the mechanism
    the run was: either DP-SGD's numbers or a dp_accounting event, never both.

    ``noise_multiplier``, ``sampling_rate`` and ``steps`` are the numbers a DP-SGD accountant was given
    (Poisson-sampled Gaussian, independent noise each step), so the auditor can derive the same run's ε
    in another neighbouring relation. ``dp_event`` states the run as a ``dp_accounting`` ``DpEvent`` instead,
    as JAX-Privacy's plans and accountants produce it (``SelfComposedDpEvent(PoissonSampledDpEvent(q,
    GaussianDpEvent(σ)), steps)`` for DP-SGD); the audit then takes its privacy curve from dp_accounting's
    PLD accountant in ``relation`` (:mod:`dpverify.stats.events`). :attr:`event` is the claim's mechanism as an
    event either way. ``relation`` is the neighbouring relation ε is stated for (:data:`RELATIONS`).
    ``other_epsilons`` holds further claims of the same run from other accountants (e.g.
    ``{"opacus.prv": 1.93}``).

    A mechanism with correlated noise states its event and, in ``noise_structure``, how its noise is
    correlated across the steps: a :class:`~dpverify.stats.correlated.NoiseStructure` C whose inverse
    correlates the released updates' noise, y = G + τC⁻¹Z. Its event is the Gaussian mechanism of the
    whitened updates Cy (sensitivity Δ = ‖C·1‖, a record in every step of a full batch), e.g.
    ``GaussianDpEvent(σ)`` with τ = σΔ; or BandMF's amplified event, ⌈T/b⌉ Poisson-sampled Gaussians for
    cyclic participation every b steps (b the strategy's bands); the every-update audit decorrelates the
    updates by the stated C (:func:`~dpverify.stats.events.correlated_release`) and tests the event's curve.
    """

    epsilon: float
    delta: float
    accountant: str
    noise_multiplier: float | None = None
    sampling_rate: float | None = None
    steps: int | None = None
    relation: Relation = "add_remove"
    dp_event: object | None = None
    noise_structure: object | None = None
    other_epsilons: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_real("epsilon", self.epsilon, low=0.0, allow_inf=True)
        check_real("delta", self.delta, low=0.0, high=1.0, low_open=True, high_open=True)
        check_choice("relation", self.relation, RELATIONS)
        numbers = {"noise_multiplier": self.noise_multiplier, "sampling_rate": self.sampling_rate, "steps": self.steps}
        given = [name for name, value in numbers.items() if value is not None]
        if self.noise_structure is not None:
            self._check_noise_structure()
        if self.dp_event is not None:
            if given:
                raise ValueError(
                    f"state the run either as dp_event or as noise_multiplier, sampling_rate and steps, not both; "
                    f"got dp_event and {', '.join(given)}"
                )
            from dpverify.stats.events import check_dp_event

            check_dp_event(self.dp_event)
            return
        if len(given) != 3:
            missing = ", ".join(name for name in numbers if name not in given)
            raise ValueError(f"a claim states its run: give noise_multiplier, sampling_rate and steps, or dp_event; missing {missing}")
        check_real("noise_multiplier", self.noise_multiplier, low=0.0)
        check_real("sampling_rate", self.sampling_rate, low=0.0, high=1.0, low_open=True)
        check_int("steps", self.steps, low=1)

    def _check_noise_structure(self) -> None:
        from dpverify.stats.correlated import NoiseStructure

        if not isinstance(self.noise_structure, NoiseStructure):
            raise ValueError(
                "noise_structure must be a dpverify.stats.correlated.NoiseStructure (e.g. "
                f"NoiseStructure.banded_toeplitz(coefficients, steps=T)), got {type(self.noise_structure).__name__}"
            )
        if self.dp_event is None:
            raise ValueError(
                "a claim with a noise_structure states its mechanism as dp_event (e.g. GaussianDpEvent(sigma), "
                "the Gaussian mechanism of the decorrelated updates), not as DP-SGD's noise_multiplier, "
                "sampling_rate and steps"
            )

    @property
    def is_private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def event(self) -> object:
        """The run as a dp_accounting ``DpEvent``: :attr:`dp_event`, or DP-SGD's event built from
        (σ, q, steps) (imports dp_accounting)."""
        if self.dp_event is not None:
            return self.dp_event
        import dp_accounting

        step = dp_accounting.PoissonSampledDpEvent(self.sampling_rate, dp_accounting.GaussianDpEvent(self.noise_multiplier))
        return dp_accounting.SelfComposedDpEvent(step, self.steps)

    @property
    def mechanism(self) -> str:
        """The run in words, for reports."""
        if self.noise_structure is not None:
            return f"the dp_accounting event {self.dp_event!r} with noise correlated over {self.noise_structure.steps} steps"
        if self.dp_event is not None:
            return f"the dp_accounting event {self.dp_event!r}"
        return f"σ = {self.noise_multiplier:.4g}, q = {self.sampling_rate:g}, {self.steps} steps"


@dataclass(frozen=True, kw_only=True, eq=False)
class TrainedModel:
    """What comes back: a black box and the claim. ``device`` is where training actually ran.

    ``predict_tag_log_proba`` is the tag head's black box ((n, num_tags) float64 log-probabilities) of a
    multi-task request, ``None`` otherwise."""

    predict_log_proba: Callable[[np.ndarray], np.ndarray]
    claim: PrivacyClaim
    device: str
    predict_tag_log_proba: Callable[[np.ndarray], np.ndarray] | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class SequenceModel:
    """What a language-model trainer returns: the black box and its claim.

    ``token_log_probs`` maps (n, T) int64 sequences to (n, T − 1) float64 log p(x_{t+1} | x_≤t).
    ``device`` is where training actually ran."""

    token_log_probs: Callable[[np.ndarray], np.ndarray]
    claim: PrivacyClaim
    device: str


def noise_and_claim(
    name: str,
    library: str,
    hyperparameters: DPHyperparameters,
    *,
    calibrate: Callable[[], float],
    claim: Callable[[float], PrivacyClaim],
) -> tuple[float, PrivacyClaim]:
    """What a trainer that leaves accounting to its library does first: σ (the request's, or
    ``calibrate()``, the library's σ for the request's target ε) and the library's ``claim(σ)``. The accountant's failure
    is a ``RuntimeError`` naming the implementation and the library, before any training."""
    try:
        if hyperparameters.noise_multiplier is not None:
            sigma = float(hyperparameters.noise_multiplier)
        else:
            sigma = calibrate()
        return sigma, claim(sigma)
    except Exception as exc:
        raise RuntimeError(f"{name}: {library}'s accountant could not state a claim: {exc}") from exc


def install_hint(extra: str | None, missing: tuple[str, ...]) -> str:
    """How to get what an implementation of ``extra`` is ``missing``: the environment that has it, when this
    repository makes one, and the package extra to install."""
    pip = f"pip install 'dpverify[{extra}]'" if extra else f"install {', '.join(missing)}"
    from dpverify.releases import environment_for

    environment = environment_for(extra)
    if environment is None:
        return pip
    return f"run `{environment}/bin/pytest --dp-audit` (made by `bash scripts/setup.sh`), or {pip}"


@dataclass(frozen=True, kw_only=True)
class ImplementationInfo:
    """Who an implementation is and what to expect of it.

    ``requires`` lists importable modules; when one is missing the implementation is skipped with a
    reason naming ``extra`` (``pip install dpverify[<extra>]``). A buggy variant sets
    ``expected="violation"``, the rule of the DP-SGD step it ``breaks``, the number of its ``bug`` class in
    the catalogue ``docs/bugs.md`` (:data:`BUG_CLASSES`, :attr:`bug_reference`) and its expected
    ``detectability`` class (D1–D4, defined in that catalogue's legend). An unmodified library whose audit
    found a real, reported leak sets ``expected="known-issue"`` and the upstream report's address in
    ``issue`` (and its ``bug`` class where it is one): its violation is a finding, reported with its
    evidence, never hidden. ``task`` says what it trains: ``classification`` (a :class:`TrainingRequest` for the
    MLP) or ``language`` (token sequences for a small causal transformer). ``microbatches`` says the
    implementation can group records into microbatches (TF-Privacy's ``num_microbatches``), so the default
    gate also runs the two-world microbatch world on it. ``designated_normaliser`` says it can divide by
    the public normaliser the auditor designates (:attr:`DPHyperparameters.expected_batch_size`) on datasets
    of any size; an API whose batch size is both its normaliser and, over the dataset's size, its sampling
    rate (JAX-Privacy's Keras API) cannot, so the two-world worlds, which designate one normaliser for two
    datasets of different sizes, do not apply to it. ``layers`` names the layer designs
    (:data:`LAYERS`, a :class:`LayerArchitecture` each) it trains, so that the default gate audits them too;
    a buggy variant with ``layers`` breaks those layers' norm formula, and only their designs audit it.
    ``layer_issues`` names, as (layer, upstream address) pairs, the known issues of an implementation expected
    private that only one of its layer designs finds (a release's norm formula wrong for that layer type):
    that design's audit is judged and reported as the known issue (:meth:`for_layer`), and every other audit
    of it stays expected private, counted, so that a new bug there still fails.
    ``sampler`` names the code that draws its batches (``"opacus.DPDataLoader"``): the fixed-batch world
    asks only whether that code samples as the claim's accountant assumes, so the default gate runs it on
    the first implementation of each named sampler in a session and not again on the others.
    ``correlated_noise`` says its claim states a noise structure (:attr:`PrivacyClaim.noise_structure`): the
    default gate's every-update audit then designates the full batch, where its score reads that structure exactly.
    ``amplified`` false says it samples nothing and its claim takes no amplification from sampling: each
    epoch passes over the data once in 1/q batches of a fixed order (DP-FTRL), a record in one step of each.
    Its every-update audit then designates epochs of several steps
    (:data:`~dpverify.config.EVERY_UPDATE_EPOCHS_SETTING`), and the worlds that ask whether a sampler samples as
    a Poisson claim assumes (the fixed-batch world, which needs ``amplified``) do not apply: there is no
    sampling to misaccount.
    """

    name: str
    library: str
    requires: tuple[str, ...] = ()
    extra: str | None = None
    task: Task = "classification"
    expected: Expected = "private"
    breaks: str | None = None
    bug: int | None = None
    detectability: Detectability | None = None
    issue: str | None = None
    notes: str = ""
    microbatches: bool = False
    designated_normaliser: bool = True
    layers: tuple[str, ...] = ()
    layer_issues: tuple[tuple[str, str], ...] = ()
    sampler: str | None = None
    correlated_noise: bool = False
    amplified: bool = True

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"name must be non-empty letters, digits, '-', '_' or '.', got {self.name!r}")
        check_choice("task", self.task, TASKS)
        check_choice("expected", self.expected, EXPECTATIONS)
        if (self.expected == "known-issue") != bool(self.issue):
            raise ValueError(f"{self.name!r}: expected='known-issue' goes with the upstream report's address in issue, got issue={self.issue!r}")
        if self.expected == "violation":
            if not self.breaks or self.detectability is None:
                raise ValueError(f"buggy variant {self.name!r} must state the rule it breaks and its detectability")
        if self.detectability is not None:
            check_choice("detectability", self.detectability, DETECTABILITY_CLASSES)
        if self.bug is not None and self.bug not in BUG_CLASSES:
            raise ValueError(
                f"{self.name!r}: bug must be the number of a class in docs/bugs.md "
                f"({BUG_CLASSES[0]}–{BUG_CLASSES[-1]}), got {self.bug!r}"
            )
        for layer in self.layers:
            check_choice("layers", layer, LAYERS)
        self._check_layer_issues()

    def _check_layer_issues(self) -> None:
        """Each of ``layer_issues`` is (one of ``layers``, an address), of an implementation expected private."""
        if self.layer_issues and self.expected != "private":
            raise ValueError(f"{self.name!r}: layer_issues go with expected='private'; a {self.expected!r} implementation has its expectation in every audit")
        for pair in self.layer_issues:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str) and pair[1]):
                raise ValueError(f"{self.name!r}: each of layer_issues is (layer, the upstream report's address), got {pair!r}")
            if pair[0] not in self.layers:
                raise ValueError(f"{self.name!r}: layer_issues name the layer design {pair[0]!r}, which is not one of its layers {self.layers}")
        named = [layer for layer, _ in self.layer_issues]
        if len(set(named)) != len(named):
            raise ValueError(f"{self.name!r}: layer_issues name a layer design more than once: {named}")

    @property
    def bug_reference(self) -> str | None:
        """Where its bug class is described (``docs/bugs.md#bug-9``), or ``None`` when it names none."""
        return None if self.bug is None else BUG_CATALOGUE.format(bug=self.bug)

    def for_layer(self, layer: str | None) -> ImplementationInfo:
        """What to expect of this implementation's audit of the ``layer`` design (``None``: any other audit):
        the known issue ``layer_issues`` names for it, else this info."""
        issue = None if layer is None else dict(self.layer_issues).get(layer)
        if issue is None:
            return self
        return replace(self, expected="known-issue", issue=issue, layer_issues=())


class Implementation(abc.ABC):
    """A DP training implementation under audit.

    Subclasses set :attr:`info` and implement :meth:`train`. Import heavy libraries inside ``train`` (or
    lazily), never at module import: the registry loads every implementation to list it.
    """

    info: ImplementationInfo

    @abc.abstractmethod
    def train(self, request: TrainingRequest) -> TrainedModel:
        """Train with the implementation's own DP code on ``request`` and return the black box and claim."""

    def library_version(self) -> str | None:
        """Installed version of :attr:`ImplementationInfo.library`, or ``None`` when it is not installed."""
        from importlib import metadata

        try:
            return metadata.version(self.info.library)
        except metadata.PackageNotFoundError:
            return None

    def missing_requirements(self) -> tuple[str, ...]:
        """Modules in ``info.requires`` that cannot be imported here."""
        import importlib.util

        return tuple(m for m in self.info.requires if importlib.util.find_spec(m) is None)

    def unavailable_reason(self) -> str | None:
        missing = self.missing_requirements()
        if not missing:
            return None
        hint = install_hint(self.info.extra, missing)
        return f"{self.info.name} needs {', '.join(missing)}, which is not installed here: {hint}"

    def audited_in(self, architecture: MLPArchitecture | LayerArchitecture | TransformerArchitecture) -> Implementation:
        """This implementation as an audit that trains ``architecture`` judges and reports it: for a layer design
        with a known issue (:meth:`ImplementationInfo.for_layer`), a shallow copy whose info is that known issue,
        so that its other audits keep the implementation's own expectation; itself otherwise."""
        info = self.info.for_layer(architecture.layer if isinstance(architecture, LayerArchitecture) else None)
        if info is self.info:
            return self
        view = copy.copy(self)
        view.info = info
        return view

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.name!r}>"


class LanguageImplementation(Implementation):
    """An implementation with ``info.task == "language"``: it trains on a :class:`SequenceRequest`."""

    @abc.abstractmethod
    def train(self, request: SequenceRequest) -> SequenceModel:  # type: ignore[override]
        """Train the designated transformer with the implementation's own DP code."""
