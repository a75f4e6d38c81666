"""The torch helpers, the reference DP-SGD, Opacus behind the contract, and white-box checks that each
buggy Opacus variant differs from the correct Opacus path in exactly the intended way.

Statistical checks use the standard error of a sample standard deviation of n Gaussian coordinates,
SE = std / sqrt(2n), and allow 5 SE: a correct implementation fails one with probability < 1e-6 over seeds
(every run here is seeded, so the outcome is fixed; the bound says how unlucky a seed would have to be).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")

from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402

import dpverify_opacus  # noqa: E402
from dpverify import conformance  # noqa: E402
from dpverify.contract import ImplementationInfo  # noqa: E402
from dpverify.registry import get_implementation  # noqa: E402
from dpverify.torch import (  # noqa: E402
    build_mlp,
    denormals_flushed,
    fast_math,
    make_predictor,
    poisson_batches,
    resolve_device,
    seeds_for,
)
from dpverify_opacus._dataloader import UserDataLoader  # noqa: E402
from dpverify_opacus._training import backward_batch, build_run  # noqa: E402
from dpverify_reference import accounting  # noqa: E402
from dpverify_reference.dpsgd import clipped_gradient_sum, dp_sgd_step  # noqa: E402

FIVE_SE = 5.0  # allowed deviation of a sample std, in standard errors


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def wide_request(**changes):
    """A request with enough coordinates for noise statistics: d = 32, h = 64, C = 4 → 2372 parameters
    (hidden layer 2112, output layer 260); m = 100, q = 0.1 → Opacus' expected batch size 10."""
    options = dict(num_records=100, dimension=32, hidden_width=64, num_classes=4, noise_multiplier=1.0)
    options.update(changes)
    return conformance.small_request(**options)


def _outputs(impl_name, request):
    trained = get_implementation(impl_name).train(request)
    return trained, trained.predict_log_proba(request.features)


def one_step(impl, request, rows=None, mode=None):
    """Build the implementation's Opacus run, feed one batch (``rows`` of the request, default: the
    first batch its own loader draws) and run the DP optimizer's ``pre_step`` (clip, sum, noise, scale,
    accountant hook) without the parameter update. Returns the run."""
    if isinstance(impl, str):
        impl = get_implementation(impl)
    mode = mode or impl.grad_sample_mode
    run = build_run(request, name=impl.info.name, grad_sample_mode=mode, tweak=impl.make_tweak())
    if rows is None:
        features, labels = next(iter(run.data_loader))
    else:
        features = torch.from_numpy(request.features[rows])
        labels = torch.from_numpy(request.labels[rows])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        backward_batch(run, features, labels)
        run.optimizer.pre_step()
    return run


def summed(run):
    return [p.summed_grad.detach().clone() for p in run.optimizer.params]


def noise_of(run, divisor=None):
    """Noise per parameter: the step's gradient times the divisor it was scaled by, minus the clipped sum."""
    divisor = run.optimizer.expected_batch_size if divisor is None else divisor
    return [(p.grad * divisor - p.summed_grad).detach() for p in run.optimizer.params]


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def assert_std(values, expected, what):
    values = values.double()
    n = values.numel()
    measured = float(values.pow(2).mean().sqrt())  # mean 0 is known
    if expected == 0:  # only float rounding of grad × divisor − summed_grad remains
        assert measured <= 1e-6, f"{what}: noise std {measured:.3g}, expected 0 (up to rounding)"
        return
    tolerance = FIVE_SE / math.sqrt(2 * n)
    assert abs(measured / expected - 1) <= tolerance, (
        f"{what}: noise std {measured:.4g}, expected {expected:.4g} (±{100 * tolerance:.1f} % = 5 SE, n = {n})"
    )


# --- dpverify.torch -----------------------------------------------------------------------------------


def test_seeds_are_deterministic_and_distinct():
    assert seeds_for(3) == seeds_for(3)
    assert seeds_for(3) != seeds_for(4)
    assert len({seeds_for(3).init, seeds_for(3).sampling, seeds_for(3).noise}) == 3


