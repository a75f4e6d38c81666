"""Opacus audited over Hypothesis-generated canary and hyperparameter configurations.

Runs only with --dp-audit. Each example is one audit; the plugin counts max_examples as this test's
audits when it divides the session's level.
"""

import pytest
from hypothesis import given

from dpverify.strategies import audit_configs, audit_settings, canary_configs, dp_hyperparameters

CONFIGS = audit_configs(
    canaries=canary_configs(min_m=200, max_m=500, min_dimension=500, max_dimension=500, min_classes=10, max_classes=50),
    hyperparameters=dp_hyperparameters(min_epsilon=1.0, max_epsilon=4.0, sampling_rates=(0.1, 0.2), min_epochs=2, max_epochs=5),
    min_hidden_width=100,
    max_hidden_width=300,
)


@audit_settings
@given(config=CONFIGS)
def test_opacus_ghost_keeps_its_claim_on_generated_configurations(dp_audit, config):
    pytest.importorskip("opacus", reason="needs pip install 'dpverify[opacus]'")
    result = dp_audit("opacus-ghost", config)
    assert result.verdict in ("pass", "undecided")
    assert result.m == config.canaries.m
