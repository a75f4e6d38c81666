"""Hypothesis strategies for audit configurations, and a settings profile for expensive audits.

Every strategy takes keyword-only bounds (as ``hypothesis.extra.numpy`` does), validated at the door, so
a test can say "orthogonal canaries, m between 200 and 1000, ε between 1 and 4". Each example is a full
training run: use :data:`audit_settings` (no deadline, few examples, no shrinking, derandomized on CI)
and the plugin counts ``max_examples`` as the test's audits. Draws never trip dpverify's own warnings
(dependent draws keep orthogonal and Dirac canaries within their dimension). A drawn configuration goes
to the ``dp_audit`` fixture as it is, and the session sets its seed and level::

    from hypothesis import given
    from dpverify.strategies import audit_configs, audit_settings, canary_configs

    @audit_settings
    @given(config=audit_configs(architectures=("softmax_regression",), canaries=canary_configs(max_m=500)))
    def test_my_dpsgd_keeps_its_claim(dp_audit, config):
        result = dp_audit("my-dpsgd", config)   # raises DPViolation when the claim is refuted
        assert result.m == config.canaries.m
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from dpverify._validation import check_int, check_real
from dpverify.canaries.synthetic import CANARY_MODES, CanaryConfig
from dpverify.config import DATA_DESIGNS, DESIGNS, SYNTHETIC_DESIGNS, AuditConfig, profile_config
from dpverify.contract import DPHyperparameters, MLPArchitecture
from dpverify.canaries.tagged import DataAuditConfig
from dpverify.canaries.worlds import WORLDS, TwoWorldConfig, world_names

#: Every phase but shrinking (and explaining, which reruns the test around the shrunk example): each
#: example is an audit, so a failing test costs its examples plus the one replay that reports the failing
#: example (with ``@reproduce_failure``), not dozens of shrink steps.
AUDIT_PHASES = tuple(phase for phase in Phase if phase not in (Phase.shrink, Phase.explain))

#: No deadline (an example trains a model), few examples, no shrinking, derandomized where ``CI`` is set.
#: Also the profile ``dp-audit``; a profile of your own can start from it:
#: ``settings.register_profile("mine", parent=audit_settings, max_examples=10)``.
audit_settings = settings(
    deadline=None,
    max_examples=3,
    phases=AUDIT_PHASES,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    print_blob=True,
)
settings.register_profile("dp-audit", audit_settings)

#: The models :func:`audit_configs` draws: softmax regression (hidden width 0) and one-hidden-layer MLPs.
ARCHITECTURES: tuple[str, ...] = ("softmax_regression", "mlp")
#: Canary modes whose rows need a coordinate each (Dirac) or stay orthogonal only while m ≤ dimension.
MODES_NEEDING_ROOM: tuple[str, ...] = ("orthogonal", "dirac")


def _subset(name: str, chosen: tuple[str, ...], known: tuple[str, ...]) -> None:
    if not chosen or set(chosen) - set(known):
        raise ValueError(f"{name} must be a non-empty subset of {known}, got {chosen!r}")


def _bounds(name: str, low: float, high: float) -> None:
    if low > high:
        raise ValueError(f"min_{name} must be <= max_{name}, got {low} > {high}")


def canary_configs(
    *,
    min_m: int = 100,
    max_m: int = 1000,
    min_dimension: int = 100,
    max_dimension: int = 1000,
    min_classes: int = 10,
    max_classes: int = 100,
    modes: tuple[str, ...] = CANARY_MODES,
    min_feature_scale: float = 3.0,
    max_feature_scale: float = 20.0,
) -> st.SearchStrategy[CanaryConfig]:
    """Canary configurations within the given bounds (inclusive). Orthogonal and Dirac canaries need
    dimension ≥ m (:data:`MODES_NEEDING_ROOM`): for them m is drawn up to ``max_dimension`` and the
    dimension from m up, so no draw is discarded and none trips the orthogonal canaries' warning."""
    check_int("min_m", min_m, low=1)
    check_int("min_dimension", min_dimension, low=1)
    check_int("min_classes", min_classes, low=2)
    check_real("min_feature_scale", min_feature_scale, low=0.0, low_open=True)
    for name, low, high in (
        ("m", min_m, max_m),
        ("dimension", min_dimension, max_dimension),
        ("classes", min_classes, max_classes),
        ("feature_scale", min_feature_scale, max_feature_scale),
    ):
        _bounds(name, low, high)
    _subset("modes", modes, CANARY_MODES)
    cramped = [mode for mode in modes if mode in MODES_NEEDING_ROOM]
    if cramped and min_m > max_dimension:
        raise ValueError(
            f"{' and '.join(cramped)} canaries need dimension >= m, got min_m={min_m} > max_dimension={max_dimension}; "
            f"raise max_dimension to at least {min_m} or leave {' and '.join(cramped)} out of modes"
        )

    @st.composite
    def build(draw) -> CanaryConfig:
        mode = draw(st.sampled_from(modes))
        if mode in MODES_NEEDING_ROOM:
            m = draw(st.integers(min_m, min(max_m, max_dimension)))
            dimension = draw(st.integers(max(min_dimension, m), max_dimension))
        else:
            m, dimension = draw(st.integers(min_m, max_m)), draw(st.integers(min_dimension, max_dimension))
        return CanaryConfig(
            m=m,
            dimension=dimension,
            num_classes=draw(st.integers(min_classes, max_classes)),
            mode=mode,
            feature_scale=draw(st.floats(min_feature_scale, max_feature_scale)),
        )

    return build()


