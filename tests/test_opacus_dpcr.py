"""opacus-dpcr 1.0.0 (DP continual release through Opacus): the binary tree's structure against the library's
own noise, the claims its runs state, and its audits (benchmarks/results/opacus-dpcr.md)."""

import math

import numpy as np
import pytest

from dpverify.audits import run_audit
from dpverify.config import every_update_config
from dpverify.stats.correlated import NoiseStructure, min_separation_sensitivity

pytest.importorskip("opacus_dpcr")
dpcrpy = pytest.importorskip("dpcrpy")

import dpverify_opacus  # noqa: E402
from dpverify_opacus._dpcr import TREE_ORDER, tree_event_sigma  # noqa: E402

#: The every-update audit's per-audit confidence in these tests: a true claim is refuted with probability at most 1 %.
CONFIDENCE = 0.99


def _implementation(name: str):
    return next(impl for impl in dpverify_opacus.dpcr_implementations() if impl.info.name == name)


def _replayed_noise(order: int, steps: int) -> np.ndarray:
    """dpcrpy's dpCrFw running BinMech(order) as DPCROptimizer builds it, with a noise mechanism whose draws
    are unit coefficient vectors times its σ: row t is the update noise of step t in those draws, exactly."""
    draws = 2 * steps

    class Coefficients(dpcrpy.noiMech.GaussNoiMech):
        drawn = 0

        def genNoise(self, shape=None):
            unit = np.zeros(draws)
            unit[self.drawn] = self.sigma
            self.drawn += 1
            return unit

    mechanism = Coefficients(sigma0=1.0)
    framework = dpcrpy.dpCrFw(lambda block: dpcrpy.BinMech(order).setNoiMech(mechanism))
    framework.initRelease(np.zeros(draws))
    return np.array([framework.dpRelease(np.zeros(draws))[1] for _ in range(steps)])


@pytest.mark.parametrize("order, steps", [(0, 3), (2, 11), (3, 32)])
def test_the_binary_tree_whitens_dpcrpys_noise_exactly(order, steps):
    """C·L = √(k+1)·(distinct unit draws): each whitened update is one fresh node noise of the tree, the
    stddev its L2 sensitivity for one step sets; without the tree's C (independent noise) it is not."""
    noise = _replayed_noise(order, steps)
    structure = NoiseStructure.binary_tree(steps=steps, tree_steps=2**order)
    whitened = structure.strategy @ noise
    np.testing.assert_allclose(whitened @ whitened.T, (order + 1) * np.eye(steps), atol=1e-12)
    if order > 0:
        assert not np.allclose(noise @ noise.T, (order + 1) * np.eye(steps))


def test_the_binary_tree_whitens_the_optimizers_own_noise():
    """The same through opacus-dpcr's DPCROptimizer, its TensorGaussNoiMech and its scale σ·C·lr/B·√(k+1):
    20 000 coordinates of 16 zero-gradient releases, whitened by C over that stddev, have unit covariance
    (each entry's error about 0.01; the bound 0.05 is 5 of those), and the raw updates do not."""
    import torch
    from opacus_dpcr import DPCREngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    sigma, clip, lr, batch, steps, width = 1.3, 0.5, 0.2, 8, 16, 20_000
    model = torch.nn.Linear(1, width, bias=False)
    loader = DataLoader(TensorDataset(torch.zeros(batch, 1), torch.zeros(batch)), batch_size=batch)
    engine = DPCREngine(accountant="rdp", dpcrGenerator=lambda block: dpcrpy.BinMech(TREE_ORDER))
    _, optimizer, _ = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                                          data_loader=loader, noise_multiplier=sigma, max_grad_norm=clip)  # fmt: skip
    framework = optimizer.dpcrs[0]
    optimizer._shareId = 0  # which parameter's noise mechanism a new tree takes, as DPCROptimizer.step sets it
    with torch.no_grad():
        updates = np.array([framework.dpRelease(torch.zeros(width, 1))[1].numpy().ravel() for _ in range(steps)])
    stddev = sigma * clip * lr / batch * math.sqrt(TREE_ORDER + 1)
    whitened = NoiseStructure.binary_tree(steps=steps, tree_steps=2**TREE_ORDER).strategy @ updates / stddev
    assert np.abs(whitened @ whitened.T / width - np.eye(steps)).max() < 0.05
    assert np.abs(updates @ updates.T / width / stddev**2 - np.eye(steps)).max() > 0.5


def test_a_record_in_every_step_touches_node_t_lowbit_t_times():
    """‖C·1‖² = Σ_t lowbit(t)² per tree (92 for 8 steps), 4 trees of 8 then 2 steps: 4·92 + 1 + 4."""
    structure = NoiseStructure.binary_tree(steps=34, tree_steps=8)
    assert min_separation_sensitivity(structure, min_separation=1) ** 2 == pytest.approx(4 * 92 + 5)
    with pytest.raises(ValueError, match="tree_steps must be a power of 2"):
        NoiseStructure.binary_tree(steps=8, tree_steps=6)


