import warnings

import numpy as np
import pytest
from scipy import stats

from dpverify.canaries.synthetic import CanaryConfig, make_canaries


def draw(seed=0, **settings):
    return make_canaries(CanaryConfig(**settings), rng=np.random.default_rng(seed))


@pytest.mark.parametrize("mode", ["orthogonal", "gaussian"])
def test_shapes_dtypes_and_ranges(mode):
    canaries = draw(m=50, dimension=64, num_classes=7, mode=mode)
    assert canaries.features.shape == (50, 64) and canaries.features.dtype == np.float32
    assert canaries.labels.shape == canaries.comparison_labels.shape == (50,)
    assert canaries.labels.dtype == canaries.comparison_labels.dtype == np.int64
    assert canaries.labels.min() >= 0 and canaries.labels.max() < 7
    assert canaries.comparison_labels.min() >= 0 and canaries.comparison_labels.max() < 7
    assert np.all(canaries.labels != canaries.comparison_labels)


@pytest.mark.parametrize("mode", ["orthogonal", "gaussian"])
def test_same_seed_same_canaries_other_seed_other(mode):
    a, b, c = draw(3, mode=mode, m=20, dimension=30), draw(3, mode=mode, m=20, dimension=30), draw(4, mode=mode, m=20, dimension=30)
    assert np.array_equal(a.features, b.features) and np.array_equal(a.labels, b.labels)
    assert np.array_equal(a.comparison_labels, b.comparison_labels)
    assert not np.array_equal(a.features, c.features)


def test_orthogonal_rows_have_the_scale_as_norm_and_are_nearly_orthogonal_while_m_le_d():
    canaries = draw(m=200, dimension=1000, feature_scale=10.0)
    norms = np.linalg.norm(canaries.features.astype(np.float64), axis=1)
    np.testing.assert_allclose(norms, 10.0, rtol=1e-5)
    unit = canaries.features / norms[:, None]
    cosines = (unit @ unit.T)[np.triu_indices(200, 1)]
    # Random unit vectors in R^1000 have |cos| ~ 1/sqrt(1000) = 0.032; 6 standard deviations is ~0.19.
    assert np.abs(cosines).max() < 0.2


def test_gaussian_rows_have_norm_near_the_scale():
    canaries = draw(m=500, dimension=400, mode="gaussian", feature_scale=5.0)
    norms = np.linalg.norm(canaries.features, axis=1)
    assert abs(norms.mean() - 5.0) < 0.1


def test_orthogonal_with_more_canaries_than_dimensions_warns():
    with pytest.warns(UserWarning, match="m=20 > dimension=10"):
        draw(m=20, dimension=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw(m=10, dimension=10)
        draw(m=20, dimension=10, mode="gaussian")


def test_labels_uniform_and_comparison_labels_independent_of_features_and_exchangeable():
    """Property 1: (label, comparison label) uniform over ordered distinct pairs.

    Chi-square tests at level 1e-4 each, so this fails by chance with probability below 3e-4.
    """
    classes = 5
    canaries = draw(m=20000, dimension=4, mode="gaussian", num_classes=classes)
    pairs = np.zeros((classes, classes))
    np.add.at(pairs, (canaries.labels, canaries.comparison_labels), 1)
    off_diagonal = pairs[~np.eye(classes, dtype=bool)]
    assert stats.chisquare(off_diagonal).pvalue > 1e-4
    # Exchangeable: the pair table is symmetric in distribution (McNemar-style test over the class pairs).
    upper, lower = pairs[np.triu_indices(classes, 1)], pairs.T[np.triu_indices(classes, 1)]
    middle = (upper + lower) / 2
    symmetric = stats.chisquare(np.concatenate([upper, lower]), np.concatenate([middle, middle]), ddof=middle.size - 1)
    assert symmetric.pvalue > 1e-4
    # Comparison labels do not depend on the sign of the first feature.
    positive = canaries.features[:, 0] > 0
    table = np.array([np.bincount(canaries.comparison_labels[mask], minlength=classes) for mask in (positive, ~positive)])
    assert stats.chi2_contingency(table).pvalue > 1e-4


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(m=0), "m must be >= 1, got 0"),
        (dict(dimension=0), "dimension must be >= 1"),
        (dict(num_classes=1), "num_classes must be >= 2, got 1"),
        (dict(mode="uniform"), "mode must be one of"),
        (dict(feature_scale=0.0), r"feature_scale must be in \(0, inf\]"),
        (dict(feature_scale=float("nan")), "feature_scale must be a finite number"),
    ],
)
def test_bad_config_is_a_clear_value_error(settings, message):
    with pytest.raises(ValueError, match=message):
        CanaryConfig(**settings)