def dp_hyperparameters(
    *,
    min_epsilon: float = 1.0,
    max_epsilon: float = 8.0,
    sampling_rates: tuple[float, ...] = (0.05, 0.1, 0.2),
    min_epochs: int = 5,
    max_epochs: int = 30,
    min_learning_rate: float = 0.1,
    max_learning_rate: float = 1.0,
    min_grad_norm: float = 0.01,
    max_grad_norm: float = 100.0,
    delta: float = 1e-5,
) -> st.SearchStrategy[DPHyperparameters]:
    """DP-SGD hyperparameters with a target ε the implementation calibrates to.

    The clipping norm C is drawn log-uniformly over decades (0.01 to 100 by default): a bug that shows
    only when C leaves 1 (a wrong power or product of C, σ and the batch size) hides at C = 1. The
    learning rate is drawn as the step per unit of C and divided by C, so a step moves the parameters by
    the same order whatever C is, and training neither stalls nor diverges for the size of C alone.
    """
    check_real("min_epsilon", min_epsilon, low=0.0, low_open=True)
    check_int("min_epochs", min_epochs, low=1)
    check_real("min_learning_rate", min_learning_rate, low=0.0, low_open=True)
    check_real("min_grad_norm", min_grad_norm, low=0.0, low_open=True)
    _bounds("epsilon", min_epsilon, max_epsilon)
    _bounds("epochs", min_epochs, max_epochs)
    _bounds("learning_rate", min_learning_rate, max_learning_rate)
    _bounds("grad_norm", min_grad_norm, max_grad_norm)
    for rate in sampling_rates:
        check_real("sampling_rates", rate, low=0.0, high=1.0, low_open=True)

    @st.composite
    def build(draw) -> DPHyperparameters:
        # exp(log(x)) can round past x: clamp, so C never leaves the declared range.
        clip = min(max(math.exp(draw(st.floats(math.log(min_grad_norm), math.log(max_grad_norm)))), min_grad_norm), max_grad_norm)
        return DPHyperparameters(
            target_epsilon=draw(st.floats(min_epsilon, max_epsilon)),
            sampling_rate=draw(st.sampled_from(sampling_rates)),
            epochs=draw(st.integers(min_epochs, max_epochs)),
            learning_rate=draw(st.floats(min_learning_rate, max_learning_rate)) / clip,
            max_grad_norm=clip,
            delta=delta,
        )

    return build()


def data_audit_configs(
    *,
    min_m: int = 50,
    max_m: int = 500,
    min_tags: int = 10,
    max_tags: int = 100,
    max_tags_per_record: int = 4,
    trigger_modes: tuple[str, ...] = CANARY_MODES,
) -> st.SearchStrategy[DataAuditConfig]:
    """Data-dependent audit parts (UniAud++ and baselines) on digits; the trigger dimension is m, so
    orthogonal triggers stay orthogonal, and H ≤ min(max_tags_per_record, |E|)."""
    check_int("min_m", min_m, low=1)
    check_int("min_tags", min_tags, low=2)
    check_int("max_tags_per_record", max_tags_per_record, low=1)
    _bounds("m", min_m, max_m)
    _bounds("tags", min_tags, max_tags)
    _subset("trigger_modes", trigger_modes, CANARY_MODES)

    @st.composite
    def build(draw) -> DataAuditConfig:
        m, num_tags = draw(st.integers(min_m, max_m)), draw(st.integers(min_tags, max_tags))
        return DataAuditConfig(
            m=m,
            trigger_dimension=m,
            trigger_mode=draw(st.sampled_from(trigger_modes)),
            num_tags=num_tags,
            tags_per_record=draw(st.integers(1, min(max_tags_per_record, num_tags))),
        )

    return build()


