"""The every-update Dirac audit: reading each canary's steps back from the released parameters, its
likelihood-ratio score, its null simulation and its power at q < 1, and the audit through the contract."""

import math

import numpy as np
import pytest
from scipy import stats

from dpverify.audits import run_audit
from dpverify.canaries.updates import DiracUpdates, UpdatesMissing
from dpverify.compare import match_key
from dpverify.config import AuditConfig, profile_config
from dpverify.session import AuditSession, audit_entry
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.power import every_update_detection
from dpverify.stats.scoring import GuessRule, subsampled_gaussian_log_likelihood_ratio
from tests.doubles import NumpyDPSGD


def _softmax_columns(weight, bias, scale):
    logits = scale * weight + bias[:, None]
    probabilities = np.exp(logits - logits.max(axis=0))
    return probabilities / probabilities.sum(axis=0)


def test_the_updates_read_back_each_canarys_sampled_clipped_gradient_and_noise_exactly():
    """A DP-SGD of softmax regression written out in float64 with its draws kept: the reader's (c_t, s_t)
    are the canary's clipped column norm and 1{sampled}·c_t + σ·(u_t·Z_t), u_t its clipped direction; its
    columns are the clipped column gradient and the released noisy column sum, in clip norms; the column's part
    along 1/√classes is the noise's alone, σ·(1·Z_t)/√classes, members' and non-members' alike."""
    rng = np.random.default_rng(0)
    m, extra, classes, scale, clip, lr, sigma, q, steps = 12, 3, 4, 100.0, 0.5, 2.0, 0.8, 0.5, 6
    labels = rng.integers(0, classes, size=m)
    members = rng.random(m) < 0.5
    normaliser = q * m
    weight, bias = np.zeros((classes, m + extra)), np.zeros(classes)
    reader = DiracUpdates(labels=labels, num_classes=classes, feature_scale=scale, max_grad_norm=clip,
                          learning_rate=lr, normaliser=normaliser, steps=steps)  # fmt: skip
    reader(0, (weight.astype(np.float32), bias.astype(np.float32)))
    expected_c, expected_s = np.zeros((m, steps)), np.zeros((m, steps))
    expected_g, expected_y = np.zeros((m, steps, classes)), np.zeros((m, steps, classes))
    expected_untouched = np.zeros((m, steps))
    for t in range(steps):
        residual = _softmax_columns(weight[:, :m], bias, scale)
        residual[labels, np.arange(m)] -= 1.0
        norm = np.linalg.norm(residual, axis=0)
        factor = np.minimum(1.0, clip / (norm * math.sqrt(scale**2 + 1)))
        sampled = members & (rng.random(m) < q)
        noise_w, noise_b = rng.standard_normal(weight.shape), rng.standard_normal(classes)
        summed_w, summed_b = sigma * clip * noise_w, sigma * clip * noise_b
        summed_w[:, :m] += sampled * factor * scale * residual
        summed_b += (sampled * factor * residual).sum(axis=1)
        weight, bias = weight - lr * summed_w / normaliser, bias - lr * summed_b / normaliser
        direction = residual / norm
        expected_c[:, t] = factor * scale * norm / clip
        expected_s[:, t] = sampled * expected_c[:, t] + sigma * np.einsum("kj,kj->j", direction, noise_w[:, :m])
        expected_g[:, t], expected_y[:, t] = (factor * scale * residual).T / clip, summed_w[:, :m].T / clip
        expected_untouched[:, t] = sigma * noise_w[:, :m].sum(axis=0) / math.sqrt(classes)
        reader(t + 1, (weight, bias))
    signal, projection = reader.statistics()
    np.testing.assert_allclose(signal, expected_c, rtol=1e-9)
    np.testing.assert_allclose(projection, expected_s, atol=1e-6)
    assert signal.max() == pytest.approx(scale / math.sqrt(scale**2 + 1))  # clipped: the whole norm, less the bias's share
    gradients, released = reader.columns()  # the whole columns, what correlated noise is decorrelated on
    np.testing.assert_allclose(gradients, expected_g, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(released, expected_y, atol=1e-5)
    np.testing.assert_allclose(reader.untouched(), expected_untouched, atol=1e-5)


def _reader(steps: int = 2) -> DiracUpdates:
    return DiracUpdates(labels=np.zeros(3, dtype=np.int64), num_classes=2, feature_scale=1.0, max_grad_norm=1.0,
                        learning_rate=1.0, normaliser=1.0, steps=steps)  # fmt: skip


@pytest.mark.parametrize(
    "handed, reason",
    [
        ([], "handed over no updates"),
        ([(0, (np.zeros((2, 3)), np.zeros(2)))], "parameters of 0 of the 2 steps"),
        ([(1, (np.zeros((2, 3)), np.zeros(2)))], "called for step 1, expected step 0"),
        ([(0, (np.zeros((3, 2)), np.zeros(2)))], r"weight, bias\) of shapes \(2, d >= 3\) and \(2,\)"),
        ([(0, (np.zeros((2, 3)),))], r"got shapes \(\(2, 3\),\) after step 0"),
    ],
)
def test_the_reader_names_what_was_handed_over_wrongly_and_never_raises_in_the_trainer(handed, reason):
    """What is handed over wrongly is kept, not raised in the trainer, and makes the audit not run."""
    reader = _reader()
    for step, parameters in handed:
        reader(step, parameters)
    with pytest.raises(UpdatesMissing, match=reason):
        reader.statistics()


def test_the_first_fault_is_kept_and_later_hand_overs_do_not_hide_it():
    reader = _reader(steps=1)
    reader(1, (np.zeros((2, 3)), np.zeros(2)))
    reader(0, (np.zeros((2, 3)), np.zeros(2)))
    reader(1, (np.zeros((2, 3)), np.zeros(2)))
    with pytest.raises(UpdatesMissing, match="called for step 1, expected step 0"):
        reader.statistics()


def test_the_score_is_the_log_likelihood_ratio_of_a_member_sampled_with_probability_q():
    rng = np.random.default_rng(1)
    signal, shown = rng.uniform(0.2, 1.0, (5, 7)), rng.normal(0.5, 1.0, (5, 7))
    sigma, q = 0.9, 0.3
    member = (1 - q) * stats.norm.pdf(shown, scale=sigma) + q * stats.norm.pdf(shown, loc=signal, scale=sigma)
    expected = np.log(member / stats.norm.pdf(shown, scale=sigma)).sum(axis=1)
    score = subsampled_gaussian_log_likelihood_ratio(signal, shown, noise_multiplier=sigma, sampling_rate=q)
    np.testing.assert_allclose(score, expected, rtol=1e-10)
    full = subsampled_gaussian_log_likelihood_ratio(signal, shown, noise_multiplier=sigma, sampling_rate=1.0)
    np.testing.assert_allclose(full, ((signal * shown - signal**2 / 2) / sigma**2).sum(axis=1))
    assert np.allclose(subsampled_gaussian_log_likelihood_ratio(signal, shown, noise_multiplier=0.0, sampling_rate=q),
                       (signal * shown).sum(axis=1))  # fmt: skip
    with pytest.raises(ValueError, match="one shape"):
        subsampled_gaussian_log_likelihood_ratio(signal, shown[:, :3], noise_multiplier=sigma, sampling_rate=q)


#: The gate's q and σ over 2 epochs (the null tests with power of the audit itself are in
#: tests/test_null_simulations.py).
CLAIM = ClaimedRun(noise_multiplier=1.0, sampling_rate=0.1, steps=20)


def test_a_halved_noise_at_q_one_tenth_is_caught_with_high_probability_in_simulation():
    """σ/2 where σ is claimed, every step seen, at a quarter of the gate's runs (4 of 2500 canaries) and a
    quarter of its steps, at a session's per-audit level (0.05 over 40 audits): refuted in at least 18 of 20
    simulated audits. If the true
    detection rate were 0.8 or less the test would pass with probability < 0.21; below 0.7, < 0.04."""
    truth = CLAIM.with_noise(CLAIM.noise_multiplier / 2)
    level = 1 - 0.05 / 40
    caught = every_update_detection(CLAIM, truth=truth, run_sizes=(2500,) * 4, guess_rule=GuessRule(sides="one"),
                                    delta=1e-5, confidence=level, audits=20, rng=np.random.default_rng(3))  # fmt: skip
    assert caught >= 0.9, caught


def _every_update_config(**settings) -> AuditConfig:
    """Two runs of 1000 canaries: at 2 × 200 even a 10× noise deficit is caught in only 2 of 10 simulated
    audits, and a correct trainer's pass would be blind (undecided)."""
    return profile_config("quick", observe="every_update", m=2000, pooled_runs=2, sampling_rate=0.25, epochs=2,
                          noise_multiplier=1.0, sides="one", device="cpu", **settings)  # fmt: skip


def test_the_every_update_setting_needs_dirac_canaries_in_softmax_regression_and_the_inclusion_design():
    with pytest.raises(ValueError, match="set design='inclusion'"):
        _every_update_config(design="pair")
    with pytest.raises(ValueError, match="set mode='dirac', hidden_width=0"):
        profile_config("mlp", observe="every_update")
    with pytest.raises(ValueError, match="observe must be one of"):
        profile_config("quick", observe="some")


def test_a_trainer_that_hands_over_its_updates_is_audited_on_them_and_says_what_the_adversary_saw():
    result = run_audit(NumpyDPSGD(), _every_update_config(seed=4))
    assert result.verdict in ("pass", "violation") and result.observed == "every update", result.summary()
    assert "adversary saw: every update" in result.summary() and result.to_dict()["observed"] == "every update"
    assert result.curve_claimed_epsilon == pytest.approx(ClaimedRun(noise_multiplier=1.0, sampling_rate=0.25, steps=8).epsilon(1e-5))
    assert np.mean(result.scores[result.membership == 1]) > np.mean(result.scores[result.membership == -1])


def test_a_trainer_that_hands_over_nothing_gets_the_every_update_audit_not_run_never_a_pass():
    trainer = NumpyDPSGD(hands_over_updates=False)
    result = run_audit(trainer, _every_update_config(seed=5))
    assert result.verdict == "undecided" and result.error is None, result.summary()
    assert "never called Request.observe_update" in result.not_run
    assert "Not run" in result.summary() and result.headline().startswith("undecided: not run")
    session = AuditSession(enabled=True, profile="quick", confidence=0.95, seed=0, device="cpu", epsilon=2.0,
                           implementations=(), report_path=None, plots_dir=None)  # fmt: skip
    session.results.append(audit_entry(result, trainer))
    row = session.summary_lines()[2]
    assert "inclusion@updates" in row and "not run: test-numpy-dpsgd: the trainer handed over no updates" in row


def test_a_baseline_made_before_audits_recorded_their_observation_matches_the_final_model_audit():
    entry = {"implementation": "x", "nodeid": "n", "design": "inclusion", "config": {"seed": 1, "pooled_runs": 4}}
    assert match_key(entry) == match_key({**entry, "config": {**entry["config"], "observe": "final_model"}})
    assert match_key(entry) != match_key({**entry, "config": {**entry["config"], "observe": "every_update"}})