def test_the_two_claims_of_one_run():
    """The accountant's claim composes σ at every step (μ = √T/σ); the tree's mechanism has μ = ‖C·1‖/(σ√(k+1)),
    √(Σ_t lowbit(t)²/(2^k (k+1))) times that over whole trees (2.17 for BinMech(4)): that factor is the known issue."""
    from dpverify.stats.power import gdp_mu
    from dpverify.stats.events import EventRun
    import dp_accounting

    steps, sigma = 32, 2.0
    tree = 2**TREE_ORDER
    per_tree = sum((t & -t) ** 2 for t in range(1, tree + 1))
    tree_mu = 1.0 / tree_event_sigma(sigma, steps=steps)
    assert tree_mu == pytest.approx(math.sqrt(steps // tree * per_tree) / (sigma * math.sqrt(TREE_ORDER + 1)))
    accounted = EventRun(event=dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), steps))
    assert tree_mu / gdp_mu(accounted) == pytest.approx(math.sqrt(per_tree / (tree * (TREE_ORDER + 1))), rel=1e-9)


def test_a_dataset_of_fewer_than_one_over_q_records_trains_with_the_designated_normaliser():
    """The realised-batch world's D, one record at q = 1/2: Opacus' own expected batch size int(N·q) is 0, which
    DPCROptimizer divides by when DPCREngine.make_private builds it (ZeroDivisionError); the trainer builds it
    once the designated normaliser is set, and the noise is that normaliser's (σ·C·lr/B·√(k+1) with B = 1)."""
    from tests.updates import dirac_request

    request = dirac_request(records=1, sampling_rate=0.5, epochs=2, noise_multiplier=1.0, expected_batch_size=1.0)
    trained = _implementation("opacus-dpcr-tree").train(request)
    assert np.all(np.isfinite(trained.predict_log_proba(request.features)))


def test_every_dpcr_path_gets_the_full_batch_every_update_audit():
    from dpverify.gate import gate_audits

    infos = [impl.info for impl in dpverify_opacus.dpcr_implementations()]
    assert all(info.correlated_noise and info.library == "opacus-dpcr" for info in infos)
    audits = [audit for audit in gate_audits(infos, worlds="none") if audit.every_update]
    assert [audit.implementation_name for audit in audits] == [info.name for info in infos]
    config = audits[0].config("quick", {}, one_run=None)
    assert config.hyperparameters.sampling_rate == 1.0 and config.hyperparameters.steps == 32
    assert config.pooled_runs == 16 and config.canaries.m == 8000
    # The known issue and the variants: that audit alone (dpverify.gate.structure_audit_only).
    assert [audit.implementation_name for audit in gate_audits(infos, worlds="none") if not audit.every_update] == ["opacus-dpcr-tree"]


def test_dpcr_paths_draw_their_batches_with_opacus_dataloader():
    """make_private(poisson_sampling=True) swaps the loader for Opacus' DPDataLoader: the fixed-batch world, which
    reads only the sampler, runs once for it, on the first of its users."""
    from dpverify.gate import gate_audits

    infos = [impl.info for impl in dpverify_opacus.dpcr_implementations()]
    assert {info.sampler for info in infos} == {dpverify_opacus.POISSON_SAMPLER}
    ghost = next(impl.info for impl in dpverify_opacus.implementations() if impl.info.name == "opacus-ghost")
    worlds = [(audit.implementation_name, audit.world) for audit in gate_audits([ghost, *infos]) if audit.world == "fixed_batch"]
    assert worlds == [("opacus-ghost", "fixed_batch")]


def _audit(name: str, seed: int):
    """The gate's full-batch every-update audit (16 runs of 500 Dirac canaries, 32 steps, ε 4; about 12 CPU-s;
    a quarter of its canaries cannot show the claimed ε 4 at all)."""
    config = every_update_config("quick", {}, correlated=True)
    return run_audit(_implementation(name), config.with_overrides(seed=seed, confidence=CONFIDENCE))


@pytest.mark.slow
def test_the_librarys_own_claim_is_refuted_a_known_issue():
    """opacus-dpcr's accountant states σ at every step while its tree leaks 2.17 times that μ (the scores reach
    about 1.85 of the claimed signal): at 8 runs refuted on 4 of 5 seeds, at this setting's 16 on 5 of 5
    (benchmarks/results/opacus-dpcr.md; the main job's own audit of it at p 8e-6). The default gate audits it too
    (every-update[opacus-dpcr])."""
    result = _audit("opacus-dpcr", seed=0)
    assert result.verdict == "violation" and result.curve_refuted, result.summary()


@pytest.mark.slow
def test_the_tree_claimed_as_the_mechanism_it_is_passes():
    """A true claim is refuted with probability at most 1 − CONFIDENCE = 1 % (the score reads the release, not the bits);
    it passed on 5 of 5 seeds (benchmarks/results/opacus-dpcr.md)."""
    result = _audit("opacus-dpcr-tree", seed=0)
    assert result.verdict == "pass", result.summary()


@pytest.mark.slow
def test_the_realised_batch_worlds_datasets_train_with_the_designated_normaliser():
    """Its datasets have fewer records than batches, where DPCREngine.make_private's own DPCROptimizer divides by
    Opacus' int(N·q) = 0: the optimizer is wrapped once the designated normaliser is set (about 1.5 s)."""
    from dpverify.config import gate_world_config

    result = run_audit(_implementation("opacus-dpcr-tree"), gate_world_config("quick", "realised_batch", {}).with_overrides(seed=0))
    assert result.verdict == "pass", result.summary()