def two_world_configs(
    *,
    min_runs: int = 10,
    max_runs: int = 200,
    max_records: int = 10,
    min_outputs: int = 2,
    max_outputs: int = 4096,
    worlds: tuple[str, ...] | None = None,
) -> st.SearchStrategy[TwoWorldConfig]:
    """The two-world design's part: a crafted world (by default every registered world but those that
    :attr:`~dpverify.canaries.worlds.World.designates_sigma`, which drawn configurations leave to a target
    ε), runs per world, records in D (1 to ``max_records``: the tiny datasets where a size-reading
    normaliser shows; a multiple of the world's ``records_multiple``, even for the microbatch world) and the
    model's outputs (the world's own number where it takes one: two in the fixed-batch world)."""
    check_int("min_runs", min_runs, low=2)
    check_int("max_records", max_records, low=1)
    check_int("min_outputs", min_outputs, low=2)
    _bounds("runs", min_runs, max_runs)
    _bounds("outputs", min_outputs, max_outputs)
    if worlds is None:
        worlds = tuple(w for w in world_names() if not WORLDS[w].designates_sigma)
    _subset("worlds", worlds, world_names())
    too_few = [w for w in worlds if max_records < WORLDS[w].records_multiple]  # the microbatch world cuts D into pairs
    if len(too_few) == len(worlds):
        raise ValueError(f"the {too_few[0]} world needs max_records >= {WORLDS[too_few[0]].records_multiple}, got {max_records}")
    worlds = tuple(w for w in worlds if w not in too_few)

    @st.composite
    def build(draw) -> TwoWorldConfig:
        world = draw(st.sampled_from(worlds))
        step, outputs = WORLDS[world].records_multiple, WORLDS[world].outputs
        return TwoWorldConfig(
            world=world,
            runs=draw(st.integers(min_runs, max_runs)),
            records=draw(st.integers(1, max_records // step)) * step,
            outputs=outputs if outputs is not None else draw(st.integers(min_outputs, max_outputs)),
        )

    return build()


def audit_configs(
    *,
    profile: str = "quick",
    canaries: st.SearchStrategy[CanaryConfig] | None = None,
    hyperparameters: st.SearchStrategy[DPHyperparameters] | None = None,
    architectures: tuple[str, ...] = ARCHITECTURES,
    min_hidden_width: int = 100,
    max_hidden_width: int = 1000,
    max_pooled_runs: int = 2,
    designs: tuple[str, ...] = SYNTHETIC_DESIGNS,
    data: st.SearchStrategy[DataAuditConfig] | None = None,
    worlds: st.SearchStrategy[TwoWorldConfig] | None = None,
) -> st.SearchStrategy[AuditConfig]:
    """Whole audit configurations: the profile's guess rule, generated canaries, model and training, for
    the data-dependent designs (``multitask``, ``in_distribution``, ``mislabeled``) the ``data`` part, and
    for ``two_world`` the ``worlds`` part. The synthetic designs pool 1 to ``max_pooled_runs`` runs.

    ``architectures`` (from :data:`ARCHITECTURES`) are the models drawn: ``softmax_regression`` (hidden
    width 0), ``mlp`` (a hidden width in [``min_hidden_width``, ``max_hidden_width``]); a trainer that
    does only softmax regression passes ``architectures=("softmax_regression",)``. The data designs
    train an MLP whatever is allowed here, so they need ``mlp``.

    Pass a drawn configuration to the fixture as it is, ``dp_audit("my-dpsgd", config)``: the session
    sets its seed and level (see the module's example)."""
    check_int("min_hidden_width", min_hidden_width, low=1)
    check_int("max_pooled_runs", max_pooled_runs, low=1)
    _bounds("hidden_width", min_hidden_width, max_hidden_width)
    _subset("designs", designs, DESIGNS)
    _subset("architectures", architectures, ARCHITECTURES)
    needing_mlp = [design for design in designs if design in DATA_DESIGNS]
    if needing_mlp and "mlp" not in architectures:
        raise ValueError(
            f"the {', '.join(needing_mlp)} design(s) train an MLP, got architectures={architectures!r}; "
            "add 'mlp' to architectures or leave those designs out"
        )
    return _audit_configs(
        profile_config(profile).guess_rule,
        canaries if canaries is not None else canary_configs(),
        hyperparameters if hyperparameters is not None else dp_hyperparameters(),
        architectures,
        st.integers(min_hidden_width, max_hidden_width),
        max_pooled_runs,
        st.sampled_from(designs),
        data if data is not None else st.just(profile_config(profile, design="multitask").data),
        worlds if worlds is not None else two_world_configs(),
    )


@st.composite
def _audit_configs(
    draw, guess_rule, canaries, hyperparameters, architectures, hidden_widths, max_pooled_runs, design, data, worlds
) -> AuditConfig:
    design, canaries = draw(design), draw(canaries)
    synthetic = design in SYNTHETIC_DESIGNS
    allowed = ("mlp",) if design in DATA_DESIGNS else architectures
    hidden_width = 0 if draw(st.sampled_from(allowed)) == "softmax_regression" else draw(hidden_widths)
    return AuditConfig(
        canaries=canaries,
        architecture=MLPArchitecture(hidden_width=hidden_width),
        hyperparameters=draw(hyperparameters),
        design=design,
        guess_rule=guess_rule,
        data=draw(data),
        worlds=draw(worlds),
        pooled_runs=draw(st.integers(1, min(max_pooled_runs, canaries.m))) if synthetic else 1,
    )
