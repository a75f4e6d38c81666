"""The TF-Privacy plugin: its claim, calibration, input pipeline, black box, and white-box checks that each
buggy variant changes TF-Privacy's real DP step in exactly the intended way.

Tests that need TF-Privacy skip with a reason when it is missing (``pip install 'dpverify[tf-privacy]'``).
Everything trains tiny models; the statistical checks state their tolerance and error rate.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import dpverify_tfprivacy
from dpverify.contract import DPHyperparameters, MLPArchitecture, TrainingRequest
from dpverify.seeds import seeds_for
from dpverify_tfprivacy._sampling import poisson_batches, shuffled_batches
from tests.updates import applied_batches, dirac_request, observed

NAMES = (
    "tf-privacy-keras",
    "tf-privacy-fast-clipping",
    "tf-privacy-no-noise",
    "tf-privacy-no-clipping",
    "tf-privacy-noise-for-mean",
    "tf-privacy-fast-clipping-no-noise",
    "tf-privacy-fast-clipping-no-clipping",
    "tf-privacy-fast-clipping-noise-for-mean",
    "tf-privacy-fast-clipping-batch-clipping",
    "tf-privacy-realised-batch-norm",
    "tf-privacy-fast-clipping-embedding-norm",
    "tf-privacy-fast-clipping-linear-bias-norm",
    "tf-privacy-fast-clipping-layer-norm-norm",
    "tf-privacy-keras-fixed-batches",
)
#: DP-FTRL's path and its variants (tests/test_tfprivacy_ftrl.py), listed after the DP-SGD ones.
FTRL_NAMES = ("tf-privacy-ftrl", "tf-privacy-ftrl-no-restart", "tf-privacy-ftrl-one-epoch-noise")
BUG_OF = (
    {name: bug for bug, name in enumerate(NAMES[2:5], start=1)}
    | {name: bug for bug, name in enumerate(NAMES[5:9], start=1)}
    | {"tf-privacy-realised-batch-norm": 7}
)
STEP_OF = {
    "tf-privacy-keras": "correct",
    "tf-privacy-no-noise": "no_noise",
    "tf-privacy-no-clipping": "no_clipping",
    "tf-privacy-noise-for-mean": "noise_for_mean",
}
# The RDP orders TF-Privacy's compute_dp_sgd_privacy and compute_noise use.
TF_PRIVACY_ORDERS = [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5] + list(range(5, 64)) + [128, 256, 512]


@pytest.fixture(scope="module")
def tf_privacy():
    return pytest.importorskip("tensorflow_privacy", reason="needs TF-Privacy: pip install 'dpverify[tf-privacy]'")


@pytest.fixture(scope="module")
def keras_module(tf_privacy):
    from dpverify_tfprivacy import _keras

    return _keras


def implementation(name):
    (found,) = [i for i in dpverify_tfprivacy.implementations() if i.info.name == name]
    return found


def tiny_request(seed=0, *, m=48, d=12, h=16, C=5, q=0.25, epochs=1, device="cpu", **hyper):
    rng = np.random.default_rng(1234)
    features = rng.standard_normal((m, d)).astype(np.float32)
    labels = rng.integers(0, C, m).astype(np.int64)
    hyper.setdefault("noise_multiplier", None if "target_epsilon" in hyper else 1.0)
    return TrainingRequest(
        features=features,
        labels=labels,
        num_classes=C,
        architecture=MLPArchitecture(hidden_width=h),
        hyperparameters=DPHyperparameters(sampling_rate=q, epochs=epochs, **hyper),
        seed=seed,
        device=device,
    )


# --- listing and info (no tensorflow needed) -------------------------------------------------------------


def test_listing_does_not_import_tensorflow():
    code = (
        "import sys, dpverify_tfprivacy as p; names = [i.info.name for i in p.implementations()]; "
        "assert 'tensorflow' not in sys.modules and 'tensorflow_privacy' not in sys.modules, 'imported TF'; "
        "print(','.join(names))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split(",") == list(NAMES + FTRL_NAMES)


def test_infos():
    infos = {i.info.name: i.info for i in dpverify_tfprivacy.implementations()}
    assert tuple(infos) == NAMES + FTRL_NAMES
    for info in (infos[name] for name in NAMES):
        assert info.library == "tensorflow-privacy"
        assert info.requires == ("tensorflow", "tensorflow_privacy")
        assert info.extra == "tf-privacy"
        if info.layers and info.expected == "violation":  # a layer design's norm variant (tests/test_layers.py)
            continue
        assert "Poisson" in info.notes
        assert "realised batch size" in info.notes or info.name == "tf-privacy-keras-fixed-batches"
    for name in NAMES[:2]:
        assert infos[name].expected == "private" and infos[name].bug is None
    for name, bug in BUG_OF.items():
        assert infos[name].expected == "violation"
        assert infos[name].bug == bug and infos[name].breaks
        assert infos[name].detectability == ("D3" if bug in (4, 7) else "D1")
    assert {implementation(name).path for name in NAMES if "fast-clipping" in name} == {"fast_clipping"}
    fixed = infos["tf-privacy-keras-fixed-batches"]
    assert fixed.expected == "known-issue" and not fixed.designated_normaliser
    assert fixed.issue.endswith("tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_lib.py")


@pytest.mark.parametrize("name", ["tf-privacy-keras", "tf-privacy-fast-clipping"])
def test_the_correct_paths_divide_by_the_designated_normaliser_and_the_row_7_variant_by_the_batch(name, tf_privacy):
    """Without noise at q = 1, one step on 3 records: TF-Privacy divides the clipped sum by the batch (3);
    the correct paths rescale the step so the update is the sum over the designated normaliser (2), the
    variant leaves it over 3. The updates of zero-initialised softmax regression then differ by 3/2."""
    request = tiny_request(m=3, h=0, q=1.0, noise_multiplier=0.0, learning_rate=0.1, expected_batch_size=2.0)
    probe = request.features
    correct = implementation(name).train(request).predict_log_proba(probe)
    realised = implementation("tf-privacy-realised-batch-norm").train(request).predict_log_proba(probe)
    # log-softmax of logits z: the logits' spread scales with the update; compare centred logits.
    centred = [lp - lp.mean(axis=1, keepdims=True) for lp in (correct, realised)]
    np.testing.assert_allclose(centred[0], 1.5 * centred[1], rtol=1e-4, atol=1e-6)


def test_poisson_batches_have_variable_sizes_with_mean_qN():
    n, q, steps = 2000, 0.1, 400
    sizes = np.array([b.size for b in poisson_batches(n, q, steps, seed=7)])
    assert sizes.size == steps
    assert len(np.unique(sizes)) > 10  # variable batch sizes, not fixed ones
    # mean of 400 Binomial(2000, 0.1) sizes: sd 0.67; 4 is 6 sd (error rate < 1e-8)
    assert abs(sizes.mean() - q * n) < 4
    assert 0.8 < sizes.std() / math.sqrt(n * q * (1 - q)) < 1.2
    again = [b for b in poisson_batches(n, q, steps, seed=7)]
    assert all(np.array_equal(a, b) for a, b in zip(again, poisson_batches(n, q, steps, seed=7)))
    assert all(b.dtype == np.int32 and np.all(np.diff(b) > 0) for b in again)


# --- claim and calibration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma, q, steps, delta",
    [(1.0, 0.1, 200, 1e-5), (0.7, 0.07, 143, 1e-6), (2.5, 0.013, 1000, 1e-5), (1.3, 1 / 3, 7, 1e-3)],
)
def test_claim_is_tf_privacy_accountant(tf_privacy, sigma, q, steps, delta):
    import dp_accounting

    from dpverify_tfprivacy import _accounting

    accountant = dp_accounting.rdp.RdpAccountant(TF_PRIVACY_ORDERS)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    claim = _accounting.claim(sigma, q, steps, delta)
    assert claim.epsilon == pytest.approx(accountant.get_epsilon(delta), rel=1e-12)
    assert (claim.noise_multiplier, claim.sampling_rate, claim.steps, claim.delta) == (sigma, q, steps, delta)
    assert claim.relation == "add_remove"
    # one step more would be a different (larger) claim: the step count is exact
    assert _accounting.tf_privacy_epsilon(sigma, q, steps + 1, delta) > claim.epsilon


def test_zero_noise_claims_infinity(tf_privacy):
    from dpverify_tfprivacy import _accounting

    assert _accounting.claim(0.0, 0.1, 20, 1e-5).epsilon == math.inf


@pytest.mark.parametrize("target, q, steps", [(1.0, 0.1, 200), (8.0, 0.05, 60), (300.0, 0.1, 10)])
def test_calibration_within_one_percent(tf_privacy, target, q, steps):
    from dpverify_tfprivacy import _accounting

    sigma = _accounting.calibrate_noise_multiplier(target, q, steps, 1e-5)
    assert _accounting.tf_privacy_epsilon(sigma, q, steps, 1e-5) == pytest.approx(target, rel=0.01)


def test_trained_claims_are_tf_privacys_and_variants_keep_them(tf_privacy):
    from dpverify_tfprivacy import _accounting

    request = tiny_request(target_epsilon=3.0, epochs=2)
    hp = request.hyperparameters
    sigma = _accounting.calibrate_noise_multiplier(3.0, hp.sampling_rate, hp.steps, hp.delta)
    expected = _accounting.claim(sigma, hp.sampling_rate, hp.steps, hp.delta)
    for name in NAMES:
        trained = implementation(name).train(request)
        assert trained.claim == expected, name
        assert trained.claim.epsilon == pytest.approx(3.0, rel=0.01)


# --- training and the black box --------------------------------------------------------------------------


def test_black_box_shape_dtype_and_determinism(tf_privacy):
    impl = implementation("tf-privacy-keras")
    request = tiny_request(seed=5)
    first = impl.train(request)
    out = first.predict_log_proba(request.features)
    assert out.shape == (request.num_records, request.num_classes) and out.dtype == np.float64
    assert np.all(np.isfinite(out)) and np.allclose(np.exp(out).sum(axis=1), 1.0)
    assert first.device == "cpu"
    np.testing.assert_array_equal(impl.train(tiny_request(seed=5)).predict_log_proba(request.features), out)
    assert not np.allclose(impl.train(tiny_request(seed=6)).predict_log_proba(request.features), out)
    # batched prediction agrees with a one-shot call, and the empty input is fine
    assert first.predict_log_proba(request.features[:0]).shape == (0, request.num_classes)
    np.testing.assert_allclose(first.predict_log_proba(request.features[:7]), out[:7], rtol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        first.predict_log_proba(request.features[:, :3])


def test_run_takes_exactly_the_requested_poisson_steps(keras_module):
    request = tiny_request(seed=2, m=40, q=0.1, epochs=3)  # 30 steps; P(empty batch) = 0.9^40 ≈ 1.5 %
    run = keras_module.train_mlp(request, "correct", 1.0)
    hp = request.hyperparameters
    expected = [b.size for b in poisson_batches(40, hp.sampling_rate, hp.steps, seeds_for(2).sampling)]
    assert list(run.batch_sizes) == expected and len(expected) == hp.steps == 30
    assert len(set(expected)) > 1
    assert run.optimizer_steps == sum(1 for b in expected if b > 0)


def test_cuda_request_reports_where_it_ran(keras_module):
    import tensorflow as tf

    run = keras_module.train_mlp(tiny_request(device="cuda"), "correct", 1.0)
    assert run.device == ("cuda" if tf.config.list_physical_devices("GPU") else "cpu")


def test_divergence_is_an_error_naming_the_implementation(tf_privacy):
    with pytest.raises(RuntimeError, match="tf-privacy-keras: training diverged"):
        implementation("tf-privacy-keras").train(tiny_request(learning_rate=1e38, epochs=2))


# --- white box: each variant changes TF-Privacy's step in exactly the intended way -------------------------

CLIP, SIGMA = 2.0, 1.5


def one_step_update(keras_module, step, per_example_grads, *, noise_multiplier):
    """Apply one DP step with learning rate 1 to a zero variable v, with per-example loss <g_i, v> so that
    record i's gradient is g_i; return the update, i.e. minus (noisy sum of clipped rows) / B."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(11)
    grads = tf.constant(np.asarray(per_example_grads, dtype=np.float32))
    variable = tf.Variable(tf.zeros(grads.shape[1]))
    optimizer = keras_module.make_dp_optimizer(
        step, l2_norm_clip=CLIP, noise_multiplier=noise_multiplier, learning_rate=1.0
    )
    with tf.GradientTape() as tape:
        loss = tf.linalg.matvec(grads, variable)
    optimizer.minimize(loss, [variable], tape=tape)
    return variable.numpy().astype(np.float64)


