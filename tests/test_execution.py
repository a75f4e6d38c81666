"""Executors: checked at the door, and a two-world audit gives the same scores, bit for bit, in-process, in
a pool of spawned processes and on a local Ray cluster; an implementation that cannot travel says so."""

import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pytest

from dpverify.audits.two_world import run_two_world_audit
from dpverify.canaries.worlds import dataset_size_worlds
from dpverify.contract import DPHyperparameters, Implementation, ImplementationInfo, MLPArchitecture, TrainingRequest
from dpverify.execution import EXECUTORS, ExecutorSpec, InProcessExecutor, ProcessPoolExecutor, UnportableObject, chunks
from dpverify.registry import get_implementation
from dpverify.session import AuditSession
from tests.doubles import Oblivious

WORLD = dataset_size_worlds(records=2, num_classes=8)
HYPERPARAMETERS = DPHyperparameters(noise_multiplier=2.0, sampling_rate=1.0, epochs=1, learning_rate=1.0, delta=1e-5)
RUNS = 20


def audit(implementation, executor, **settings):
    return run_two_world_audit(
        implementation, world=WORLD, runs=RUNS, hyperparameters=HYPERPARAMETERS,
        architecture=MLPArchitecture(hidden_width=16), seed=5, device="cpu", executor=executor, **settings,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as executor:
        yield executor


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(workers=0), "workers must be an integer >= 1, got 0"),
        (dict(workers=True), "workers must be an integer >= 1, got True"),
        (dict(executor="threads"), "executor must be one of 'inprocess', 'pool', 'ray', got 'threads'"),
        (dict(executor="inprocess", workers=2), "workers=2 needs executor 'pool' or 'ray'"),
        (dict(workers=2, ray_address="auto"), "ray_address='auto' needs executor 'ray', got 'pool'"),
        (dict(executor="ray", workers=2, ray_address="auto"), "a cluster at ray_address has its own size"),
    ],
)
def test_a_bad_executor_is_refused_at_the_door(settings, message, monkeypatch):
    monkeypatch.setattr("dpverify.execution._check_ray", lambda: None)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ExecutorSpec(**settings)


def test_the_ray_executor_without_ray_says_what_to_install(monkeypatch):
    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ValueError, match=r"the ray executor needs Ray: pip install 'dpverify\[ray\]'"):
        ExecutorSpec(executor="ray")


def test_the_spec_picks_the_executor_it_names():
    assert ExecutorSpec().kind == "inprocess" and isinstance(ExecutorSpec().start(), InProcessExecutor)
    assert ExecutorSpec(workers=3).kind == "pool"
    with ExecutorSpec(workers=3).start() as executor:
        assert isinstance(executor, ProcessPoolExecutor) and executor.parallelism == 3


def test_the_plugin_offers_every_executor():
    from dpverify.pytest.options import SETTINGS_BY_NAME

    assert SETTINGS_BY_NAME["executor"].parse("ray") == "ray" and set(EXECUTORS) == {"inprocess", "pool", "ray"}
    with pytest.raises(ValueError, match="must be an integer >= 1, got 0"):
        SETTINGS_BY_NAME["workers"].parse("0")


@pytest.mark.parametrize("count, parallelism", [(0, 1), (3, 1), (40, 1), (40, 2), (2001, 8)])
def test_chunks_cover_every_run_once_in_order(count, parallelism):
    parts = chunks(count, parallelism=parallelism)
    assert [i for part in parts for i in part] == list(range(count))
    assert len(parts) == min(count, max(10, 4 * parallelism)) and all(len(part) for part in parts)


def test_one_executor_per_session_shut_down_at_its_end():
    session = AuditSession(
        enabled=True, profile="quick", confidence=0.95, seed=0, device="cpu", epsilon=2.0, implementations=(),
        report_path=None, plots_dir=None, executor=ExecutorSpec(workers=2),
    )  # fmt: skip
    executor = session.executor_for_audits()
    assert session.executor_for_audits() is executor
    session.close()
    assert session.executor_for_audits() is not executor
    session.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference-dpsgd", "opacus-ghost"])
def test_a_pool_gives_the_same_scores_bit_for_bit(name, pool):
    implementation = get_implementation(name)
    if implementation.unavailable_reason():
        pytest.skip(implementation.unavailable_reason())
    here, there = audit(implementation, InProcessExecutor()), audit(implementation, pool)
    assert here.verdict == there.verdict != "error", (here.error, there.error)
    assert np.array_equal(here.scores_d, there.scores_d) and np.array_equal(here.scores_dprime, there.scores_dprime)
    assert here.claimed_epsilon == there.claimed_epsilon and here.bound.threshold == there.bound.threshold
    assert len(set(here.scores_d)) == RUNS  # every run its own seed


@pytest.mark.slow
def test_a_local_ray_cluster_gives_the_same_scores_bit_for_bit():
    ray = pytest.importorskip("ray", reason="the ray executor needs pip install 'dpverify[ray]'")
    from dpverify.execution import RayExecutor

    implementation = get_implementation("reference-dpsgd")
    if implementation.unavailable_reason():
        pytest.skip(implementation.unavailable_reason())
    here = audit(implementation, InProcessExecutor())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with RayExecutor() as executor:
            there = audit(implementation, executor)
        assert ray.is_initialized()  # a Ray it did not start is left running
    finally:
        ray.shutdown()
    assert there.verdict == here.verdict != "error", there.error
    assert there.scores_d == here.scores_d and there.scores_dprime == here.scores_dprime


@dataclass
class FailsOnSeed(Implementation):
    """:class:`Oblivious`, except that the run seeded ``seed`` raises."""

    seed: int = 0
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-fails-on-seed", library="numpy"))

    def train(self, request: TrainingRequest):
        if request.seed == self.seed:
            raise RuntimeError("diverged on this seed")
        return Oblivious().train(request)


