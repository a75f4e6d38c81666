"""TF-Privacy's DP steps, traced once per configuration and reused by every run of it
(:mod:`dpverify_tfprivacy._reuse`): a run's result is a function of its request and seed alone (design
rule 7), whatever ran before it in the process, its noise has the intended scale, the variants never share
a trace, and the cache stays bounded.

Tests that need TF-Privacy skip with a reason when it is missing (``pip install 'dpverify[tf-privacy]'``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpverify.contract import DPHyperparameters, MLPArchitecture, TrainingRequest
from tests.test_tfprivacy_plugin import NAMES, implementation

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reuse():
    pytest.importorskip("tensorflow_privacy", reason="needs TF-Privacy: pip install 'dpverify[tf-privacy]'")
    from dpverify_tfprivacy import _reuse

    return _reuse


def world_request(config: str, seed: int, *, records: int = 2, noise_multiplier: float = 2.0) -> TrainingRequest:
    """The two-world audits' shapes: ``"size"``, softmax regression 1 -> 1024 from zero, q = 1, one step;
    ``"poisson"``, an MLP 2 -> 8 -> 3, q = 1/2, 4 Poisson steps (batch sizes vary, some may be empty)."""
    if config == "size":
        features, classes, arch, q, epochs = np.ones((records, 1), np.float32), 1024, 0, 1.0, 1
    else:
        features, classes, arch, q, epochs = np.full((records, 2), 0.5, np.float32), 3, 8, 0.5, 2
    return TrainingRequest(
        features=features,
        labels=np.arange(records, dtype=np.int64) % classes,
        num_classes=classes,
        architecture=MLPArchitecture(hidden_width=arch),
        hyperparameters=DPHyperparameters(
            noise_multiplier=noise_multiplier, sampling_rate=q, epochs=epochs, learning_rate=1.0
        ),
        seed=seed,
    )


def log_probs(name: str, config: str, seed: int, **kwargs) -> np.ndarray:
    request = world_request(config, seed, **kwargs)
    return implementation(name).train(request).predict_log_proba(request.features)


#: (name, config, seed) run first in a fresh process (the first case) or first on its trace (the others).
FRESH = [(name, config, 7) for name in NAMES[:2] for config in ("poisson", "size")]


@pytest.fixture(scope="module")
def fresh(reuse, tmp_path_factory):
    """Each case of :data:`FRESH` trained in a new process, in that order: its log-probabilities."""
    out = tmp_path_factory.mktemp("fresh") / "fresh.npz"
    code = (
        f"import sys, numpy as np; sys.path.insert(0, {str(REPO)!r}); "
        "from tests.test_tfprivacy_reuse import FRESH, log_probs; "
        f"np.savez({str(out)!r}, *[log_probs(*case) for case in FRESH])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as saved:
        return [saved[f"arr_{i}"] for i in range(len(FRESH))]


def test_a_run_is_bit_identical_fresh_after_other_runs_and_interleaved(fresh):
    # after other seeds and other configurations on the same traces, and interleaved with each other
    for seed in (1, 2, 3):
        for name, config, _ in FRESH:
            log_probs(name, config, seed, records=3)
    for (name, config, seed), expected in zip(reversed(FRESH), reversed(fresh)):
        np.testing.assert_array_equal(log_probs(name, config, seed), expected, err_msg=f"{name} {config}")
    for (name, config, seed), expected in zip(FRESH, fresh):
        log_probs(name, config, seed + 1)
        np.testing.assert_array_equal(log_probs(name, config, seed), expected, err_msg=f"{name} {config}")


@pytest.mark.parametrize("name", NAMES[:2])
def test_the_seed_changes_the_noise_and_nothing_else_where_nothing_else_is_random(reuse, name):
    # zero init, q = 1, one step: without noise the model is the same for every seed; with noise it is not
    first, second = (log_probs(name, "size", seed) for seed in (1, 2))
    assert not np.allclose(first, second)
    quiet = [log_probs(name, "size", seed, noise_multiplier=0.0) for seed in (1, 2)]
    np.testing.assert_array_equal(*quiet)


#: Noise on one step's update per coordinate (learning rate 1, C = 1, σ = 2, B = 2): σC/B, or σC/B² for
#: the noise-for-mean variants.
NOISE_STD = {
    "tf-privacy-keras": 1.0,
    "tf-privacy-fast-clipping": 1.0,
    "tf-privacy-noise-for-mean": 0.5,
    "tf-privacy-fast-clipping-noise-for-mean": 0.5,
}


@pytest.mark.parametrize("name", list(NOISE_STD))
def test_noise_of_a_reused_step_has_the_intended_scale_and_is_fresh_per_seed(reuse, name):
    from dpverify_tfprivacy import _fast_clipping, _keras

    impl = implementation(name)
    trainer = _fast_clipping if impl.path == "fast_clipping" else _keras

    def update(seed, sigma):
        return np.concatenate([w.ravel() for w in trainer.train_mlp(world_request("size", seed), impl.step, sigma).weights])

    clean = update(0, 0.0)  # zero init, full batch: the same for every seed
    noises = [update(seed, 2.0) - clean for seed in (1, 2)]
    for noise in noises:
        # 2048 coordinates: the sample std has relative sd 1.6 %; 8 % is 5 sd
        assert np.std(noise) == pytest.approx(NOISE_STD[name], rel=0.08)
    # independent draws: |correlation| < 5 / sqrt(2048)
    assert abs(np.corrcoef(*noises)[0, 1]) < 0.11


def test_each_variant_has_its_own_trace_and_the_cache_is_bounded(reuse):
    """Every variant that changes TF-Privacy's step traces its own; the class 7 variant and the fixed-batch path
    run the correct step (they change the learning rate or the batches, outside the trace) and share the
    correct path's."""
    keys = []
    for name in NAMES:
        impl = implementation(name)
        log_probs(name, "size", 1)
        key = next(reversed(reuse._CACHE))
        assert key[:2] == (impl.path, impl.step), name
        keys.append(key)
        assert len(reuse._CACHE) <= reuse.CACHE_SIZE
    for sharer in ("tf-privacy-realised-batch-norm", "tf-privacy-keras-fixed-batches"):
        assert keys[NAMES.index(sharer)] == keys[NAMES.index("tf-privacy-keras")]
    assert len(set(keys)) == len(NAMES) - 2
    assert len(reuse._CACHE) == reuse.CACHE_SIZE and keys[1] not in reuse._CACHE  # the least recently used
    assert all(reuse.stateful_random_ops(entry.step) == [] for entry in reuse._CACHE.values())