NOISE_FACTOR = {"correct": 1.0, "no_noise": 0.0, "no_clipping": 1.0, "noise_for_mean": None}  # None: 1/B


@pytest.mark.parametrize("step", list(NOISE_FACTOR))
def test_noise_on_the_sum_of_a_zero_gradient_step(keras_module, step):
    batch, dim = 4, 100_000
    update = one_step_update(keras_module, step, np.zeros((batch, dim)), noise_multiplier=SIGMA)
    measured = np.std(update * batch)  # the noise on the sum (TF-Privacy divides the noisy sum by B)
    factor = NOISE_FACTOR[step] if NOISE_FACTOR[step] is not None else 1.0 / batch
    intended = SIGMA * CLIP * factor
    if intended == 0:
        assert measured == 0.0
    else:
        # sample std of 100 000 Gaussians: relative sd 0.22 %; 2 % is 9 sd (error rate < 1e-18)
        assert measured == pytest.approx(intended, rel=0.02)
        assert abs(np.mean(update * batch)) < 5 * intended / math.sqrt(dim)


@pytest.mark.parametrize("step", list(NOISE_FACTOR))
def test_rows_are_clipped_except_in_the_no_clipping_variant(keras_module, step):
    # record 0: norm 10 C along e0; record 1: norm C/2 along e1; no noise, so the update is exact
    grads = np.zeros((2, 3))
    grads[0, 0], grads[1, 1] = 10 * CLIP, 0.5 * CLIP
    update = one_step_update(keras_module, step, grads, noise_multiplier=0.0)
    big_row = 10 * CLIP if step == "no_clipping" else CLIP  # only the bug lets a row exceed C
    np.testing.assert_allclose(-update * 2, [big_row, 0.5 * CLIP, 0.0], rtol=1e-6)  # divided by B = 2


