import pytest
from hypothesis import given, settings

from dpverify.config import AuditConfig
from dpverify.strategies import audit_configs, canary_configs, dp_hyperparameters, two_world_configs


@settings(max_examples=30, deadline=None)
@given(config=audit_configs(canaries=canary_configs(min_m=10, max_m=50), designs=("pair",)))
def test_generated_configs_are_valid_and_within_bounds(config):
    assert isinstance(config, AuditConfig)
    assert 10 <= config.canaries.m <= 50 and config.design == "pair"
    hp = config.hyperparameters
    assert 1.0 <= hp.target_epsilon <= 8.0 and hp.noise_multiplier is None
    assert hp.steps == hp.epochs * round(1 / hp.sampling_rate)
    assert 0.01 <= hp.max_grad_norm <= 100 and 0.1 <= hp.learning_rate * hp.max_grad_norm * (1 + 1e-12) <= 1.0 + 1e-12


@pytest.mark.parametrize("far", [lambda hp: hp.max_grad_norm < 0.05, lambda hp: hp.max_grad_norm > 20])
def test_the_clipping_norm_reaches_both_ends_of_its_decades(far):
    # A bug that shows only when C leaves 1 must be reachable: draws at both ends of [0.01, 100] exist.
    from hypothesis import find

    assert far(find(dp_hyperparameters(), far, settings=settings(max_examples=500, database=None)))


@settings(max_examples=30, deadline=None)
@given(config=audit_configs(designs=("two_world",), worlds=two_world_configs(max_runs=50, max_records=3)))
def test_two_world_configs_are_valid_and_within_bounds(config):
    assert config.design == "two_world" and config.relation == "add_remove"
    assert 10 <= config.audit_size == config.worlds.runs <= 50 and 1 <= config.worlds.records <= 3
    worlds = config.worlds.worlds()
    assert len(worlds.features_dprime) == len(worlds.features_d) + 1


@pytest.mark.parametrize(
    "factory, kwargs, message",
    [
        (canary_configs, dict(min_m=0), "min_m must be >= 1, got 0"),
        (canary_configs, dict(min_m=10, max_m=5), "min_m must be <= max_m, got 10 > 5"),
        (canary_configs, dict(modes=("spiral",)), "modes must be a non-empty subset"),
        (dp_hyperparameters, dict(min_epsilon=0.0), r"min_epsilon must be in \(0, inf\]"),
        (dp_hyperparameters, dict(sampling_rates=(1.5,)), r"sampling_rates must be in \(0, 1\], got 1.5"),
        (dp_hyperparameters, dict(min_epochs=4, max_epochs=2), "min_epochs must be <= max_epochs"),
        (dp_hyperparameters, dict(min_grad_norm=0.0), r"min_grad_norm must be in \(0, inf\]"),
        (audit_configs, dict(min_hidden_width=0), "min_hidden_width must be >= 1"),
        (two_world_configs, dict(min_runs=1), "min_runs must be >= 2, got 1"),
        (two_world_configs, dict(worlds=("flat",)), "worlds must be a non-empty subset"),
        (two_world_configs, dict(worlds=("microbatch",), max_records=1), "the microbatch world needs max_records >= 2, got 1"),
    ],
)
def test_bad_bounds_are_rejected_at_the_door(factory, kwargs, message):
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)