def test_poisson_batches_count_seed_and_rate():
    n, q, steps = 200, 0.1, 300
    batches = list(poisson_batches(n, q, steps, seed=7))
    assert len(batches) == steps
    assert all(b.dtype == torch.int64 and bool((b[1:] > b[:-1]).all()) for b in batches)
    assert all(torch.equal(a, b) for a, b in zip(batches, poisson_batches(n, q, steps, seed=7)))
    assert not all(torch.equal(a, b) for a, b in zip(batches, poisson_batches(n, q, steps, seed=8)))
    # inclusions ~ Binomial(n·steps, q); 5 SD: fails with probability < 1e-6
    total = sum(len(b) for b in batches)
    assert abs(total - n * steps * q) <= 5 * math.sqrt(n * steps * q * (1 - q))
    # every record is drawn independently: per-record counts ~ Binomial(steps, q); a 5 SD outlier among
    # 200 records has probability < 1e-4
    counts = torch.bincount(torch.cat(batches), minlength=n).double()
    assert float((counts - steps * q).abs().max()) <= 5 * math.sqrt(steps * q * (1 - q))
    assert list(poisson_batches(5, 0.5, 0, seed=1)) == []
    with pytest.raises(ValueError, match="sampling_rate"):
        list(poisson_batches(5, 0.0, 1, seed=1))