# --- the per-record Jacobian handed to the optimizer is the stock Jacobian ---------------------------------


def _model_and_batch(keras_module, request):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(3)
    model = keras_module.build_mlp(request)
    loss = keras_module.per_example_loss(request)
    x = tf.constant(request.features)
    y = tf.constant(keras_module.training_targets(request))
    return model, (lambda xs, ys: loss(ys, model(xs, training=True))), x, y


def test_per_record_jacobian_equals_the_stock_jacobian(keras_module):
    import tensorflow as tf

    model, record_loss, x, y = _model_and_batch(keras_module, tiny_request(m=9))
    stock = tf.GradientTape(persistent=True)
    fast = keras_module.PerRecordJacobianTape(record_loss, (x, y))
    for tape in (stock, fast):
        with tape:
            losses = record_loss(x, y)
        rows = tape.jacobian(losses, model.trainable_variables, unconnected_gradients="zero")
        if tape is stock:
            expected = [r.numpy() for r in rows]
    assert [r.shape for r in rows] == [(9, *v.shape) for v in model.trainable_variables]
    for got, want in zip(rows, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert max(np.abs(w).max() for w in expected) > 0.01  # the rows are not trivially zero
    with pytest.raises(ValueError, match="one loss per record"):
        fast.jacobian(tf.reduce_sum(losses), model.trainable_variables)


@pytest.mark.parametrize("step", ["correct", "no_clipping", "noise_for_mean"])
def test_dp_step_with_per_record_rows_equals_the_stock_step(keras_module, step):
    """Without noise the step is deterministic: the stock tape and the per-record tape give the same update,
    with clipping active (C is far below the rows' norms)."""
    import tensorflow as tf

    request = tiny_request(m=7)
    updates = []
    for use_fast in (False, True):
        model, record_loss, x, y = _model_and_batch(keras_module, request)
        before = [v.numpy() for v in model.trainable_variables]
        optimizer = keras_module.make_dp_optimizer(step, l2_norm_clip=0.05, noise_multiplier=0.0, learning_rate=1.0)
        tape = keras_module.PerRecordJacobianTape(record_loss, (x, y)) if use_fast else tf.GradientTape()
        with tape:
            loss = record_loss(x, y)
        optimizer.minimize(loss, model.trainable_variables, tape=tape)
        updates.append([v.numpy() - b for v, b in zip(model.trainable_variables, before)])
    for fast, stock in zip(updates[1], updates[0]):
        np.testing.assert_allclose(fast, stock, rtol=1e-4, atol=1e-7)
    norm = math.sqrt(sum(float(np.sum(u**2)) for u in updates[0]))
    assert norm > 1e-3
    if step != "no_clipping":
        assert norm <= 0.05 + 1e-6  # the mean of rows clipped to C has norm at most C


# --- importing TensorFlow through the plugin ----------------------------------------------------------------

FACTORY_LINE = (
    "2026-11-26 06:27:53.333702: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to "
    "register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered\n"
)


def test_only_the_duplicate_factory_lines_are_dropped(tf_privacy):
    from dpverify_tfprivacy._tf import without_duplicate_factory_lines

    other_error = "2026-11-26 06:27:53.4: E tensorflow/core/foo.cc:1] Could not load dynamic library 'libcudart'\n"
    text = FACTORY_LINE + other_error + FACTORY_LINE.replace("cuDNN", "cuBLAS") + "Traceback (most recent call last):\n"
    assert without_duplicate_factory_lines(text) == other_error + "Traceback (most recent call last):\n"


def test_plugin_import_prints_no_factory_lines_and_keeps_stderr(tf_privacy):
    code = (
        "import sys; import dpverify_tfprivacy._keras, dpverify_tfprivacy._accounting; "
        "print('still here', file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Unable to register" not in out.stderr
    assert "still here" in out.stderr


AUTOGRAPH_STEP = """
import os
import sys

from dpverify_tfprivacy._tf import tf


@tf.function
def step(x):  # as TF-Privacy's fast-clipping registry traces os.path.commonprefix
    os.path.commonprefix(["ab", "ac"])
    return x


step(tf.constant(1.0))
print("still here", file=sys.stderr)
"""


def test_autograph_says_nothing_of_the_frozen_standard_library(tf_privacy, tmp_path):
    """Python 3.11 freezes genericpath, so AutoGraph cannot read commonprefix's source and warned on each trace
    (the step is a file: AutoGraph converts only functions whose source it can read)."""
    (tmp_path / "step.py").write_text(AUTOGRAPH_STEP)
    out = subprocess.run([sys.executable, str(tmp_path / "step.py")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "could not transform" not in out.stderr
    assert "still here" in out.stderr


def test_only_autographs_warnings_about_frozen_functions_are_dropped(tf_privacy):
    import logging
    import os

    from dpverify_tfprivacy._tf import is_frozen_function_warning

    def record(msg, *args):
        return logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, msg, args, None)

    template = "AutoGraph could not transform %s and will run it as-is.\n%sCause: %s\n"
    assert is_frozen_function_warning(record(template, os.path.commonprefix, "", "no source"))
    assert not is_frozen_function_warning(record(template, record, "", "no source"))  # a function in a file
    assert not is_frozen_function_warning(record("Some other warning about %s", os.path.commonprefix))


# --- every released update ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tf-privacy-keras", "tf-privacy-fast-clipping", "tf-privacy-keras-fixed-batches"])
def test_every_update_is_handed_over_and_is_the_dp_step_on_its_batch(name, tf_privacy):
    """Softmax regression on 4 Dirac records, q = 1/4, 2 epochs, σ = 0: the observer gets steps 0..8 as
    [(C, d), (C,)], and each difference is exactly −lr · the clipped gradients of the step's batch over the
    normaliser (qN = 1 for Poisson batches, B = 1 for fixed ones), the batch being the sampler's."""
    request, handed = observed(dirac_request())
    implementation(name).train(request)
    hp, seeds = request.hyperparameters, seeds_for(request.seed)
    if name.endswith("fixed-batches"):
        expected = shuffled_batches(request.num_records, 1, hp.steps, seeds.sampling)
    else:
        expected = poisson_batches(request.num_records, hp.sampling_rate, hp.steps, seeds.sampling)
    batches = applied_batches(request, handed, normaliser=1.0)
    assert [b.tolist() for b in batches] == [sorted(b.tolist()) for b in expected]


def test_fixed_batches_are_the_tutorials_shuffled_batches_with_a_short_last_one(tf_privacy):
    """N = 5 at q = 1/2: B = round(2.5) = 2 and each epoch is a random order cut into 2, 2, 1 records; the
    run takes exactly the request's 6 steps, the claim is TF-Privacy's Poisson account at q = B/N = 0.4."""
    request, handed = observed(dirac_request(records=5, sampling_rate=0.5, epochs=3))
    trained = implementation("tf-privacy-keras-fixed-batches").train(request)
    batches = list(shuffled_batches(5, 2, 6, seeds_for(request.seed).sampling))
    assert [b.size for b in batches] == [2, 2, 1, 2, 2, 1]
    assert sorted(np.concatenate(batches[:3]).tolist()) == sorted(np.concatenate(batches[3:]).tolist()) == [0, 1, 2, 3, 4]
    moved = [np.flatnonzero(np.any(b[0] != a[0], axis=0)).tolist() for (_, a), (_, b) in zip(handed, handed[1:])]
    assert moved == [sorted(b.tolist()) for b in batches]
    assert trained.claim.sampling_rate == 0.4 and trained.claim.steps == 6
    assert trained.claim.epsilon == float("inf")  # σ = 0


def test_no_observer_no_hand_over(keras_module):
    """Without an observer the run is the same run (the hand-over reads weights, it changes nothing)."""
    request, handed = observed(dirac_request(noise_multiplier=1.0))
    with_observer = keras_module.train_mlp(request, "correct", 1.0).weights
    without = keras_module.train_mlp(dirac_request(noise_multiplier=1.0), "correct", 1.0).weights
    assert len(handed) == request.hyperparameters.steps + 1
    for a, b in zip(with_observer, without):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(handed[-1][1][0], with_observer[0].T)


def test_at_q_1_the_fixed_batch_is_the_full_batch(tf_privacy):
    """The one-run audits' q = 1: B = N, every step applies every record's clipped gradient over N, and the
    claim is TF-Privacy's account at q = 1."""
    request, handed = observed(dirac_request(records=30, sampling_rate=1.0, epochs=2))
    trained = implementation("tf-privacy-keras-fixed-batches").train(request)
    assert [b.size for b in applied_batches(request, handed, normaliser=30.0)] == [30, 30]
    assert (trained.claim.sampling_rate, trained.claim.steps) == (1.0, 2)
