"""tf-privacy-fast-clipping: TF-Privacy's DP Keras model on its fast-clipping path, and white-box checks
that each variant changes that path in exactly the intended way, against a brute-force per-record
computation (each record's gradient by its own backward pass, clipped and averaged by hand).

Tests that need TF-Privacy skip with a reason when it is missing (``pip install 'dpverify[tf-privacy]'``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_tfprivacy_multitask import tagged_request
from tests.test_tfprivacy_plugin import implementation, tiny_request

CLIP, SIGMA = 0.05, 2.0


@pytest.fixture(scope="module")
def fast():
    pytest.importorskip("tensorflow_privacy", reason="needs TF-Privacy: pip install 'dpverify[tf-privacy]'")
    from dpverify_tfprivacy import _fast_clipping

    return _fast_clipping


def _model(fast, request, step, *, noise_multiplier, l2_norm_clip=CLIP):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(7)
    return fast.make_dp_model(
        request, step, noise_multiplier=noise_multiplier, l2_norm_clip=l2_norm_clip, learning_rate=1.0
    )


def _batch(fast, request):
    import tensorflow as tf

    return tf.constant(request.features), tf.constant(fast._keras.training_targets(request))


def _one_step(fast, request, step, **kwargs):
    """The update (new − old weights, flattened) of one ``train_step`` on the whole request, learning rate 1."""
    model = _model(fast, request, step, **kwargs)
    before = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    model.train_step(_batch(fast, request))
    after = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    return after - before


def _brute_force_rows(fast, request):
    """Each record's whole gradient (every variable, both heads with tags) by its own backward pass."""
    import tensorflow as tf

    model = _model(fast, request, "correct", noise_multiplier=0.0)
    loss = model.loss
    x, y = _batch(fast, request)
    rows = []
    for i in range(request.num_records):
        with tf.GradientTape() as tape:
            value = loss(y[i : i + 1], model(x[i : i + 1], training=True))
        grads = tape.gradient(value, model.trainable_variables)
        rows.append(np.concatenate([g.numpy().ravel() for g in grads]))
    return np.array(rows, dtype=np.float64)


def _clipped(rows, clip):
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, clip / norms)


EXPECTED_UPDATE = {  # minus the update of one noiseless step, from the per-record rows
    "correct": lambda rows: _clipped(rows, CLIP).mean(axis=0),
    "no_noise": lambda rows: _clipped(rows, CLIP).mean(axis=0),
    "noise_for_mean": lambda rows: _clipped(rows, CLIP).mean(axis=0),
    "no_clipping": lambda rows: rows.mean(axis=0),
    "batch_clipping": lambda rows: _clipped(rows.mean(axis=0, keepdims=True), CLIP)[0],
}


@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "tagged"])
@pytest.mark.parametrize("step", list(EXPECTED_UPDATE))
def test_noiseless_step_matches_brute_force_per_record_clipping(fast, step, tagged):
    request = tagged_request(m=10) if tagged else tiny_request(m=10)
    rows = _brute_force_rows(fast, request)
    norms = np.linalg.norm(rows, axis=1)
    assert norms.min() > 2 * CLIP  # every record's row is clipped by the correct step
    update = _one_step(fast, request, step, noise_multiplier=0.0)
    np.testing.assert_allclose(-update, EXPECTED_UPDATE[step](rows), rtol=2e-3, atol=1e-7)
    if step in ("correct", "noise_for_mean", "no_noise"):
        assert np.linalg.norm(update) <= CLIP * (1 + 1e-4)  # the mean of rows clipped to C
    if step == "no_clipping":
        assert np.linalg.norm(update) > 2 * CLIP


