"""Hypothesis strategies for audit configurations, and a settings profile for expensive audits.

Every strategy takes keyword-only bounds (as ``hypothesis.extra.numpy`` does), validated at the door, so
a test can say "orthogonal canaries, m between 200 and 1000, ε between 1 and 4". Each example is a full
training run: use :data:`audit_settings` (no deadline, few examples, derandomized on CI) and declare the
number of examples as the test's audit count (the plugin reads ``max_examples``).
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dpverify._validation import check_int, check_real
from dpverify.canaries.synthetic import CANARY_MODES, CanaryConfig
from dpverify.config import DESIGNS, SYNTHETIC_DESIGNS, AuditConfig, profile_config
from dpverify.contract import DPHyperparameters, MLPArchitecture
from dpverify.canaries.tagged import DataAuditConfig
from dpverify.canaries.worlds import WORLD_KINDS, TwoWorldConfig

#: No deadline (an example trains a model), few examples, derandomized where ``CI`` is set.
audit_settings = settings(
    deadline=None,
    max_examples=3,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    print_blob=True,
)
settings.register_profile("dp-audit", audit_settings)


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
    """Canary configurations within the given bounds (inclusive)."""
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
    unknown = set(modes) - set(CANARY_MODES)
    if not modes or unknown:
        raise ValueError(f"modes must be a non-empty subset of {CANARY_MODES}, got {modes!r}")
    return _canary_configs(
        st.integers(min_m, max_m),
        (min_dimension, max_dimension),
        st.integers(min_classes, max_classes),
        st.sampled_from(modes),
        st.floats(min_feature_scale, max_feature_scale),
    )


@st.composite
def _canary_configs(draw, m, dimensions, num_classes, mode, feature_scale) -> CanaryConfig:
    """A Dirac canary owns a coordinate: its dimension is drawn from the bounds, but at least m."""
    m, mode = draw(m), draw(mode)
    low, high = dimensions
    if mode == "dirac":
        low, high = max(low, m), max(high, m)
    return CanaryConfig(
        m=m, dimension=draw(st.integers(low, high)), num_classes=draw(num_classes), mode=mode, feature_scale=draw(feature_scale)
    )


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
    unknown = set(trigger_modes) - set(CANARY_MODES)
    if not trigger_modes or unknown:
        raise ValueError(f"trigger_modes must be a non-empty subset of {CANARY_MODES}, got {trigger_modes!r}")

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
    worlds: tuple[str, ...] = WORLD_KINDS,
) -> st.SearchStrategy[TwoWorldConfig]:
    """The two-world design's part: a crafted world, runs per world, records in D (1 to ``max_records``:
    the tiny datasets where a size-reading normaliser shows; even for the microbatch world) and the
    model's outputs."""
    check_int("min_runs", min_runs, low=2)
    check_int("max_records", max_records, low=1)
    check_int("min_outputs", min_outputs, low=2)
    _bounds("runs", min_runs, max_runs)
    _bounds("outputs", min_outputs, max_outputs)
    unknown = set(worlds) - set(WORLD_KINDS)
    if not worlds or unknown:
        raise ValueError(f"worlds must be a non-empty subset of {WORLD_KINDS}, got {worlds!r}")
    if max_records < 2 and "microbatch" in worlds:  # the microbatch world cuts D into pairs
        if worlds == ("microbatch",):
            raise ValueError(f"the microbatch world needs max_records >= 2, got {max_records}")
        worlds = tuple(w for w in worlds if w != "microbatch")

    @st.composite
    def build(draw) -> TwoWorldConfig:
        world = draw(st.sampled_from(worlds))
        step = 2 if world == "microbatch" else 1
        return TwoWorldConfig(
            world=world,
            runs=draw(st.integers(min_runs, max_runs)),
            records=draw(st.integers(1, max_records // step)) * step,
            outputs=draw(st.integers(min_outputs, max_outputs)),
        )

    return build()


def audit_configs(
    *,
    profile: str = "quick",
    canaries: st.SearchStrategy[CanaryConfig] | None = None,
    hyperparameters: st.SearchStrategy[DPHyperparameters] | None = None,
    min_hidden_width: int = 100,
    max_hidden_width: int = 1000,
    max_pooled_runs: int = 2,
    designs: tuple[str, ...] = SYNTHETIC_DESIGNS,
    data: st.SearchStrategy[DataAuditConfig] | None = None,
    worlds: st.SearchStrategy[TwoWorldConfig] | None = None,
) -> st.SearchStrategy[AuditConfig]:
    """Whole audit configurations: the profile's guess rule, generated canaries, model and training, for
    the data-dependent designs (``multitask``, ``in_distribution``, ``mislabeled``) the ``data`` part, and
    for ``two_world`` the ``worlds`` part. The synthetic designs draw softmax regression (hidden width 0)
    as well as MLPs, and pool 1 to ``max_pooled_runs`` runs; the data designs need an MLP."""
    check_int("min_hidden_width", min_hidden_width, low=1)
    check_int("max_pooled_runs", max_pooled_runs, low=1)
    _bounds("hidden_width", min_hidden_width, max_hidden_width)
    unknown = set(designs) - set(DESIGNS)
    if not designs or unknown:
        raise ValueError(f"designs must be a non-empty subset of {DESIGNS}, got {designs!r}")
    return _audit_configs(
        profile_config(profile).guess_rule,
        canaries if canaries is not None else canary_configs(),
        hyperparameters if hyperparameters is not None else dp_hyperparameters(),
        st.integers(min_hidden_width, max_hidden_width),
        max_pooled_runs,
        st.sampled_from(designs),
        data if data is not None else st.just(profile_config(profile, design="multitask").data),
        worlds if worlds is not None else two_world_configs(),
    )


@st.composite
def _audit_configs(draw, guess_rule, canaries, hyperparameters, hidden_widths, max_pooled_runs, design, data, worlds) -> AuditConfig:
    design, canaries = draw(design), draw(canaries)
    synthetic = design in SYNTHETIC_DESIGNS
    hidden_width = draw(st.one_of(st.just(0), hidden_widths) if synthetic else hidden_widths)
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
