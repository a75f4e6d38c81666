"""What an audit designates, and the named profiles (quick / standard / paper) that fill it in."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from dpverify._validation import check_choice, check_int, check_probability
from dpverify.canaries.synthetic import CanaryConfig, check_dirac_room
from dpverify.contract import LAYERS, DPHyperparameters, LayerArchitecture, MLPArchitecture
from dpverify.canaries.tagged import DataAuditConfig
from dpverify.canaries.worlds import WORLDS, TwoWorldConfig, world_names
from dpverify.stats.scoring import SCORE_KINDS, GuessRule

Design = Literal["inclusion", "pair", "multitask", "in_distribution", "mislabeled", "two_world"]
#: Designs on real data (``config.data``): UniAud++ and the two O(1) baselines it is compared with.
DATA_DESIGNS: tuple[str, ...] = ("multitask", "in_distribution", "mislabeled")
#: Designs on synthetic canaries (UniAud), the only ones that pool runs.
SYNTHETIC_DESIGNS: tuple[str, ...] = ("inclusion", "pair")
DESIGNS: tuple[str, ...] = SYNTHETIC_DESIGNS + DATA_DESIGNS + ("two_world",)
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
Observation = Literal["final_model", "every_update"]
#: What an audit's adversary sees (design rule 16), and how the report says it.
OBSERVATIONS: dict[str, str] = {"final_model": "final model", "every_update": "every update"}
DESIGN_RELATION = {
    "inclusion": "add_remove",
    "pair": "replace_one",
    "multitask": "replace_one",
    "in_distribution": "add_remove",
    "mislabeled": "add_remove",
    "two_world": "add_remove",
}
#: The score each data-dependent design uses (it is part of the design, not a choice).
DATA_DESIGN_SCORE = {"multitask": "self_comparison", "in_distribution": "loss", "mislabeled": "loss"}


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Everything one audit designates; the implementation sees only the canaries and the training part.

    ``design="inclusion"``: each canary joins the training set with probability ½ (bits drawn before
    training), which tests the *add/remove* ε that libraries report. Any score is sound here; the
    default compares the trained label's log-probability with the mean over the other labels. ``design="pair"`` (UniAud
    Algorithm 2): train on every canary and draw the bits afterwards, which tests *replace-one* ε; the claim
    is then converted to replace-one from the run's (σ, q, steps, δ). ``confidence`` is this audit's own.
    ``pooled_runs`` R splits the m canaries over R independent runs, each with its own ≈ m/R canaries and
    secret bits, and tests all m scores together: sound, since a canary touches only its own run, and R
    times cheaper than one run of m Dirac canaries, whose cost grows with m².

    Data-dependent designs (Case II: the model must also be useful) audit on ``data`` (real records,
    :class:`~dpverify.canaries.tagged.DataAuditConfig`) and report the main task's test accuracy:
    ``multitask`` is UniAud++ (Algorithm 3 triggers and tags on a separate tag head, Algorithm 2's
    self-comparison on the tags, replace-one); ``in_distribution`` and ``mislabeled`` are Steinke et al.'s
    O(1) audit with m real records (correctly or wrongly labelled) each included with probability ½,
    scored by the loss of their label (add/remove).

    ``observe="every_update"`` gives the adversary every released update, not only the final model (what
    the accountant's ε bounds): the trainer hands its parameters over after each step
    (:attr:`~dpverify.contract.Request.observe_update`) and each Dirac canary is scored by the likelihood
    ratio of its own Poisson-subsampled Gaussian steps (:mod:`dpverify.canaries.updates`), so a claim at
    q < 1 is tested at its own curve rather than the final model's looser one. It needs the inclusion
    design, Dirac canaries and softmax regression; the normaliser is designated as q·m (the members'
    count is secret), and a trainer that hands nothing over gets the audit "not run" (undecided).

    A :class:`~dpverify.contract.LayerArchitecture` (:func:`layer_config`) designates one layer that fast
    clipping computes a per-record norm for by a formula of its own, with canaries that own that layer's
    parameters (``dirac`` tokens for ``embedding``, ``owned_labels`` for the others).

    ``two_world`` trains the implementation ``worlds.runs`` times on each of two crafted neighbouring
    datasets (:class:`~dpverify.canaries.worlds.TwoWorldConfig`) with this config's model and training, and
    tests the scores of the runs (add/remove); it sees what one run cannot, e.g. a normaliser that reads
    the dataset's size.
    """

    canaries: CanaryConfig = field(default_factory=CanaryConfig)
    architecture: MLPArchitecture | LayerArchitecture = field(default_factory=MLPArchitecture)
    hyperparameters: DPHyperparameters = field(default_factory=lambda: DPHyperparameters(target_epsilon=2.0))
    design: Design = "inclusion"
    score: str = "auto"
    guess_rule: GuessRule = field(default_factory=GuessRule)
    data: DataAuditConfig = field(default_factory=DataAuditConfig)
    worlds: TwoWorldConfig = field(default_factory=TwoWorldConfig)
    confidence: float = 0.95
    seed: int = 0
    device: str = "auto"
    timeout: float | None = None
    pooled_runs: int = 1
    observe: Observation = "final_model"

    def __post_init__(self) -> None:
        check_timeout(self.timeout)
        check_choice("observe", self.observe, tuple(OBSERVATIONS))
        if self.observe == "every_update":
            self._check_every_update()
        check_int("pooled_runs", self.pooled_runs, low=1)
        if self.pooled_runs > 1 and self.design not in SYNTHETIC_DESIGNS:
            raise ValueError(
                f"pooled_runs pools independent runs of synthetic canaries (designs inclusion, pair), got "
                f"pooled_runs={self.pooled_runs} with design={self.design!r}; set pooled_runs=1"
            )
        if self.canaries.m < self.pooled_runs:
            raise ValueError(
                f"each pooled run needs a canary, so m must be >= pooled_runs, got m={self.canaries.m}, "
                f"pooled_runs={self.pooled_runs}"
            )
        if self.canaries.mode == "dirac" and not self.is_data_dependent:
            check_dirac_room(m=max(self.canaries_per_run), dimension=self.canaries.dimension)
        check_choice("design", self.design, DESIGNS)
        check_choice("score", self.score, ("auto",) + SCORE_KINDS)
        check_choice("device", self.device, DEVICES)
        check_probability("confidence", self.confidence)
        check_int("seed", self.seed, low=0)
        if self.is_data_dependent and self.architecture.is_softmax_regression:
            raise ValueError(
                f"the {self.design!r} design trains an MLP (its records need a hidden layer to be learnt), got "
                "hidden_width=0 (softmax regression); set hidden_width >= 1 or take the design's profile "
                f"with profile_config(..., design={self.design!r})"
            )
        if isinstance(self.architecture, LayerArchitecture):
            check_layer_canaries(self.architecture, self.canaries.mode, self.design)
        if self.is_data_dependent and self.score != "auto":
            raise ValueError(f"score must be 'auto' for the {self.design!r} design (its score is fixed), got {self.score!r}")

    def _check_every_update(self) -> None:
        needs = {
            "design='inclusion'": self.design == "inclusion",
            "mode='dirac'": self.canaries.mode == "dirac",
            "hidden_width=0": self.architecture.is_softmax_regression,
            "score='auto'": self.score == "auto",
        }
        missing = [setting for setting, holds in needs.items() if not holds]
        if missing:
            raise ValueError(
                "observe='every_update' reads each Dirac canary's own column of a softmax regression in the "
                f"inclusion design; set {', '.join(missing)}"
            )

    @property
    def relation(self) -> str:
        """The neighbouring relation the design's datasets differ in (the two-world design: its world's)."""
        return self.worlds.relation if self.design == "two_world" else DESIGN_RELATION[self.design]

    @property
    def is_data_dependent(self) -> bool:
        return self.design in DATA_DESIGNS

    @property
    def audit_size(self) -> int:
        """m: the audit records of a data-dependent design, the runs per world of the two-world design,
        else the canaries (of all pooled runs together)."""
        if self.design == "two_world":
            return self.worlds.runs
        return self.data.m if self.is_data_dependent else self.canaries.m

    @property
    def canaries_per_run(self) -> tuple[int, ...]:
        """How the m canaries split over the pooled runs: as evenly as they can, the first runs one more."""
        share, extra = divmod(self.canaries.m, self.pooled_runs)
        return tuple(share + (run < extra) for run in range(self.pooled_runs))

    @property
    def score_kind(self) -> str:
        """``auto``: compare the trained label with every fresh label in the inclusion design (half the
        comparison noise), with its one exchangeable fresh label in the pair design (Algorithm 2)."""
        if self.is_data_dependent:
            return DATA_DESIGN_SCORE[self.design]
        if self.score != "auto":
            return self.score
        return "mean_comparison" if self.design == "inclusion" else "self_comparison"

    def with_overrides(self, **overrides: Any) -> AuditConfig:
        """A copy with flat overrides routed to the right part, e.g. ``m=2000, epsilon=4, design="pair"``."""
        return apply_overrides(self, overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Flat names a user may set (marker keywords, CLI flags, Hypothesis strategies), and where each lives.
CANARY_FIELDS = ("m", "dimension", "num_classes", "mode", "feature_scale")
ARCHITECTURE_FIELDS = ("hidden_width",)
#: Flat names of a layer design's architecture (:class:`~dpverify.contract.LayerArchitecture`).
LAYER_FIELDS = ("positions",)
HYPERPARAMETER_FIELDS = (
    "noise_multiplier",
    "max_grad_norm",
    "sampling_rate",
    "epochs",
    "learning_rate",
    "delta",
    "expected_batch_size",
)
TOP_FIELDS = ("design", "score", "confidence", "seed", "device", "timeout", "pooled_runs", "observe")
GUESS_FIELDS = ("guesses", "sides")
#: ``m`` goes to ``data`` instead of ``canaries`` when the (resulting) design is data-dependent.
DATA_FIELDS = (
    "dataset",
    "test_fraction",
    "trigger_dimension",
    "trigger_mode",
    "trigger_scale",
    "num_tags",
    "tags_per_record",
    "tag_weight",
)
#: The two-world design's part (``config.worlds``).
WORLD_FIELDS = ("world", "runs", "records", "outputs", "relation")
OVERRIDABLE = (
    CANARY_FIELDS
    + ARCHITECTURE_FIELDS
    + LAYER_FIELDS
    + HYPERPARAMETER_FIELDS
    + TOP_FIELDS
    + GUESS_FIELDS
    + DATA_FIELDS
    + WORLD_FIELDS
    + ("epsilon",)
)


def apply_overrides(config: AuditConfig, overrides: dict[str, Any]) -> AuditConfig:
    """Route flat overrides to their part of ``config``; unknown names are a ``ValueError``.

    ``epsilon`` is the target ε the implementation calibrates to (``inf`` or ``noise_multiplier=0`` for
    non-private training); ``guesses`` is a fixed count or a tuple of fractions of m.
    """
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"unknown audit setting(s) {', '.join(unknown)}; known: {', '.join(sorted(OVERRIDABLE))}")

    def pick(names: tuple[str, ...]) -> dict[str, Any]:
        return {k: overrides[k] for k in names if k in overrides}

    design = overrides.get("design", config.design)
    if "relation" in overrides and design != "two_world":
        raise ValueError(
            f"relation sets the two-world design's neighbours; the {design} design's datasets are "
            f"{DESIGN_RELATION.get(design, '?')} neighbours by construction"
        )
    top_fields = pick(TOP_FIELDS)
    if design not in SYNTHETIC_DESIGNS:
        top_fields.setdefault("pooled_runs", 1)  # only synthetic canaries pool runs
    canary_fields, data_fields = pick(CANARY_FIELDS), pick(DATA_FIELDS)
    if design in DATA_DESIGNS and "m" in canary_fields:
        data_fields["m"] = canary_fields.pop("m")
    if canary_fields.get("mode", config.canaries.mode) == "dirac" and "dimension" not in canary_fields:
        # A Dirac canary owns a coordinate: the dimension follows the canaries per run unless the user sets it.
        runs, m = top_fields.get("pooled_runs", config.pooled_runs), canary_fields.get("m", config.canaries.m)
        if all(isinstance(n, int) and n >= 1 for n in (runs, m)):  # else AuditConfig names what is wrong
            canary_fields["dimension"] = max(1, -(-m // runs))
    return dataclasses.replace(
        config,
        canaries=dataclasses.replace(config.canaries, **canary_fields),
        data=dataclasses.replace(config.data, **data_fields),
        worlds=dataclasses.replace(config.worlds, **pick(WORLD_FIELDS)),
        architecture=override_architecture(config.architecture, overrides),
        hyperparameters=override_hyperparameters(config.hyperparameters, overrides),
        guess_rule=override_guess_rule(config.guess_rule, overrides),
        **top_fields,
    )


def override_architecture(
    architecture: MLPArchitecture | LayerArchitecture, overrides: dict[str, Any]
) -> MLPArchitecture | LayerArchitecture:
    """``architecture`` with its flat fields in ``overrides``; a field of the other kind is a ``ValueError``."""
    own, other = (LAYER_FIELDS, ARCHITECTURE_FIELDS)
    if isinstance(architecture, MLPArchitecture):
        own, other = other, own
    wrong = sorted(k for k in other if k in overrides)
    if wrong:
        raise ValueError(
            f"{', '.join(wrong)} do(es) not apply to the designated {type(architecture).__name__}; it takes "
            f"{', '.join(own)}"
        )
    return dataclasses.replace(architecture, **{k: overrides[k] for k in own if k in overrides})


def check_layer_canaries(architecture: LayerArchitecture, mode: str, design: str) -> None:
    """A layer design needs synthetic canaries that own its layer's parameters: ``dirac`` tokens own their
    embedding row; ``owned_labels`` own their rows of a linear or convolution layer and its bias coordinates."""
    if design not in SYNTHETIC_DESIGNS:
        raise ValueError(f"a layer design takes the synthetic designs {SYNTHETIC_DESIGNS}, got design={design!r}")
    needed = LAYER_CANARY_MODES[architecture.layer]
    if mode != needed:
        raise ValueError(
            f"the {architecture.layer!r} layer design needs canaries of mode {needed!r} (each owns its own "
            f"parameters of the layer), got mode={mode!r}"
        )


def check_timeout(timeout: Any) -> None:
    """A time limit is a number of seconds > 0, or ``None`` for none."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0 (or None), got {timeout!r}")


def override_hyperparameters(hyperparameters: DPHyperparameters, overrides: dict[str, Any]) -> DPHyperparameters:
    """``hyperparameters`` with the flat :data:`HYPERPARAMETER_FIELDS` and ``epsilon`` in ``overrides``:
    a target ε replaces a noise multiplier and vice versa; ε = ∞ means σ = 0 (non-private training)."""
    hyper = {k: overrides[k] for k in HYPERPARAMETER_FIELDS if k in overrides}
    if "epsilon" in overrides:
        epsilon = overrides["epsilon"]
        if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0):
            raise ValueError(f"epsilon must be a number > 0 (or inf for non-private training), got {epsilon!r}")
        if epsilon is not None and float(epsilon) == float("inf"):
            hyper.update(noise_multiplier=0.0, target_epsilon=None)
        else:
            hyper.update(target_epsilon=epsilon, noise_multiplier=None)
    elif "noise_multiplier" in hyper:
        hyper["target_epsilon"] = None
    return dataclasses.replace(hyperparameters, **hyper)


def override_guess_rule(guess_rule: GuessRule, overrides: dict[str, Any]) -> GuessRule:
    """``guess_rule`` with ``guesses`` (a fixed count, or a tuple of fractions of m) and ``sides``."""
    if "guesses" in overrides:
        guesses = overrides["guesses"]
        if isinstance(guesses, int) and not isinstance(guesses, bool):
            guess_rule = GuessRule(count=guesses, sides=guess_rule.sides)
        elif isinstance(guesses, (tuple, list)):
            guess_rule = GuessRule(fractions=tuple(guesses), sides=guess_rule.sides)
        else:
            raise ValueError(f"guesses must be a count (an integer >= 1) or a tuple of fractions of m, got {guesses!r}")
    if "sides" in overrides:
        guess_rule = dataclasses.replace(guess_rule, sides=overrides["sides"])
    return guess_rule


def _mlp_profile(
    *,
    m: int,
    dimension: int,
    hidden_width: int,
    num_classes: int,
    sampling_rate: float,
    epochs: int,
    learning_rate: float,
    timeout: float,
) -> AuditConfig:
    return AuditConfig(
        timeout=timeout,
        canaries=CanaryConfig(m=m, dimension=dimension, num_classes=num_classes),
        architecture=MLPArchitecture(hidden_width=hidden_width),
        hyperparameters=DPHyperparameters(
            target_epsilon=2.0, sampling_rate=sampling_rate, epochs=epochs, learning_rate=learning_rate
        ),
    )


def _dirac_profile(*, runs_of: int, pooled_runs: int, max_grad_norm: float, timeout: float) -> AuditConfig:
    """Dirac canaries in zero-initialised softmax regression, ``pooled_runs`` runs of ``runs_of`` canaries,
    full batch (q = 1), 10 steps, 10 classes.

    A clipped canary moves its own column of weights by lr·C/N per step, so the learning rate is 1/C
    (the run is then the same at every C); the features' scale of 100 keeps every canary's gradient far
    above C, so each is clipped. At q = 1 the claimed run is exactly μ-GDP, and the canaries' scores
    separate by 0.96–1.01 of that μ in every bundled implementation (benchmarks/results/dirac.md)."""
    return AuditConfig(
        timeout=timeout,
        pooled_runs=pooled_runs,
        canaries=CanaryConfig(m=runs_of * pooled_runs, dimension=runs_of, num_classes=10, mode="dirac", feature_scale=100.0),
        architecture=MLPArchitecture(hidden_width=0),
        hyperparameters=DPHyperparameters(
            target_epsilon=2.0, sampling_rate=1.0, epochs=10, max_grad_norm=max_grad_norm, learning_rate=1.0 / max_grad_norm
        ),
    )


#: Named starting points, chosen from measured power × time (benchmarks/results/). Each has a generous time
#: limit for one training run: ~10x the slowest bundled implementation measured on a busy 2-core CPU.
#:
#: For the synthetic designs (``inclusion``, ``pair``) ``quick`` (what CI runs), ``standard`` and ``gpu`` are
#: Dirac audits: canaries that each own an input coordinate of a softmax regression, which reach the claimed
#: mechanism's whole curve, pooled over independent runs (a run's cost grows with m², pooling with R). Their
#: clipping norms are not 1 (0.5, 2, 2), so that a bug with a wrong power or product of C shows.
#: ``mlp`` (the MLP of UniAud, full batch) and ``paper`` (the paper's setting: q = 0.1, d = 10³, h = 10⁵,
#: C = 10³, m = 10⁴, which wants a GPU) audit a model with a hidden layer.
#:
#: The data designs (UniAud++ and its baselines) need hidden layers, so each profile names an MLP setting
#: for them too (:data:`MLP_PROFILES`): ``profile_config`` picks by the design asked for.
PROFILES: dict[str, AuditConfig] = {
    "quick": _dirac_profile(runs_of=2500, pooled_runs=4, max_grad_norm=0.5, timeout=1800),
    "standard": _dirac_profile(runs_of=2500, pooled_runs=100, max_grad_norm=2.0, timeout=1800),
    "gpu": _dirac_profile(runs_of=10_000, pooled_runs=25, max_grad_norm=2.0, timeout=3600),
    # A full batch averages each record's clipped gradient over N, so the learning rate is 5 to let a run
    # without noise memorise its canaries (lr 1 left a missing-noise bug at ε_L ≈ 1.7).
    "mlp": _mlp_profile(
        m=1000, dimension=1000, hidden_width=1000, num_classes=100, sampling_rate=1.0, epochs=20, learning_rate=5.0,
        timeout=1800,
    ),
    "paper": _mlp_profile(
        m=10_000, dimension=1000, hidden_width=100_000, num_classes=1000, sampling_rate=0.1, epochs=50, learning_rate=0.5,
        timeout=14_400,
    ),
}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)
_MLP_STANDARD = _mlp_profile(
    m=2000, dimension=2000, hidden_width=1000, num_classes=100, sampling_rate=1.0, epochs=20, learning_rate=5.0,
    timeout=3600,
)
#: The MLP setting of each profile, for the designs that need hidden layers (:data:`DATA_DESIGNS`).
MLP_PROFILES: dict[str, AuditConfig] = {
    "quick": PROFILES["mlp"],
    "standard": _MLP_STANDARD,
    "gpu": PROFILES["paper"],
    "mlp": PROFILES["mlp"],
    "paper": PROFILES["paper"],
}


def profile_config(name: str, **overrides: Any) -> AuditConfig:
    """The named profile for the design in ``overrides`` (its MLP setting for a data design, the world's
    setting in the default gate for ``two_world``: :func:`two_world_config`), with ``overrides`` applied (see
    :func:`apply_overrides`)."""
    check_choice("profile", name, PROFILE_NAMES)
    design = overrides.get("design", PROFILES[name].design)
    if design == "two_world":  # the world's own design (its σ, q, records, learning rate), then the overrides
        return apply_overrides(two_world_config(name, overrides.get("world", TwoWorldConfig.world)), overrides)
    needs_mlp = design in DATA_DESIGNS
    return apply_overrides((MLP_PROFILES if needs_mlp else PROFILES)[name], overrides)


#: The canary mode whose canaries own a layer's parameters (:func:`check_layer_canaries`).
LAYER_CANARY_MODES = {"embedding": "dirac", "linear_3d": "owned_labels", "layer_norm": "owned_labels", "conv": "owned_labels"}
#: What the default gate designates in each layer design at the quick profile: the Dirac quick profile's
#: training (q = 1, 10 steps, clipping 0.5, lr 2, target ε 2) on T positions pooled by each record's position
#: regime (:func:`~dpverify.contract.position_weights`: half the records T positions of 1/√(2T), a quarter one
#: heavy position of 4√(T/2), a quarter an unequal ramp), so that a formula that takes the positions as separate rows
#: clips the small regime's records 4 times too weakly for the embedding (T = 16) and 3.9 times for the linear
#: layer's bias (T = 16, an input of 1/16, whose weight's share of the norm the bias formula does not touch),
#: and Opacus 1.5.0–1.5.3's squared bias formula 5.4 times (tests/test_layers.py). ``embedding``: 4 runs of
#: 1000 Dirac tokens, 10 classes; ``linear_3d``: 8 runs of 500 canaries, each owning 2 of its run's 1000
#: labels, 4 input features (a record's regime is its label modulo 4; its cost grows with a run's canaries
#: times its labels times T², so its runs are fewer); ``layer_norm``: as ``linear_3d``, its input the run's
#: 1000 labels wide (:func:`layer_config` sets the dimension), each canary's feature on its label's coordinate,
#: T = 4, so that a formula that averages the positions states 4 times too little. Its normalised feature is
#: √1000 ≈ 32 on the label's coordinate, so a clipped step moves the canary's logit √2·32 times lr·C/N: lr 1/8
#: keeps that small, as the other designs' (the Dirac profile's lr 2 moved it out of the linear regime: ρ 0.79
#: instead of 1.02, seed 1, with the earlier equal positions). ``conv``: as ``linear_3d`` through a Conv1d of
#: kernel 3 with 16 outputs (18 inputs), input 1/8, so that a formula that keeps the positions as rows states
#: 4 times too little in the small regime. The weight holds 3·0.125² / (1 + 3·0.125²) = 4.5 % of a record's
#: squared norm, so a formula that drops one kernel offset (0.8 % of the norm) is not seen.
LAYER_SETTINGS: dict[str, dict[str, Any]] = {
    "embedding": dict(m=4000, pooled_runs=4, positions=16, num_classes=10, mode="dirac", feature_scale=1.0),
    "linear_3d": dict(
        m=4000, pooled_runs=8, positions=16, num_classes=2, mode="owned_labels", dimension=4, feature_scale=0.0625
    ),
    "layer_norm": dict(
        m=4000, pooled_runs=8, positions=4, num_classes=2, mode="owned_labels", feature_scale=1.0, learning_rate=0.125
    ),
    "conv": dict(
        m=4000, pooled_runs=8, positions=16, num_classes=2, mode="owned_labels", dimension=4, feature_scale=0.125
    ),
}
#: Each profile's canaries of a layer design, as a multiple of the quick setting's (more pooled runs).
LAYER_RUNS_SCALE: dict[str, int] = {"quick": 1, "standard": 10, "gpu": 10, "mlp": 1, "paper": 10}


def layer_config(profile: str, layer: str, **overrides: Any) -> AuditConfig:
    """The default gate's audit of the ``layer`` design at ``profile``: the profile's Dirac training with
    the layer's :class:`~dpverify.contract.LayerArchitecture` and canaries (:data:`LAYER_SETTINGS`, pooled
    runs scaled by :data:`LAYER_RUNS_SCALE`), then ``overrides`` (:func:`apply_overrides`)."""
    check_choice("profile", profile, PROFILE_NAMES)
    check_choice("layer", layer, LAYERS)
    setting = dict(LAYER_SETTINGS[layer])
    scale = LAYER_RUNS_SCALE[profile]
    setting.update(m=setting["m"] * scale, pooled_runs=setting["pooled_runs"] * scale)
    quick = PROFILES["quick"]
    canaries = dataclasses.replace(quick.canaries, mode=LAYER_CANARY_MODES[layer])
    base = dataclasses.replace(quick, architecture=LayerArchitecture(layer=layer), canaries=canaries)
    if profile != "quick":
        base = dataclasses.replace(base, timeout=PROFILES[profile].timeout)
    config = apply_overrides(base, {**setting, **overrides})
    if layer != "layer_norm":
        return config
    # The LayerNorm's input is as wide as its run's labels: every run needs the same number of canaries.
    if len(set(config.canaries_per_run)) != 1:
        raise ValueError(
            f"the layer_norm design needs as many canaries in every pooled run (its input is as wide as a run's "
            f"labels), so m must be a multiple of pooled_runs, got m={config.canaries.m}, pooled_runs={config.pooled_runs}"
        )
    return config.with_overrides(dimension=config.canaries_per_run[0] * config.canaries.num_classes)


#: The settings a session may change in the default gate's layer audits; the rest is the layer's design (a
#: session's m or ε are the one-run audit's; a layer design's canaries, runs and claim are fixed with it).
LAYER_GATE_SETTINGS: tuple[str, ...] = ("device", "timeout")


def one_run_full_batch(profile: str, settings: dict[str, Any]) -> bool:
    """Whether the one-run audits of ``profile`` with a run's ``settings`` (``--set``, ``--dp-audit-set``)
    train at q = 1 (:func:`dpverify.gate.gate_audits`' ``full_batch``). Settings no config takes say nothing
    here (True): each audit's own config refuses them, naming its implementation."""
    chosen = {k: v for k, v in settings.items() if k in OVERRIDABLE}
    try:
        return profile_config(profile, **chosen).hyperparameters.sampling_rate == 1.0
    except ValueError:
        return True


def gate_layer_config(profile: str, layer: str, settings: dict[str, Any]) -> AuditConfig:
    """:func:`layer_config` with those of a run's ``settings`` (meant for every audit: ``--set``,
    ``--dp-audit-set``) that a gate layer audit takes (:data:`LAYER_GATE_SETTINGS`)."""
    return layer_config(profile, layer, **{k: v for k, v in settings.items() if k in LAYER_GATE_SETTINGS})


#: Each profile's runs per world, as a multiple of the quick setting's.
TWO_WORLD_RUNS_SCALE: dict[str, int] = {"quick": 1, "standard": 10, "gpu": 10, "mlp": 1, "paper": 10}
#: The settings a session may change in the default gate's two-world audits; the rest is the world's design.
TWO_WORLD_GATE_SETTINGS: tuple[str, ...] = ("runs", "records", "outputs", "device", "timeout")


def two_world_config(profile: str, world: str, **overrides: Any) -> AuditConfig:
    """The default gate's two-world audit of ``world`` at ``profile`` (its registered
    :attr:`~dpverify.canaries.worlds.World.quick_setting`, runs
    scaled by :data:`TWO_WORLD_RUNS_SCALE`), with ``overrides`` among :data:`TWO_WORLD_GATE_SETTINGS`.
    The world designates σ rather than a target ε: its learning rate is matched to the noise."""
    check_choice("profile", profile, PROFILE_NAMES)
    check_choice("world", world, world_names())
    unknown = sorted(set(overrides) - set(TWO_WORLD_GATE_SETTINGS))
    if unknown:
        raise ValueError(
            f"the default two-world audits take only {', '.join(TWO_WORLD_GATE_SETTINGS)}, got {', '.join(unknown)}"
        )
    setting = dict(WORLDS[world].quick_setting)
    setting["runs"] *= TWO_WORLD_RUNS_SCALE[profile]
    setting.update(design="two_world", world=world, hidden_width=0, max_grad_norm=1.0)
    return apply_overrides(PROFILES[profile], {**setting, **overrides})


def gate_world_config(profile: str, world: str, settings: dict[str, Any]) -> AuditConfig:
    """:func:`two_world_config` with those of a run's ``settings`` (meant for every audit: ``--set``,
    ``--dp-audit-set``) that a gate world takes; the others are the one-run audits'."""
    return two_world_config(profile, world, **{k: v for k, v in settings.items() if k in TWO_WORLD_GATE_SETTINGS})


#: What the default gate's every-update audit designates, fixed before the gate's audits ran (sized in
#: simulation): Dirac canaries in runs of 2500 (the profile's clip norm and learning rate; the quick
#: profile's for the MLP profiles) seen at every step of 8 epochs at q = 0.1 and σ = 1, so that the claim's
#: own subsampled curve is tested: at the quick profile's 16 runs, simulated audits of a claim of 1 step in
#: 4, of a q four times too small and of half the noise were refuted in 20 of 20, a correct claim in 0 of
#: 20 (benchmarks/results/every-update-dirac.md; 4 epochs left 1 step in 4 at p ≈ 1e-3 to 5e-5).
#: Guesses on the members' side only, at three counts: a subsampled Gaussian's privacy loss is lopsided
#: (a member's sampled steps show, a non-member has nothing to show), and the separation lives in the
#: top 2–10 % of the scores.
EVERY_UPDATE_SETTING: dict[str, Any] = dict(
    observe="every_update", noise_multiplier=1.0, sampling_rate=0.1, epochs=8, guesses=(0.02, 0.05, 0.1), sides="one"
)
#: Each profile's pooled runs of 2500 canaries in the every-update audit.
EVERY_UPDATE_RUNS: dict[str, int] = {"quick": 16, "standard": 64, "gpu": 64, "mlp": 16, "paper": 64}
#: The settings a session may change in the default gate's every-update audit; the rest is its design.
EVERY_UPDATE_GATE_SETTINGS: tuple[str, ...] = ("m", "pooled_runs", "device", "timeout")
#: What the every-update audit of correlated noise designates instead (an implementation whose claim states a
#: noise structure, :attr:`~dpverify.contract.ImplementationInfo.correlated_noise`): the full batch, a record in
#: every one of 32 steps, the profile's every-update runs of 500 Dirac canaries each. Only there does the score decorrelate
#: by the claim's strategy exactly (its event is the full-batch Gaussian of the whitened updates:
#: :func:`~dpverify.stats.events.correlated_release`); at q = 0.1 it scores every step while a record takes part in
#: a tenth of them (a 2.8-fold noise deficit of jax-privacy-dense-mf-single-participation passed it, ρ 1.2). It
#: designates a target ε (4), not σ: a σ designates DP-SGD's run, 32 composed steps, while the claim's event is
#: one Gaussian of the whitened updates, the μ-GDP run a target ε designates at q = 1. At the quick profile a
#: correct dense-MF run passed on 5 of 5 seeds and its two variants were refuted on 5 of 5, each audit a few
#: CPU-s once traced (benchmarks/results/dense-mf.md).
EVERY_UPDATE_CORRELATED_SETTING: dict[str, Any] = dict(
    observe="every_update", epsilon=4.0, sampling_rate=1.0, epochs=32, sides="one"
)
EVERY_UPDATE_CORRELATED_CANARIES = 500
#: What the every-update audit of correlated noise designates for an implementation that samples nothing
#: (:attr:`~dpverify.contract.ImplementationInfo.amplified` false: DP-FTRL, each epoch one pass over the data in
#: 1/q batches of a fixed order): epochs of 4 steps (q = 1/4, a tree of depth 3 per epoch; a power of 2, so the
#: restarted tree's strategy has exactly 4 bands and its events read as one participation an epoch,
#: :func:`~dpverify.stats.events.correlated_release`), 8 of them, the profile's every-update runs of
#: :data:`EVERY_UPDATE_CORRELATED_CANARIES` Dirac canaries, a target ε of 4 (σ = 5.67 by TF-Privacy's
#: accountant; the event's μ 0.86), and a learning rate of 0.02 so that the canaries' gradients stay clipped and
#: alike over the run (at the profile's 2.0 each participation moved a canary's logit by 0.8 and a tree that
#: never restarts, whose summed noise is small, let members fit their label and their gradients fade: it
#: passed, its score's μ 1.13 where the ceiling's is 1.85). At q = 1 an epoch is one step and the tree one
#: leaf, DP-SGD's independent noise, so the full-batch design cannot see a tree; at the DP-SGD design's σ = 1
#: and q = 0.1 the unamplified claim is ε 41.6, beyond what the audit can refute. Here each canary is scored at
#: each of the 4 places it may hold in every epoch, whitened by the claimed tree and mixed over the places: a
#: perfect attacker of the correct run who knows the places reaches 0.92 of the claimed μ, the mixed score
#: 0.77, while a tree never restarted shows 2.1 times the claimed μ to it and node noise for one epoch's tree
#: 2.2 times (benchmarks/results/tf-privacy-ftrl.md: the numpy ceiling, and the audits over seeds).
EVERY_UPDATE_EPOCHS_SETTING: dict[str, Any] = dict(
    observe="every_update", epsilon=4.0, sampling_rate=0.25, epochs=8, learning_rate=0.02, sides="one"
)


def every_update_config(
    profile: str, settings: dict[str, Any], *, correlated: bool = False, amplified: bool = True
) -> AuditConfig:
    """The default gate's every-update audit at ``profile`` (:data:`EVERY_UPDATE_SETTING`, :data:`EVERY_UPDATE_RUNS`;
    with ``correlated``, :data:`EVERY_UPDATE_CORRELATED_SETTING`, or :data:`EVERY_UPDATE_EPOCHS_SETTING` for an
    implementation that is not ``amplified``, and as many runs of :data:`EVERY_UPDATE_CORRELATED_CANARIES`), with those of a run's ``settings`` (``--set``, ``--dp-audit-set``)
    among :data:`EVERY_UPDATE_GATE_SETTINGS`; the others are the one-run audits'. It designates σ rather than a
    target ε, as the two-world worlds do."""
    check_choice("profile", profile, PROFILE_NAMES)
    base = PROFILES[profile] if PROFILES[profile].canaries.mode == "dirac" else PROFILES["quick"]
    chosen = {k: v for k, v in settings.items() if k in EVERY_UPDATE_GATE_SETTINGS}
    runs = EVERY_UPDATE_RUNS[profile]
    if correlated:
        setting = EVERY_UPDATE_CORRELATED_SETTING if amplified else EVERY_UPDATE_EPOCHS_SETTING
        design = {**setting, "m": EVERY_UPDATE_CORRELATED_CANARIES * runs}
    else:
        design = {**EVERY_UPDATE_SETTING, "m": 2500 * runs}
    return apply_overrides(base, {**design, "pooled_runs": runs, **chosen})


def parse_settings(pairs: Any) -> dict[str, Any]:
    """``NAME=VALUE`` pairs (``--set``, ``--dp-audit-set``) as overrides: VALUE is a Python literal, or a
    string when it is none; an unknown NAME is a ``ValueError`` listing the known ones."""
    import ast

    settings: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"a setting takes NAME=VALUE, got {pair!r}")
        try:
            settings[name] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            settings[name] = text.strip()
    return settings
