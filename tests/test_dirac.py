"""The Dirac design: canaries that own an input coordinate, zero-initialised softmax regression, pooled
runs, and the profiles built from them."""

import dataclasses
import re

import numpy as np
import pytest

from dpverify.audits import run_audit
from dpverify.canaries.synthetic import CanaryConfig, make_canaries
from dpverify.config import DATA_DESIGNS, AuditConfig, profile_config
from dpverify.contract import DPHyperparameters, MLPArchitecture, TrainingRequest
from dpverify.registry import get_implementation
from tests.doubles import GaussianMechanism, Memoriser


def test_dirac_canaries_own_one_coordinate_each_at_the_feature_scale():
    canaries = make_canaries(CanaryConfig(m=30, dimension=40, mode="dirac", feature_scale=7.0), rng=np.random.default_rng(0))
    expected = np.zeros((30, 40), dtype=np.float32)
    expected[np.arange(30), np.arange(30)] = 7.0
    assert canaries.features.dtype == np.float32 and np.array_equal(canaries.features, expected)
    assert np.all(canaries.labels != canaries.comparison_labels)


def test_dirac_canaries_need_a_coordinate_each_and_the_dimension_follows_m():
    with pytest.raises(ValueError, match="dimension must be >= the canaries of a run, got dimension=10, 20 canaries per run; set dimension=20"):
        make_canaries(CanaryConfig(m=20, dimension=10, mode="dirac"), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="got dimension=10, 20 canaries per run"):
        profile_config("quick", m=39, pooled_runs=2, dimension=10)
    assert profile_config("quick", m=320, pooled_runs=1).canaries.dimension == 320
    assert profile_config("quick", m=320, pooled_runs=4).canaries.dimension == 80
    assert profile_config("quick", m=320, dimension=500).canaries.dimension == 500
    assert profile_config("mlp", m=321).canaries.dimension == 1000  # orthogonal canaries keep theirs


def request_for(architecture, **settings):
    rng = np.random.default_rng(0)
    return TrainingRequest(
        features=rng.standard_normal((6, 5)).astype(np.float32),
        labels=rng.integers(0, 3, 6),
        num_classes=3,
        architecture=architecture,
        hyperparameters=DPHyperparameters(noise_multiplier=1.0),
        **settings,
    )


def test_softmax_regression_is_one_zero_initialised_affine_layer_in_torch():
    import torch

    from dpverify.torch import build_mlp

    model = build_mlp(request_for(MLPArchitecture(hidden_width=0)))
    assert [type(layer) for layer in model] == [torch.nn.Linear]
    assert model[0].weight.shape == (3, 5)
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())


def test_softmax_regression_refuses_tags_and_the_data_designs():
    with pytest.raises(ValueError, match="tags need the shared encoder.*set hidden_width >= 1"):
        request_for(MLPArchitecture(hidden_width=0), tags=np.zeros((6, 1), dtype=np.int64), num_tags=2)
    with pytest.raises(ValueError, match="'multitask' design trains an MLP"):
        dataclasses.replace(profile_config("quick", pooled_runs=1), design="multitask")


@pytest.mark.parametrize("design", DATA_DESIGNS)
def test_each_profile_gives_the_data_designs_its_mlp_setting(design):
    for profile in ("quick", "standard"):
        assert profile_config(profile).architecture.is_softmax_regression
        assert profile_config(profile, design=design).architecture.hidden_width >= 1


def test_profiles_clip_at_norms_other_than_one_with_the_learning_rate_per_unit_of_c():
    for profile in ("quick", "standard", "gpu"):
        hp = profile_config(profile).hyperparameters
        assert hp.max_grad_norm != 1.0
        assert hp.learning_rate * hp.max_grad_norm == pytest.approx(1.0)


def small_dirac(**overrides):
    settings = dict(m=200, pooled_runs=1, epochs=2, epsilon=4.0, device="cpu", seed=3)
    return profile_config("quick", **{**settings, **overrides})