def test_a_retraced_step_gives_the_same_run(reuse):
    before = log_probs("tf-privacy-keras", "poisson", 5)
    reuse._CACHE.clear()
    np.testing.assert_array_equal(log_probs("tf-privacy-keras", "poisson", 5), before)


def test_a_black_box_answers_for_its_own_run_after_later_runs(reuse):
    request = world_request("poisson", 11)
    trained = implementation("tf-privacy-fast-clipping").train(request)
    first = trained.predict_log_proba(request.features)
    later = log_probs("tf-privacy-fast-clipping", "poisson", 12)
    assert not np.allclose(later, first)
    np.testing.assert_array_equal(trained.predict_log_proba(request.features), first)


def test_a_reused_stateful_trace_would_not_follow_the_seed_and_the_generator_does(reuse):
    """Why the noise is rerouted: TF-Privacy's query draws with a stateful op seeded at trace time, which
    ``tf.random.set_seed`` rewinds to that trace's seeds rather than reseeding; the trace check sees it."""
    import tensorflow as tf
    from tensorflow_privacy.privacy.dp_query import gaussian_query

    query = gaussian_query.GaussianSumQuery(1.0, 1.0)
    state = query.initial_global_state()
    zeros = tf.zeros(5)

    def noised(v):
        return query.get_noised_result([v], state)[0][0]

    tf.random.set_seed(1)
    stateful = tf.function(noised).get_concrete_function(tf.TensorSpec([5], tf.float32))
    assert [op.split()[0] for op in reuse.stateful_random_ops(stateful)] == ["RandomStandardNormal"]
    assert not np.array_equal(stateful(zeros), stateful(zeros))  # a stream that runs on from run to run
    tf.random.set_seed(2)
    after_two = stateful(zeros).numpy()
    tf.random.set_seed(3)
    np.testing.assert_array_equal(stateful(zeros), after_two)  # rewound, whatever the new seed

    generator = tf.random.Generator.from_seed(0)
    with reuse.noise_from(generator):
        rerouted = tf.function(noised).get_concrete_function(tf.TensorSpec([5], tf.float32))
    assert reuse.stateful_random_ops(rerouted) == []
    draws = {}
    for seed in (2, 3, 2):
        generator.reset_from_seed(seed)
        draws.setdefault(seed, []).append(rerouted(zeros).numpy())
    np.testing.assert_array_equal(*draws[2])
    assert not np.array_equal(draws[2][0], draws[3][0])


def test_a_variable_the_step_only_writes_must_be_named(reuse):
    import tensorflow as tf

    counter = tf.Variable(0)

    def count():
        counter.assign_add(1, read_value=False)  # written, never read: as the optimizer's step counter

    bump = tf.function(count).get_concrete_function()
    with pytest.raises(RuntimeError, match="no run would reset"):
        reuse.captured_variables(bump)
    assert reuse.captured_variables(bump, counter) == [counter]
