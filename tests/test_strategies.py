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


@settings(max_examples=30, deadline=None)
@given(config=audit_configs(architectures=("softmax_regression",), designs=("inclusion", "pair", "two_world")))
def test_a_softmax_only_trainer_gets_only_softmax_regression(config):
    assert config.architecture.is_softmax_regression


@settings(max_examples=30, deadline=None)
@given(config=audit_configs(architectures=("mlp",), min_hidden_width=5, max_hidden_width=9))
def test_an_mlp_only_draw_keeps_its_hidden_widths(config):
    assert 5 <= config.architecture.hidden_width <= 9


# Bounds where m > dimension is most of the box: the dependent draw must still keep orthogonal and Dirac
# canaries within their dimension. Drawing and building canaries only (no training): 100 examples in about a second.
@settings(max_examples=100, deadline=None, database=None)
@given(config=audit_configs(canaries=canary_configs(min_m=5, max_m=80, min_dimension=2, max_dimension=30), max_pooled_runs=3))
def test_no_drawn_configuration_trips_a_dpverify_warning(config):
    import warnings

    import numpy as np

    from dpverify.canaries.synthetic import make_canaries

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_canaries(config.canaries, rng=np.random.default_rng(0))


def test_every_mode_is_still_drawn_with_room_to_spare():
    from hypothesis import find

    strategy = canary_configs(min_m=5, max_m=80, min_dimension=2, max_dimension=30)
    for mode in ("orthogonal", "dirac"):
        drawn = find(strategy, lambda c, mode=mode: c.mode == mode, settings=settings(database=None))
        assert drawn.m <= drawn.dimension <= 30
    assert find(strategy, lambda c: c.m > 30, settings=settings(database=None)).mode == "gaussian"


def test_audit_settings_skip_shrinking_and_stay_a_profile_a_user_can_extend():
    from hypothesis import Phase

    from dpverify.strategies import audit_settings

    assert Phase.shrink not in audit_settings.phases and Phase.generate in audit_settings.phases
    assert settings.get_profile("dp-audit").phases == audit_settings.phases
    settings.register_profile("my-audits", parent=settings.get_profile("dp-audit"), max_examples=5)
    mine = settings.get_profile("my-audits")
    assert mine.max_examples == 5 and mine.phases == audit_settings.phases and mine.deadline is None
    previous = settings._current_profile
    settings.load_profile("my-audits")
    try:
        assert settings.default.max_examples == 5 and Phase.shrink not in settings.default.phases
    finally:
        settings.load_profile(previous)


HYPOTHESIS_PROJECT = f"""
import sys
sys.path.insert(0, {str(__import__('pathlib').Path(__file__).resolve().parents[1])!r})
from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import Memoriser

register_implementation(Memoriser(claimed_epsilon=1.0, info=ImplementationInfo(name="leaky", library="numpy")))
"""

HYPOTHESIS_TEST = """
from hypothesis import given, settings
from dpverify.strategies import audit_configs, audit_settings, canary_configs, dp_hyperparameters

CONFIGS = audit_configs(
    architectures=("softmax_regression",),
    designs=("inclusion",),
    canaries=canary_configs(min_m=300, max_m=400, min_dimension=400, max_dimension=400, modes=("dirac",)),
    hyperparameters=dp_hyperparameters(sampling_rates=(1.0,), min_epochs=1, max_epochs=2),
)

@settings(audit_settings, max_examples=4, database=None)  # no examples saved by earlier runs
@given(config=CONFIGS)
def test_leaky_keeps_its_claim(dp_audit, config):
    dp_audit("leaky", config)
"""


def test_a_failing_audit_test_costs_one_replay_not_a_shrink_and_reports_how_to_reproduce(pytester):
    import json

    pytester.makeconftest(HYPOTHESIS_PROJECT)
    pytester.makepyfile(test_leaky=HYPOTHESIS_TEST)
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--dp-audit", "--dp-audit-seed=3", "--dp-audit-implementations=none", f"--dp-audit-report={report}"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Failing test case: test_leaky_keeps_its_claim(*", "*@reproduce_failure(*"])
    # The first example fails; Hypothesis replays it once to report it. Shrinking would have run dozens.
    assert len(json.loads(report.read_text())["audits"]) == 2
