"""Hypothesis strategies for audit configurations, and a settings profile for expensive audits.

Every strategy takes keyword-only bounds (as ``hypothesis.extra.numpy`` does), validated at the door, so
a test can say "orthogonal canaries, m between 200 and 1000, ε between 1 and 4". Each example is a full
training run: use :data:`audit_settings` (no deadline, few examples, derandomized on CI) and declare the
number of examples as the test's audit count (the plugin reads ``max_examples``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dpverify._validation import check_int, check_real
from dpverify.canaries import CANARY_MODES, CanaryConfig
from dpverify.config import AuditConfig, profile_config
from dpverify.contract import DPHyperparameters, MLPArchitecture

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
    return st.builds(
        CanaryConfig,
        m=st.integers(min_m, max_m),
        dimension=st.integers(min_dimension, max_dimension),
        num_classes=st.integers(min_classes, max_classes),
        mode=st.sampled_from(modes),
        feature_scale=st.floats(min_feature_scale, max_feature_scale),
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
    max_grad_norms: tuple[float, ...] = (0.5, 1.0, 2.0),
    delta: float = 1e-5,
) -> st.SearchStrategy[DPHyperparameters]:
    """DP-SGD hyperparameters with a target ε the implementation calibrates to."""
    check_real("min_epsilon", min_epsilon, low=0.0, low_open=True)
    check_int("min_epochs", min_epochs, low=1)
    check_real("min_learning_rate", min_learning_rate, low=0.0, low_open=True)
    _bounds("epsilon", min_epsilon, max_epsilon)
    _bounds("epochs", min_epochs, max_epochs)
    _bounds("learning_rate", min_learning_rate, max_learning_rate)
    for rate in sampling_rates:
        check_real("sampling_rates", rate, low=0.0, high=1.0, low_open=True)
    for norm in max_grad_norms:
        check_real("max_grad_norms", norm, low=0.0, low_open=True)
    return st.builds(
        DPHyperparameters,
        target_epsilon=st.floats(min_epsilon, max_epsilon),
        sampling_rate=st.sampled_from(sampling_rates),
        epochs=st.integers(min_epochs, max_epochs),
        learning_rate=st.floats(min_learning_rate, max_learning_rate),
        max_grad_norm=st.sampled_from(max_grad_norms),
        delta=st.just(delta),
    )


def audit_configs(
    *,
    profile: str = "quick",
    canaries: st.SearchStrategy[CanaryConfig] | None = None,
    hyperparameters: st.SearchStrategy[DPHyperparameters] | None = None,
    min_hidden_width: int = 100,
    max_hidden_width: int = 1000,
    designs: tuple[str, ...] = ("inclusion", "pair"),
) -> st.SearchStrategy[AuditConfig]:
    """Whole audit configurations: the profile's guess rule, generated canaries, model and training."""
    check_int("min_hidden_width", min_hidden_width, low=1)
    _bounds("hidden_width", min_hidden_width, max_hidden_width)
    base = profile_config(profile)
    return st.builds(
        AuditConfig,
        canaries=canaries if canaries is not None else canary_configs(),
        architecture=st.builds(MLPArchitecture, hidden_width=st.integers(min_hidden_width, max_hidden_width)),
        hyperparameters=hyperparameters if hyperparameters is not None else dp_hyperparameters(),
        design=st.sampled_from(designs),
        guess_rule=st.just(base.guess_rule),
    )