#: Noise on one step's update (learning rate 1), per coordinate, for a batch of B records.
NOISE_STD = {
    "correct": lambda b: SIGMA * CLIP / b,  # σC on the sum, divided by B
    "no_clipping": lambda b: SIGMA * CLIP / b,
    "batch_clipping": lambda b: SIGMA * CLIP,  # one microbatch: σC on the clipped mean, divided by 1
    "noise_for_mean": lambda b: SIGMA * CLIP / b**2,  # σC/B on the sum
    "no_noise": lambda b: 0.0,
}


@pytest.mark.parametrize("step", list(NOISE_STD))
def test_noise_of_each_step(fast, step):
    request = tiny_request(m=8, d=40, h=2000, C=5)  # about 92 000 coordinates
    noisy = _one_step(fast, request, step, noise_multiplier=SIGMA)
    clean = _one_step(fast, request, step, noise_multiplier=0.0)
    noise = noisy - clean  # same initialisation and batch: the difference is the noise alone
    expected = NOISE_STD[step](request.num_records)
    if expected == 0:
        assert np.abs(noise).max() < 1e-6
    else:
        # sample std of ~92 000 Gaussians: relative sd 0.23 %; 3 % is 13 sd
        assert np.std(noise) == pytest.approx(expected, rel=0.03)


def test_refuses_a_model_outside_the_registry(fast, monkeypatch):
    from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry

    monkeypatch.setitem(fast.FAST_STEPS, "empty_registry", fast.FastStep(registry=layer_registry.LayerRegistry))
    with pytest.raises(ValueError, match=r"\['Dense'\] are not registered"):
        _model(fast, tiny_request(), "empty_registry", noise_multiplier=1.0)
    with pytest.raises(ValueError, match="unknown fast-clipping step 'nope'"):
        _model(fast, tiny_request(), "nope", noise_multiplier=1.0)


def test_trains_tagged_requests_and_reports_the_steps(fast):
    request = tagged_request(seed=3, q=0.3, epochs=2)
    run = fast.train_mlp(request, "correct", 1.0)
    assert run.optimizer_steps == sum(1 for b in run.batch_sizes if b > 0)
    assert len(run.batch_sizes) == request.hyperparameters.steps
    tags = run.predict_tag_log_proba(request.features)
    assert tags.shape == (request.num_records, request.num_tags) and np.all(np.isfinite(tags))
    trained = implementation("tf-privacy-fast-clipping").train(request)
    np.testing.assert_array_equal(trained.predict_tag_log_proba(request.features), tags)  # seeded


def test_the_installed_dense_norm_of_a_sequence_is_exact_unless_a_finding_says_it_is_not(fast):
    """Against the installed TF-Privacy: its fast-clipping Dense norm of each record of a 3-D input, as the
    linear_3d design feeds it (equal positions, a small input, the bias' share dominant), against each record's
    own backward pass. 0.9.0 is exact; 0.8.12 states the bias part as Σ_t |g_t|² (its finding)."""
    import tensorflow as tf

    from dpverify_tfprivacy._releases import DENSE_BIAS_3D, installed_version

    records, positions = 3, 9
    inputs = tf.tile(tf.constant([[[0.125, 0.0]], [[0.0, 0.125]], [[0.125, 0.125]]]), [1, positions, 1])
    layer = tf.keras.layers.Dense(4)
    layer.build(inputs.shape)
    weights = tf.constant([1.0, -2.0, 0.5, 3.0])
    with tf.GradientTape() as tape:
        base_vars, outputs, sqr_norm_fn = fast.dense.dense_layer_computation(layer, (inputs,), {}, tape)
        total = tf.reduce_sum(outputs * weights)
    stated = sqr_norm_fn(tape.gradient(total, base_vars)).numpy()
    true = []
    for i in range(records):
        with tf.GradientTape() as own:
            loss = tf.reduce_sum(layer(inputs[i : i + 1]) * weights)
        true.append(sum(float(tf.reduce_sum(g**2)) for g in own.gradient(loss, layer.trainable_variables)))
    assert np.allclose(stated, true, rtol=1e-5) is (DENSE_BIAS_3D.at(installed_version()) is None)