def test_build_mlp_shape_and_seed():
    request = conformance.small_request()
    state = torch.get_rng_state()
    model = build_mlp(request)
    assert torch.equal(state, torch.get_rng_state()), "build_mlp must leave the global generator alone"
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(16, 8), (16,), (4, 16), (4,)]
    same = build_mlp(request)
    other = build_mlp(request, seed=seeds_for(request.seed).init + 1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    assert not torch.equal(model[0].weight, other[0].weight)


def test_predictor_contract_batches_and_nan_passthrough():
    request = conformance.small_request()
    model = build_mlp(request).train()
    predict = make_predictor(model, batch_size=7)
    out = predict(request.features)
    assert out.shape == (100, 4) and out.dtype == np.float64
    np.testing.assert_allclose(np.logaddexp.reduce(out, axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(out, make_predictor(model)(request.features.astype(np.float64)), atol=1e-6)
    assert model.training, "the predictor must restore the model's mode"
    assert predict(request.features[:0]).shape == (0, 4)
    with pytest.raises(ValueError, match="2-D"):
        predict(request.features[0])
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    assert np.isnan(make_predictor(model)(request.features)).any(), "NaN parameters must show, not be hidden"


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("cuda").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("threads", [1, 2])
def test_fast_math_flushes_on_every_thread_and_is_switched_off_on_exit(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        (torch.ones(1 << 20) * 2).sum()  # the thread pool exists before fast_math, as in a real session
        assert not denormals_flushed()
        with fast_math():
            assert denormals_flushed()
        assert not denormals_flushed()
        assert float(torch.tensor([1e-40]) * 1.0) != 0.0
    finally:
        torch.set_num_threads(before)


# --- reference DP-SGD --------------------------------------------------------------------------------


def _explicit_per_example_grads(model, features, labels):
    rows = []
    for x, y in zip(features, labels):
        loss = torch.nn.functional.cross_entropy(model(x[None]), y[None])
        rows.append(torch.autograd.grad(loss, list(model.parameters())))
    return rows


def test_reference_ghost_norms_and_clipped_sum_match_explicit_per_example_gradients():
    request = wide_request(feature_scale=10.0)
    model = build_mlp(request)
    x, y = torch.from_numpy(request.features[:12]), torch.from_numpy(request.labels[:12])
    rows = _explicit_per_example_grads(model, x, y)
    explicit_norms = torch.stack([flat(r).norm() for r in rows])
    clip = float(explicit_norms.median())
    clipped, norms = clipped_gradient_sum(model, x, y, clip)
    torch.testing.assert_close(norms, explicit_norms, rtol=1e-4, atol=1e-6)
    assert bool((explicit_norms > clip).any()) and bool((explicit_norms < clip).any()), "both cases exercised"
    expected = [sum(min(1.0, clip / float(n)) * r[i] for r, n in zip(rows, explicit_norms)) for i in range(4)]
    for got, want in zip(clipped, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    empty, _ = clipped_gradient_sum(model, x[:0], y[:0], clip)
    assert all(float(g.abs().sum()) == 0.0 for g in empty)


def test_reference_claim_is_dp_accounting():
    trained = get_implementation("reference-dpsgd").train(conformance.small_request())
    claim = trained.claim
    assert claim.accountant == "dp_accounting.rdp"
    assert claim.epsilon == accounting.rdp_epsilon(2.0, 0.1, 10, 1e-5)
    assert claim.other_epsilons["dp_accounting.pld"] == pytest.approx(accounting.pld_epsilon(2.0, 0.1, 10, 1e-5))
    assert claim.other_epsilons["dp_accounting.pld"] <= claim.epsilon  # PLD is the tighter one
    # the same mathematics as Opacus' RDP accountant, computed by another library
    rdp = RDPAccountant()
    rdp.history = [(2.0, 0.1, 10)]
    assert claim.epsilon == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9)


def test_claims_are_computed_once_per_history_and_equal_a_fresh_accountants():
    """The accountants are memoised (a two-world audit repeats one claim thousands of times): a second run
    with the same (σ, q, steps, δ) is served from the cache, with the numbers a fresh accountant states."""
    from dpverify_opacus._training import stated_epsilons

    request = conformance.small_request(noise_multiplier=1.7)
    first = get_implementation("opacus-ghost").train(request).claim
    hits = stated_epsilons.cache_info().hits
    again = get_implementation("opacus-hooks").train(dataclasses.replace(request, seed=5)).claim
    assert stated_epsilons.cache_info().hits == hits + 1 and again.epsilon == first.epsilon
    rdp = RDPAccountant()
    rdp.history = [(1.7, 0.1, 10)]
    assert first.epsilon == rdp.get_epsilon(1e-5)
    hits = accounting.pld_epsilon.cache_info().hits
    reference = get_implementation("reference-dpsgd")
    claims = [reference.train(dataclasses.replace(request, seed=seed)).claim for seed in (1, 2)]
    assert accounting.pld_epsilon.cache_info().hits >= hits + 1 and claims[0] == claims[1]
    assert claims[0].epsilon == accounting._epsilon("rdp", 1.7, 0.1, 10, 1e-5)


@pytest.mark.parametrize("target, q, steps", [(1.0, 0.1, 10), (8.0, 0.1, 500), (0.5, 0.01, 1000)])
def test_reference_calibration_within_one_percent_below(target, q, steps):
    sigma = accounting.calibrate_noise_multiplier(target, q, steps, 1e-5)
    epsilon = accounting.rdp_epsilon(sigma, q, steps, 1e-5)
    assert 0.99 * target <= epsilon <= target


def test_reference_step_equals_opacus_step():
    """Same batch, same noise seed: the reference update and Opacus' ghost-mode update agree. (Opacus
    clips with C/(‖g‖ + 1e-6), the reference with C/‖g‖: a relative difference ~1e-6.)"""
    request = wide_request(feature_scale=10.0, max_grad_norm=0.5)
    rows = np.arange(10)
    run = one_step("opacus-ghost", request, rows)
    opacus_update = [-request.hyperparameters.learning_rate * p.grad for p in run.optimizer.params]

    model = build_mlp(request)
    before = [p.detach().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(seeds_for(request.seed).noise)
    dp_sgd_step(
        model,
        torch.from_numpy(request.features[rows]),
        torch.from_numpy(request.labels[rows]),
        max_grad_norm=0.5,
        noise_multiplier=1.0,
        expected_batch_size=10,
        learning_rate=request.hyperparameters.learning_rate,
        generator=generator,
    )
    for p, b, want in zip(model.parameters(), before, opacus_update):
        torch.testing.assert_close(p.detach() - b, want, rtol=1e-4, atol=1e-5)


# --- Opacus behind the contract ------------------------------------------------------------------------


def test_opacus_claim_is_opacus_accountant_called_directly():
    request = conformance.small_request()
    claim = get_implementation("opacus-ghost").train(request).claim
    rdp, prv = RDPAccountant(), PRVAccountant()
    rdp.history = [(2.0, 0.1, 10)]
    prv.history = [(2.0, 0.1, 10)]
    assert claim.accountant == "opacus.rdp" and claim.relation == "add_remove"
    assert claim.epsilon == rdp.get_epsilon(1e-5)
    assert claim.other_epsilons["opacus.prv"] == pytest.approx(prv.get_epsilon(1e-5), rel=1e-9)
    assert (claim.noise_multiplier, claim.sampling_rate, claim.steps) == (2.0, 0.1, 10)


def test_opacus_calibration_is_opacus_get_noise_multiplier():
    from opacus.accountants.utils import get_noise_multiplier

    request = conformance.small_request(target_epsilon=1.0)
    claim = get_implementation("opacus-hooks").train(request).claim
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the")
        expected = get_noise_multiplier(
            target_epsilon=1.0, target_delta=1e-5, sample_rate=0.1, steps=10, epsilon_tolerance=0.005
        )
    assert claim.noise_multiplier == expected
    assert 0.99 <= claim.epsilon <= 1.0


def test_hooks_and_ghost_give_the_same_model():
    """Same seed: same init, same Poisson batches, same noise; the two modes compute the same clipped sum
    up to float rounding (measured 3e-6 in log-probability for a 200-wide MLP; allowed 1e-4)."""
    request = wide_request(feature_scale=5.0)
    ghost, a = _outputs("opacus-ghost", request)
    hooks, b = _outputs("opacus-hooks", request)
    np.testing.assert_allclose(a, b, atol=1e-4)
    assert ghost.claim == hooks.claim


def test_opacus_needs_q_one_over_integer():
    request = conformance.small_request(sampling_rate=0.3)
    with pytest.raises(ValueError, match="opacus-ghost.*1/k"):
        get_implementation("opacus-ghost").train(request)


def test_opacus_takes_exactly_the_requested_steps_when_its_epoch_is_one_short():
    """For q = 1/93 Opacus' sampler yields int(1/q) = 92 batches a pass; the loop still takes 93 steps."""
    request = conformance.small_request(num_records=186, sampling_rate=1 / 93, epochs=1)
    run = build_run(request, name="opacus-ghost")
    assert len(run.data_loader) == 92
    claim = get_implementation("opacus-ghost").train(request).claim
    assert claim.steps == request.hyperparameters.steps == 93


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_empty_batch_is_a_noise_only_step(mode):
    request = wide_request()
    run = one_step("opacus-" + mode, request, rows=np.arange(0))
    assert all(float(p.summed_grad.abs().sum()) == 0.0 for p in run.optimizer.params)
    assert_std(flat(noise_of(run)), 1.0, f"opacus-{mode} empty batch")
    assert run.engine.accountant.history == [(1.0, 0.1, 1)]


# --- buggy variants: white-box ---------------------------------------------------------------------------


def test_variant_catalogue():
    variants = [impl for impl in dpverify_opacus.implementations() if impl.info.expected == "violation"]
    classification = [impl for impl in variants if impl.info.task == "classification"]
    # Row 9 is no variant: Opacus' own poisson_sampling=False is that bug, registered as a known issue. Rows 13
    # and 16 are opacus-dpcr's binary tree (its noise unscaled for the tree's nodes, a tree that never restarts).
    assert sorted(set(impl.info.bug for impl in classification)) == [row for row in range(1, 13) if row != 9] + [13, 16]
    shuffled = next(impl for impl in dpverify_opacus.implementations() if impl.info.name == "opacus-shuffled-batches")
    assert shuffled.info.expected == "known-issue" and shuffled.info.bug == 9
    for impl in variants:
        info = impl.info
        assert info.breaks and info.detectability in ("D1", "D2", "D3", "D4") and info.notes
        if info.library == "opacus-dpcr":
            assert info.extra == "opacus-dpcr" and {"opacus", "opacus_dpcr", "dpcrpy"} <= set(info.requires)
            assert info.correlated_noise and info.bug in (13, 16)
        else:
            assert info.library == "opacus" and info.requires == ("torch", "opacus") and info.extra == "opacus"
    with pytest.raises(KeyError, match="known"):
        dpverify_opacus.variant("opacus-nothing")


def test_listing_imports_neither_torch_nor_opacus():
    code = (
        "import sys, dpverify_opacus, dpverify_reference;"
        "names = [i.info.name for i in dpverify_opacus.implementations() + dpverify_reference.implementations()];"
        "assert 'opacus-ghost' in names and 'reference-dpsgd' in names;"
        "heavy = [m for m in ('torch', 'opacus', 'dp_accounting') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_noise_scaled_factory():
    impl = dpverify_opacus.noise_scaled(4)
    assert isinstance(impl.info, ImplementationInfo)
    assert impl.info.name == "opacus-noise-div-4" and impl.info.expected == "violation"
    assert dpverify_opacus.noise_scaled(1).info.expected == "private"
    with pytest.raises(ValueError):
        dpverify_opacus.noise_scaled(0.5)


@pytest.mark.parametrize(
    "impl, hidden_factor, output_factor",
    [
        ("opacus-ghost", 1.0, 1.0),
        ("opacus-hooks", 1.0, 1.0),
        ("opacus-no-noise", 0.0, 0.0),
        ("opacus-noise-for-mean", 0.1, 0.1),  # 1 / expected batch size (10)
        ("opacus-unnoised-layer", 1.0, 0.0),
        (dpverify_opacus.noise_scaled(4), 0.25, 0.25),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(getattr(v, "info", None), "name", str(v)),
)
def test_noise_std_per_layer(impl, hidden_factor, output_factor):
    """One step on a fixed batch, σ = C = 1: the noise std of the hidden layer (W1, b1: n = 2112) and of
    the output layer (W2, b2: n = 260) is σC times the variant's factor, and the accountant still reads σ."""
    request = wide_request(feature_scale=3.0)
    run = one_step(impl, request, rows=np.arange(10))
    noise = noise_of(run)
    assert_std(flat(noise[:2]), hidden_factor, "hidden layer")
    assert_std(flat(noise[2:]), output_factor, "output layer")
    assert run.engine.accountant.history == [(1.0, 0.1, 1)]


def test_reused_noise_repeats_the_noise_vector():
    request = wide_request()
    for name, same in (("opacus-reused-noise", True), ("opacus-ghost", False)):
        run = one_step(name, request, rows=np.arange(10))
        first = flat(noise_of(run))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            run.optimizer.original_optimizer.step()
            backward_batch(run, torch.from_numpy(request.features[10:20]), torch.from_numpy(request.labels[10:20]))
            run.optimizer.pre_step()
        second = flat(noise_of(run))
        if same:
            torch.testing.assert_close(first, second, rtol=0, atol=1e-5)
        else:  # independent draws: |correlation| < 5/sqrt(n) fails with probability < 1e-6
            corr = float(torch.corrcoef(torch.stack([first, second]))[0, 1])
            assert abs(corr) < 5 / math.sqrt(first.numel()), corr


def _per_example_norms(request, rows):
    model = build_mlp(request)
    _, norms = clipped_gradient_sum(
        model, torch.from_numpy(request.features[rows]), torch.from_numpy(request.labels[rows]), math.inf
    )
    return norms


def test_no_clipping_sums_unclipped_rows_but_noises_for_nominal_c():
    request = wide_request(feature_scale=10.0, max_grad_norm=0.01, noise_multiplier=0.0)
    row = np.array([3])
    unclipped = float(_per_example_norms(request, row)[0])
    assert unclipped > 100 * 0.01
    correct = float(flat(summed(one_step("opacus-ghost", request, row))).norm())
    buggy_run = one_step("opacus-no-clipping", request, row)
    buggy = float(flat(summed(buggy_run)).norm())
    assert correct == pytest.approx(0.01, rel=1e-4)
    assert buggy == pytest.approx(unclipped, rel=1e-4)
    assert buggy_run.optimizer.max_grad_norm == 0.01  # the noise std is still σ × the nominal C


def test_batch_clipping_clips_the_batch_not_the_rows():
    clip = 0.05
    request = wide_request(feature_scale=10.0, max_grad_norm=clip, noise_multiplier=0.0)
    rows = np.arange(10)
    model = build_mlp(request)
    x, y = torch.from_numpy(request.features[rows]), torch.from_numpy(request.labels[rows])
    unclipped_sum, norms = clipped_gradient_sum(model, x, y, math.inf)
    row_clipped_sum, _ = clipped_gradient_sum(model, x, y, clip)
    assert bool((norms > clip).all())
    total = float(flat(unclipped_sum).norm())
    bound = 10 * clip  # expected batch size × C
    assert total > bound
    buggy = summed(one_step("opacus-batch-clipping", request, rows))
    for got, g in zip(buggy, unclipped_sum):
        torch.testing.assert_close(got, g * (bound / total), rtol=1e-4, atol=1e-7)
    correct = summed(one_step("opacus-ghost", request, rows))
    for got, want in zip(correct, row_clipped_sum):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    cosine = float(torch.nn.functional.cosine_similarity(flat(correct), flat(unclipped_sum), dim=0))
    assert cosine < 0.999, "per-row clipping must change the direction of this batch's sum"


def test_duplicated_rows_each_record_twice():
    request = wide_request(feature_scale=3.0, noise_multiplier=0.0)
    tweak = get_implementation("opacus-duplicated-rows").make_tweak()
    first = next(iter(build_run(request, name="x").data_loader))[1]  # same seed: the same Poisson draw
    doubled = next(iter(build_run(request, name="x", tweak=tweak).data_loader))[1]
    assert torch.equal(doubled, torch.cat([first, first]))
    correct_run = one_step("opacus-ghost", request)
    buggy_run = one_step("opacus-duplicated-rows", request)
    assert buggy_run.batch_size == 2 * correct_run.batch_size == 2 * len(first)
    for got, want in zip(summed(buggy_run), summed(correct_run)):
        torch.testing.assert_close(got, 2 * want, rtol=1e-5, atol=1e-7)


def test_realised_batch_norm_divides_by_the_rows_of_the_step():
    request = wide_request(feature_scale=3.0, noise_multiplier=0.0)
    rows = np.arange(7)  # the expected batch size is 10
    for name, divisor in (("opacus-ghost", 10), ("opacus-realised-batch-norm", 7)):
        run = one_step(name, request, rows)
        for p in run.optimizer.params:
            torch.testing.assert_close(p.grad * divisor, p.summed_grad, rtol=1e-6, atol=1e-8)


def _with_normaliser(request, expected_batch_size):
    hp = dataclasses.replace(request.hyperparameters, expected_batch_size=expected_batch_size)
    return dataclasses.replace(request, hyperparameters=hp)


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_opacus_divides_by_the_designated_normaliser_and_the_tutorial_loader_by_its_own(mode):
    """A designated expected_batch_size replaces Opacus' int(N·q) (here 10); Opacus as its tutorials call
    it keeps int(N·q), the normaliser that reads the dataset's size (Opacus #571)."""
    request = _with_normaliser(wide_request(feature_scale=3.0, noise_multiplier=0.0), 25.0)
    impl = get_implementation(f"opacus-{mode}")
    run = one_step(impl, request, np.arange(7), mode=mode)
    assert run.optimizer.expected_batch_size == 25.0
    for p in run.optimizer.params:
        torch.testing.assert_close(p.grad * 25.0, p.summed_grad, rtol=1e-6, atol=1e-8)
    tutorial = build_run(request, name="opacus-dataloader", grad_sample_mode=mode, tweak=UserDataLoader(10))
    assert tutorial.optimizer.expected_batch_size == 10


def test_reference_divides_by_the_designated_normaliser():
    """Softmax regression starts at zero, so without noise one full-batch step's logits are the clipped
    sum over the normaliser: designating 4 instead of q·N = 2 halves them."""
    request = conformance.small_request(
        num_records=2, dimension=4, hidden_width=0, num_classes=3, noise_multiplier=0.0, sampling_rate=1.0
    )
    impl = get_implementation("reference-dpsgd")
    plain = impl.train(request).predict_log_proba(request.features)
    halved = impl.train(_with_normaliser(request, 4.0)).predict_log_proba(request.features)
    logits = lambda log_probs: log_probs - log_probs.mean(axis=1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose(logits(halved), logits(plain) / 2, rtol=1e-5, atol=1e-7)


def test_accountant_steps_variant_trains_the_same_but_claims_less():
    request = conformance.small_request()
    correct, a = _outputs("opacus-ghost", request)
    buggy, b = _outputs("opacus-accountant-steps", request)
    np.testing.assert_array_equal(a, b)  # the same training
    assert buggy.claim.steps == 3 and correct.claim.steps == 10  # ceil(10 / 4) accounted
    assert buggy.claim.epsilon < correct.claim.epsilon
    calibrated = get_implementation("opacus-accountant-steps").train(conformance.small_request(target_epsilon=1.0))
    rdp = RDPAccountant()
    rdp.history = [(calibrated.claim.noise_multiplier, 0.1, 10)]
    assert calibrated.claim.epsilon == pytest.approx(1.0, rel=0.01)
    assert rdp.get_epsilon(1e-5) > 1.3, "the 10 steps actually taken spend more than the target"


def test_accountant_rate_variant_trains_the_same_but_claims_a_quarter_of_q():
    request = conformance.small_request()
    correct, a = _outputs("opacus-ghost", request)
    buggy, b = _outputs("opacus-accountant-rate", request)
    np.testing.assert_array_equal(a, b)  # the same training
    assert buggy.claim.sampling_rate == pytest.approx(correct.claim.sampling_rate / 4) and buggy.claim.steps == correct.claim.steps
    assert buggy.claim.epsilon < correct.claim.epsilon
    calibrated = get_implementation("opacus-accountant-rate").train(conformance.small_request(target_epsilon=1.0))
    rdp = RDPAccountant()
    rdp.history = [(calibrated.claim.noise_multiplier, 0.1, 10)]
    assert calibrated.claim.epsilon == pytest.approx(1.0, rel=0.01)
    assert rdp.get_epsilon(1e-5) > 1.3, "the rate actually sampled at spends more than the target"


def test_shuffled_batches_partition_each_epoch_under_a_poisson_claim():
    request = conformance.small_request()
    run = build_run(request, name="x", tweak=get_implementation("opacus-shuffled-batches").make_tweak())
    epoch = [labels for _, labels in run.data_loader]
    indices = sorted(i for batch in run.data_loader.batch_sampler for i in batch)
    assert len(epoch) == 10 and {len(b) for b in epoch} == {10}
    assert indices == list(range(100)), "an epoch of shuffled batches holds each record exactly once"
    poisson = build_run(request, name="x").data_loader.batch_sampler
    sizes = [len(b) for b in poisson]
    assert len(set(sizes)) > 1, "Poisson batch sizes vary"
    claim = get_implementation("opacus-shuffled-batches").train(request).claim
    assert claim == get_implementation("opacus-ghost").train(request).claim


def test_replace_one_claim_changes_only_the_relation():
    request = conformance.small_request()
    correct, a = _outputs("opacus-ghost", request)
    buggy, b = _outputs("opacus-replace-one-claim", request)
    np.testing.assert_array_equal(a, b)
    assert buggy.claim.relation == "replace_one" and correct.claim.relation == "add_remove"
    assert buggy.claim.epsilon == correct.claim.epsilon


@pytest.mark.parametrize("size", [6, 7])
def test_microbatches_clip_pair_means(size):
    clip = 0.05
    request = wide_request(feature_scale=10.0, max_grad_norm=clip, noise_multiplier=0.0)
    rows = np.arange(size)
    run = one_step("opacus-microbatches", request, rows)
    model = build_mlp(request)
    x, y = torch.from_numpy(request.features), torch.from_numpy(request.labels)
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for start in range(0, size - 1, 2):  # pairs; a 7th row is dropped
        pair = slice(start, start + 2)
        loss = torch.nn.functional.cross_entropy(model(x[pair]), y[pair])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        factor = min(1.0, clip / float(flat(grads).norm()))
        expected = [e + factor * g for e, g in zip(expected, grads)]
    for got, want in zip(summed(run), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    for p in run.optimizer.params:  # divided by the expected number of pairs, 10 / 2
        torch.testing.assert_close(p.grad * 5, p.summed_grad, rtol=1e-6, atol=1e-8)


def test_variants_keep_opacus_claim():
    """Apart from classes 8 and 10 (docs/bugs.md), whose bug is the claim, a variant states exactly the correct Opacus claim."""
    request = conformance.small_request()
    correct = get_implementation("opacus-ghost").train(request).claim
    for spec in dpverify_opacus.VARIANTS:
        if spec.bug in (8, 10):
            continue
        assert spec.build().train(request).claim == correct, spec.name


@pytest.mark.parametrize("preset, expected", [(None, "1"), ("0", "0")])
def test_opacus_plugin_asks_torch_for_huge_pages_unless_the_user_chose(preset, expected):
    import os

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    code = "import os, sys, dpverify_opacus; assert 'torch' not in sys.modules; print(os.environ['THP_MEM_ALLOC_ENABLE'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