def test_pooled_runs_count_every_canary_and_refuse_designs_without_synthetic_canaries():
    config = small_dirac(m=600, pooled_runs=3)
    assert config.audit_size == 600 and config.canaries_per_run == (200, 200, 200) and config.canaries.dimension == 200
    uneven = small_dirac(m=7, pooled_runs=3)
    assert uneven.canaries_per_run == (3, 2, 2) and uneven.canaries.dimension == 3
    with pytest.raises(ValueError, match="pooled_runs must be"):
        small_dirac(pooled_runs=0)
    with pytest.raises(ValueError, match="m must be >= pooled_runs, got m=2, pooled_runs=3"):
        small_dirac(m=2, pooled_runs=3)
    with pytest.raises(ValueError, match="pools independent runs of synthetic canaries.*set pooled_runs=1"):
        profile_config("quick", design="mislabeled", pooled_runs=2)


def test_a_pooled_audit_is_its_runs_side_by_side_and_its_first_run_is_the_unpooled_audit():
    reference = get_implementation("reference-dpsgd")
    single = run_audit(reference, small_dirac())
    pooled = run_audit(reference, small_dirac(m=600, pooled_runs=3))
    assert pooled.verdict != "error" and pooled.m == 600 and pooled.scores.shape == (600,)
    np.testing.assert_array_equal(pooled.scores[:200], single.scores)
    np.testing.assert_array_equal(pooled.membership[:200], single.membership)
    # Each further run draws its own secret bits (and canary labels, hence scores).
    assert not np.array_equal(pooled.membership[200:400], pooled.membership[:200])
    assert not np.array_equal(pooled.scores[400:], pooled.scores[200:400])
    # The curve test treats each run on its own and combines them; the report says so.
    assert (single.curve_runs, pooled.curve_runs) == (1, 3) and pooled.to_dict()["curve_runs"] == 3
    assert "Fisher's combination over 3 independent runs" in pooled.summary()


class ClaimsDrift(GaussianMechanism):
    """Claims a larger ε on each run (each run the mechanism it claims, so no look refutes it before the
    claims differ): pooled runs that disagree on their claim."""

    def __init__(self) -> None:
        super().__init__(claimed_epsilon=2.0)
        self.runs = 0

    def train(self, request):
        self.runs += 1
        self.claimed_epsilon = float(1 + self.runs)
        return super().train(request)


def test_pooled_runs_that_claim_differently_are_an_error_naming_both_claims():
    result = run_audit(ClaimsDrift(), small_dirac(m=400, pooled_runs=2))
    assert result.verdict == "error"
    assert "pooled run 2 claimed" in result.error and "must make the same claim" in result.error


def test_plots_show_the_curve_test_beside_the_epsilon_delta_test(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib import pyplot
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dpverify.plots import save_audit_plots

    result = run_audit(Memoriser(claimed_epsilon=1.0), small_dirac(m=400))
    assert result.curve_refuted
    drawn, subplots = {}, pyplot.subplots

    def keeping_the_axes(*args, **kwargs):
        figure, drawn["axes"] = subplots(*args, **kwargs)
        return figure, drawn["axes"]

    monkeypatch.setattr(pyplot, "subplots", keeping_the_axes)
    assert save_audit_plots(result, tmp_path).exists()
    bounds = drawn["axes"][1]
    assert re.search(r"curve test refutes the claim, p = \d", bounds.get_title())
    figure = bounds.figure
    title = bounds.title.get_window_extent(FigureCanvasAgg(figure).get_renderer())
    assert figure.bbox.x0 <= title.x0 and title.x1 <= figure.bbox.x1  # the whole title is in the picture
    assert "curve test: ε of the weakest refuted member" in bounds.get_legend_handles_labels()[1]


def test_dirac_scores_carry_the_claimed_signal():
    """At q = 1 the claimed run is exactly μ-GDP: the members' scores should sit μ non-member standard
    deviations above the non-members'. With 2000 canaries the estimate's standard error is about 0.047 μ,
    so the band 0.85–1.15 (3.2 standard errors) fails a correct design on about 1 seed in 700, and
    catches canaries or a model that lose a sixth of the signal (random initialisation, canaries that
    interfere)."""
    import math

    mu = 1.0
    config = profile_config("quick", m=2000, pooled_runs=1, noise_multiplier=math.sqrt(10) / mu, device="cpu", seed=11)
    result = run_audit(get_implementation("reference-dpsgd"), config)
    members, others = result.scores[result.membership == 1], result.scores[result.membership == -1]
    separation = (members.mean() - others.mean()) / others.std()
    assert 0.85 < separation / mu < 1.15