def test_a_failing_run_ends_the_audit_alike_everywhere(pool):
    seventh = int(np.random.SeedSequence(5).generate_state(2 * RUNS, dtype=np.uint32)[6] % 2**31)
    here, there = (audit(FailsOnSeed(seed=seventh), executor) for executor in (InProcessExecutor(), pool))
    assert here.verdict == there.verdict == "error" and "diverged on this seed" in there.error
    assert here.scores_d == there.scores_d and len(here.scores_d) == 3 and len(there.scores_dprime) == 3


def test_an_implementation_that_does_not_pickle_gets_a_clear_error(pool):
    class Local(Oblivious):  # a class defined in a function pickles by reference to nothing
        pass

    with pytest.raises(UnportableObject, match=r"implementation 'test-oblivious' cannot run in worker processes: it does not pickle.*top level of a module"):
        audit(Local(), pool)
    assert audit(Local(), InProcessExecutor()).verdict != "error"  # in-process, it needs no pickling


def test_an_implementation_the_workers_cannot_import_gets_a_clear_error(pool, monkeypatch):
    module = types.ModuleType("dpverify_vanishing_conftest")  # as `dpverify audit --import conftest.py` loads one
    monkeypatch.setitem(sys.modules, module.__name__, module)
    module.Vanishing = type("Vanishing", (Oblivious,), {"__module__": module.__name__})
    with pytest.raises(UnportableObject, match=r"a worker process could not unpickle it \(ModuleNotFoundError.*register_implementation"):
        audit(module.Vanishing(), pool)


PIDS_CONFTEST = """
import os
from dataclasses import dataclass

from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import Oblivious


@dataclass
class Recording(Oblivious):
    '''Oblivious, writing the id of the process each run trains in.'''

    def train(self, request):
        with open(os.environ["PIDS_FILE"], "a") as pids:
            pids.write(f"{os.getpid()}\\n")
        return super().train(request)


register_implementation(Recording(info=ImplementationInfo(name="third-party-recording", library="numpy")))
"""


@pytest.mark.slow
def test_the_plugin_runs_a_conftest_implementation_in_its_workers(pytester, monkeypatch, tmp_path):
    import json
    import os

    pytester.makeconftest(PIDS_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.dp_audit(design="two_world", runs=20, records=2, outputs=8, hidden_width=0, epochs=1, noise_multiplier=2.0)
        def test_it(dp_audit):
            dp_audit("third-party-recording")
        """
    )
    monkeypatch.setenv("PIDS_FILE", str(tmp_path / "pids"))
    base = ("-p", "no:cacheprovider", "--dp-audit", "--dp-audit-seed=3", "--dp-audit-implementations=none")
    pytester.runpytest(*base, "--dp-audit-workers=0").stderr.fnmatch_lines(
        ["*command-line option --dp-audit-workers='0' is invalid: workers must be an integer >= 1, got 0*"]
    )
    pytester.runpytest(*base, "--dp-audit-ray-address=auto").stderr.fnmatch_lines(
        ["*--dp-audit-ray-address: ray_address='auto' needs executor 'ray', got 'inprocess'*"]
    )
    reports = {}
    for name, options in (("here", ()), ("pool", ("--dp-audit-workers=2",))):
        (tmp_path / "pids").write_text("")
        pytester.runpytest(*base, *options, f"--dp-audit-report={tmp_path / name}.json")
        pids = set((tmp_path / "pids").read_text().split())
        assert (pids == {str(os.getpid())}) == (name == "here") and len(pids) <= 2, pids
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())["audits"][0]
    assert reports["here"]["m"] == 20 and reports["here"]["verdict"] != "error", reports["here"]["error"]
    for key in ("verdict", "epsilon_lower_bound", "threshold", "claimed_epsilon", "guesses", "correct"):
        assert reports["here"][key] == reports["pool"][key]


def test_the_command_line_checks_its_executor_options(capsys):
    from dpverify.cli import main

    with pytest.raises(SystemExit):
        main(["audit", "reference-dpsgd", "--workers", "0"])
    assert "--workers must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["audit", "reference-dpsgd", "--ray-address", "auto"]) == 2
    assert "ray_address='auto' needs executor 'ray', got 'inprocess'" in capsys.readouterr().err


def pooled_audit(implementation, executor):
    from dpverify.audits import run_audit
    from dpverify.config import profile_config

    config = profile_config("quick", device="cpu", seed=7, m=600, pooled_runs=3)
    return run_audit(implementation, config, executor=executor)


@pytest.mark.slow
def test_pooled_runs_in_a_pool_give_the_same_audit_bit_for_bit(pool):
    implementation = get_implementation("reference-dpsgd")
    if implementation.unavailable_reason():
        pytest.skip(implementation.unavailable_reason())
    here, there = pooled_audit(implementation, InProcessExecutor()), pooled_audit(implementation, pool)
    assert here.verdict == there.verdict != "error", there.error
    assert np.array_equal(here.scores, there.scores) and np.array_equal(here.membership, there.membership)
    assert (here.epsilon_lower_bound, here.curve_p_value, here.curve_runs) == (there.epsilon_lower_bound, there.curve_p_value, 3)


def test_a_failing_pooled_run_ends_the_audit_alike_everywhere(pool):
    from dpverify.audits.membership import audit_streams

    second = audit_streams(7, run=1)[2]
    here, there = (pooled_audit(FailsOnSeed(seed=second), executor) for executor in (InProcessExecutor(), pool))
    assert here.verdict == there.verdict == "error" and here.error == there.error and "diverged on this seed" in there.error
