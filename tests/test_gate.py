"""The default gate: which two-world audits each implementation gets, how pytest collects and counts them,
and that they find a third party's normaliser bugs without any option."""

import json
import re

import pytest

from dpverify.canaries.worlds import WORLDS, World, dataset_size_worlds, register_world
from dpverify.config import EVERY_UPDATE_EPOCHS_SETTING, EVERY_UPDATE_SETTING, one_run_full_batch, profile_config, TWO_WORLD_RUNS_SCALE, every_update_config, two_world_config
from dpverify.contract import ImplementationInfo, LayerArchitecture, MLPArchitecture
from dpverify.gate import EVERY_UPDATE_BUGS, applicable_worlds, every_update_applies, gate_audits
from tests.test_plugin import CONFTEST, REPO, run

PRIVATE = ImplementationInfo(name="mine", library="numpy")
WITH_MICROBATCHES = ImplementationInfo(name="micro", library="numpy", microbatches=True)
KNOWN = ImplementationInfo(name="known", library="numpy", expected="known-issue", issue="https://example.org/1")
#: A path expected private whose release has a known issue only its linear_3d design finds.
LAYER_ISSUE = "https://example.org/3d"
LAYERED = ImplementationInfo(name="layered", library="numpy", layers=("embedding", "linear_3d"), layer_issues=(("linear_3d", LAYER_ISSUE),))


def _variant(row: int, detectability: str = "D3") -> ImplementationInfo:
    return ImplementationInfo(
        name=f"row-{row}", library="numpy", expected="violation", breaks="a rule", bug=row, detectability=detectability
    )


def test_private_implementations_get_every_world_but_microbatches_unless_they_have_them():
    assert applicable_worlds(PRIVATE) == ("dataset_size", "fixed_batch", "realised_batch", "worst_case_record")
    assert applicable_worlds(KNOWN) == applicable_worlds(PRIVATE)
    assert applicable_worlds(WITH_MICROBATCHES) == (
        "dataset_size", "fixed_batch", "microbatch", "realised_batch", "worst_case_record"
    )  # fmt: skip


@pytest.mark.parametrize(
    "row, worlds",
    [(1, ()), (6, ("worst_case_record",)), (7, ("dataset_size", "realised_batch")), (9, ("fixed_batch",)), (11, ("microbatch",)),
     (12, ("worst_case_record",))],
)  # fmt: skip
def test_a_buggy_variant_gets_the_worlds_built_for_its_row(row, worlds):
    assert applicable_worlds(_variant(row)) == worlds


def test_language_models_get_no_world():
    assert applicable_worlds(ImplementationInfo(name="lm", library="numpy", task="language")) == ()


def test_gate_audits_put_each_one_run_audit_before_its_every_update_audit_and_worlds_and_count_only_private_ones():
    audits = gate_audits([PRIVATE, _variant(7), _variant(8)], worlds="applicable")
    assert [a.test_name for a in audits] == [
        "dp-audit[mine]",
        "every-update[mine]",
        "two-world[mine-dataset_size]",
        "two-world[mine-fixed_batch]",
        "two-world[mine-realised_batch]",
        "two-world[mine-worst_case_record]",
        "dp-audit[row-7]",
        "two-world[row-7-dataset_size]",
        "two-world[row-7-realised_batch]",
        "dp-audit[row-8]",
        "every-update[row-8]",
    ]
    assert [a.counted for a in audits] == [True] * 6 + [False] * 5
    assert len({a.seed_key for a in audits}) == len(audits) and audits[0].seed_key == "mine"
    assert [a.test_name for a in gate_audits([PRIVATE], worlds="none")] == ["dp-audit[mine]", "every-update[mine]"]
    assert [a.test_name for a in gate_audits([PRIVATE], worlds="none", every_update=False)] == ["dp-audit[mine]"]
    chosen = gate_audits([PRIVATE, WITH_MICROBATCHES], worlds=("microbatch",), every_update=False)
    assert [a.test_name for a in chosen] == ["dp-audit[mine]", "dp-audit[micro]", "two-world[micro-microbatch]"]


def test_shuffled_fixed_batches_get_their_world_instead_of_a_full_batch_one_run_audit():
    """At q = 1 fixed batches are the whole dataset (the Poisson twin's mechanism): the one-run audit is
    left out where the fixed-batch world runs, and kept where it does not or where the one-run audits
    subsample (the paper profile)."""
    shuffled = ImplementationInfo(name="shuffled", library="numpy", expected="known-issue", issue="https://example.org/9", bug=9)
    assert [a.test_name for a in gate_audits([shuffled])] == ["two-world[shuffled-fixed_batch]"]
    assert [a.test_name for a in gate_audits([_variant(9)])] == ["two-world[row-9-fixed_batch]"]
    assert [a.test_name for a in gate_audits([shuffled], worlds="none")] == ["dp-audit[shuffled]"]
    assert [a.test_name for a in gate_audits([shuffled], full_batch=False)] == [
        "dp-audit[shuffled]", "two-world[shuffled-fixed_batch]"
    ]  # fmt: skip
    assert one_run_full_batch("quick", {}) and one_run_full_batch("standard", {"m": 2000})
    assert not one_run_full_batch("paper", {}) and not one_run_full_batch("quick", {"sampling_rate": 0.5})


def test_the_fixed_batch_world_runs_once_per_sampler_on_its_first_private_user():
    """The world asks only whether the sampler draws what the accountant assumes: implementations that
    name the same sampler share one run of it, taken by the first expected private; a variant or known
    issue of the world's own row keeps it, and named worlds run as named."""
    def sampled(name, **fields):
        return ImplementationInfo(name=name, library="numpy", sampler="loader", **fields)

    known = sampled("a-known", expected="known-issue", issue="https://example.org/1")
    row_9 = sampled("a-row-9", expected="known-issue", issue="https://example.org/9", bug=9)
    infos = [known, row_9, sampled("b-private"), sampled("c-private"), PRIVATE]
    fixed = [a.test_name for a in gate_audits(infos, every_update=False) if a.world == "fixed_batch"]
    assert fixed == ["two-world[a-row-9-fixed_batch]", "two-world[b-private-fixed_batch]", "two-world[mine-fixed_batch]"]
    others = [a for a in gate_audits(infos, every_update=False) if a.world not in (None, "fixed_batch")]
    assert len(others) == 3 * 4  # every other world still runs on each
    assert [a.test_name for a in gate_audits([known], worlds=("fixed_batch",))] == [
        "dp-audit[a-known]", "two-world[a-known-fixed_batch]"
    ]  # fmt: skip
    named = gate_audits(infos, worlds=("fixed_batch",), every_update=False)
    assert len([a for a in named if a.world == "fixed_batch"]) == 5


def test_a_samplers_world_runs_on_the_user_that_needs_the_fewest_packages():
    """An add-on's path that shares the library's sampler (opacus-dpcr's DPDataLoader) and sorts first does not
    take its world: a missing extra would skip it, and with it the sampler's only run of the world."""
    add_on = ImplementationInfo(name="a-add-on", library="numpy", sampler="loader", requires=("numpy", "add_on"))
    core = ImplementationInfo(name="b-core", library="numpy", sampler="loader", requires=("numpy",))
    fixed = [a.test_name for a in gate_audits([add_on, core], every_update=False) if a.world == "fixed_batch"]
    assert fixed == ["two-world[b-core-fixed_batch]"]


def test_a_world_is_added_by_its_record_alone():
    """One :func:`register_world` call is all the gate, the options, the configuration and the strategies
    need: the record's rows, needs and quick setting reach each of them."""
    from hypothesis import find

    from dpverify.pytest.options import _worlds
    from dpverify.strategies import two_world_configs

    setting = dict(WORLDS["dataset_size"].quick_setting, runs=12)
    toy = World(name="toy_size", maker=dataset_size_worlds, bugs=(7,), quick_setting=setting, needs=("microbatches",))
    with pytest.raises(ValueError, match="registered already"):
        register_world(WORLDS["dataset_size"])
    with pytest.raises(ValueError, match="toy_size world's quick_setting lacks learning_rate"):
        World(name="toy_size", maker=dataset_size_worlds, bugs=(7,), quick_setting={k: v for k, v in setting.items() if k != "learning_rate"})
    with pytest.raises(ValueError, match="normaliser"):
        World(name="toy_size", maker=dataset_size_worlds, bugs=(7,), quick_setting=setting, normaliser="dataset_size")
    register_world(toy)
    try:
        assert "toy_size" in applicable_worlds(_variant(7)) and "toy_size" in applicable_worlds(WITH_MICROBATCHES)
        assert "toy_size" not in applicable_worlds(PRIVATE)  # it needs microbatches
        assert two_world_config("quick", "toy_size").worlds.runs == 12
        assert _worlds("toy_size") == ("toy_size",)
        assert find(two_world_configs(worlds=("toy_size",)), lambda config: True).world == "toy_size"
    finally:
        del WORLDS["toy_size"]


def test_every_classifier_expected_private_gets_the_every_update_audit_and_variants_and_known_issues_of_row_8():
    assert every_update_applies(PRIVATE) and not every_update_applies(KNOWN)  # KNOWN names no docs/bugs.md class
    row_8 = ImplementationInfo(name="k8", library="numpy", expected="known-issue", issue="https://example.org/8", bug=8)
    assert every_update_applies(row_8)
    assert [row for row in range(1, 17) if every_update_applies(_variant(row))] == list(EVERY_UPDATE_BUGS) == [8, 13, 14, 15, 16]
    assert not every_update_applies(ImplementationInfo(name="lm", library="numpy", task="language"))


def test_a_layer_designs_known_issue_is_that_audits_alone_and_every_other_audit_stays_private_and_counted():
    """The every-update audit, the worlds and the other layer designs of the path run and count as for any
    path expected private, so that a new bug there still fails; only the design that finds the issue expects it."""
    audits = {a.test_name: (a.expected, a.counted) for a in gate_audits([LAYERED])}
    assert audits.pop("layer[layered-linear_3d]") == ("known-issue", False)
    assert list(audits) == [a.test_name for a in gate_audits([ImplementationInfo(name="layered", library="numpy", layers=("embedding",))])]
    assert "every-update[layered]" in audits and "two-world[layered-fixed_batch]" in audits
    assert set(audits.values()) == {("private", True)}
    assert LAYERED.for_layer(None) is LAYERED.for_layer("embedding") is LAYERED


def test_an_audit_of_the_layer_design_sees_a_view_of_the_implementation_with_that_known_issue():
    from tests.doubles import Oblivious

    implementation = Oblivious(info=LAYERED)
    view = implementation.audited_in(LayerArchitecture(layer="linear_3d"))
    assert type(view) is Oblivious and view.claimed_epsilon == implementation.claimed_epsilon
    assert (view.info.expected, view.info.issue, view.info.layers) == ("known-issue", LAYER_ISSUE, LAYERED.layers)
    assert implementation.info is LAYERED  # the registered implementation is left as it is
    assert implementation.audited_in(LayerArchitecture(layer="embedding")) is implementation
    assert implementation.audited_in(MLPArchitecture()) is implementation


@pytest.mark.parametrize(
    "fields, message",
    [(dict(layers=("embedding",), layer_issues=(("linear_3d", LAYER_ISSUE),)), "name the layer design 'linear_3d', which is not one of its layers"),
     (dict(layers=("linear_3d",), layer_issues=(("linear_3d", ""),)), "each of layer_issues is .layer, the upstream report's address."),
     (dict(layers=("linear_3d",), layer_issues=(("linear_3d", LAYER_ISSUE), ("linear_3d", LAYER_ISSUE))), "more than once"),
     (dict(layers=("linear_3d",), layer_issues=(("linear_3d", LAYER_ISSUE),), expected="known-issue", issue=LAYER_ISSUE),
      "layer_issues go with expected='private'")],
)  # fmt: skip
def test_layer_issues_name_the_implementations_own_layers_with_an_address(fields, message):
    with pytest.raises(ValueError, match=message):
        ImplementationInfo(name="layered", library="numpy", **fields)


def test_the_every_update_config_designates_q_below_one_and_takes_only_its_gate_settings():
    config = every_update_config("quick", {"m": 400, "pooled_runs": 2, "epsilon": 8.0, "epochs": 50})
    assert config.observe == "every_update" and config.design == "inclusion"
    assert config.hyperparameters.sampling_rate == EVERY_UPDATE_SETTING["sampling_rate"] < 1
    assert config.hyperparameters.noise_multiplier == EVERY_UPDATE_SETTING["noise_multiplier"]
    assert config.hyperparameters.epochs == EVERY_UPDATE_SETTING["epochs"]  # the one-run audits' setting, not its
    assert (config.canaries.m, config.pooled_runs, config.canaries.dimension) == (400, 2, 200)
    assert every_update_config("mlp", {}).architecture.is_softmax_regression


def test_correlated_noise_gets_its_every_update_audit_at_the_full_batch():
    """An implementation whose claim states a noise structure is audited at q = 1 over 32 steps (where the
    score decorrelates by the stated strategy exactly), the profile's every-update runs of 500 canaries; the others keep
    the q < 1 design."""
    correlated = ImplementationInfo(name="mf", library="numpy", correlated_noise=True)
    audits = [a for a in gate_audits([correlated, ImplementationInfo(name="sgd", library="numpy")]) if a.every_update]
    assert [(a.implementation_name, a.correlated) for a in audits] == [("mf", True), ("sgd", False)]
    config = audits[0].config("quick", {"epochs": 50}, one_run=None)
    assert (config.hyperparameters.sampling_rate, config.hyperparameters.epochs) == (1.0, 32)
    assert (config.canaries.m, config.pooled_runs) == (500 * 16, 16)
    assert audits[1].config("quick", {}, one_run=None).hyperparameters.sampling_rate == EVERY_UPDATE_SETTING["sampling_rate"]


def test_correlated_noise_without_sampling_gets_epochs_and_no_fixed_batch_world():
    """An implementation that samples nothing (DP-FTRL) is audited in epochs of 4 steps, 8 of them, at the
    design's own learning rate; the fixed-batch world, which asks what a Poisson sampler does, is not its."""
    ftrl = ImplementationInfo(name="ftrl", library="numpy", correlated_noise=True, amplified=False, sampler="epochs")
    audits = gate_audits([ftrl])
    assert "fixed_batch" not in applicable_worlds(ftrl) and "fixed_batch" in applicable_worlds(PRIVATE)
    assert not any(a.world == "fixed_batch" for a in audits)
    (every_update,) = [a for a in audits if a.every_update]
    config = every_update.config("quick", {}, one_run=None)
    hp = config.hyperparameters
    assert (hp.sampling_rate, hp.epochs, hp.steps) == (0.25, 8, 32) and hp.noise_multiplier is None
    assert (hp.target_epsilon, hp.learning_rate) == (EVERY_UPDATE_EPOCHS_SETTING["epsilon"], EVERY_UPDATE_EPOCHS_SETTING["learning_rate"])
    assert (config.canaries.m, config.pooled_runs) == (500 * 16, 16)


def test_a_correlated_noise_finding_gets_its_every_update_audit_in_place_of_its_one_run_audit():
    """A variant or known issue of a correlated-noise row whose claim states its structure gets the audit that
    reads that structure; one that states none (its every-update audit is DP-SGD's, at q < 1) keeps both, and with the
    every-update audits off the one-run audit stays."""
    stated = ImplementationInfo(name="mf-bug", library="numpy", expected="violation", breaks="a rule", bug=13, detectability="D2", correlated_noise=True)
    unstated = ImplementationInfo(name="tree-bug", library="numpy", expected="violation", breaks="a rule", bug=16, detectability="D2")
    correct = ImplementationInfo(name="mf", library="numpy", correlated_noise=True)
    shipped = ImplementationInfo(name="mf-shipped", library="numpy", expected="known-issue", issue="https://example.org/2", bug=13, correlated_noise=True)
    names = [a.test_name for a in gate_audits([correct, stated, shipped, unstated], worlds="none")]
    assert names == [
        "dp-audit[mf]", "every-update[mf]", "every-update[mf-bug]", "every-update[mf-shipped]", "dp-audit[tree-bug]",
        "every-update[tree-bug]",
    ]  # fmt: skip
    assert [a.test_name for a in gate_audits([stated], every_update=False)] == ["dp-audit[mf-bug]"]


@pytest.mark.parametrize(
    "worlds, message",
    [("some", "worlds must be one of applicable, none or world names, got 'some'"), (("shuffle",), "unknown world(s) shuffle")],
)
def test_gate_audits_name_a_bad_world_choice(worlds, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gate_audits([PRIVATE], worlds=worlds)


def test_two_world_config_designates_the_world_and_scales_runs_by_profile():
    quick = two_world_config("quick", "realised_batch")
    setting = WORLDS["realised_batch"].quick_setting
    assert quick.design == "two_world" and quick.worlds.world == "realised_batch"
    assert quick.architecture.is_softmax_regression
    assert quick.hyperparameters.noise_multiplier == setting["noise_multiplier"]
    assert quick.hyperparameters.target_epsilon is None
    assert quick.worlds.runs == setting["runs"]
    assert two_world_config("standard", "realised_batch").worlds.runs == setting["runs"] * TWO_WORLD_RUNS_SCALE["standard"]
    assert two_world_config("quick", "realised_batch", runs=7).worlds.runs == 7
    with pytest.raises(ValueError, match="take only runs, records, outputs, device, timeout, got m"):
        two_world_config("quick", "realised_batch", m=10)


def test_a_two_world_design_asked_for_by_name_is_the_worlds_own_design():
    """`dpverify audit X --design two_world --set world=fixed_batch` (and the marker's design="two_world")
    audits the world as the gate does, not the profile's canary setting under the world's name; the CLI
    then designates no target ε (the world designates σ)."""
    from dpverify.cli import _overrides, _parser

    asked = profile_config("quick", design="two_world", world="fixed_batch", runs=40)
    assert asked == two_world_config("quick", "fixed_batch", runs=40)
    assert profile_config("quick", design="two_world") == two_world_config("quick", "dataset_size")
    args = _parser().parse_args(["audit", "reference-dpsgd", "--design", "two_world", "--set", "world=fixed_batch"])
    assert "epsilon" not in _overrides(args)
    args = _parser().parse_args(["audit", "reference-dpsgd", "--set", "world=fixed_batch"])
    assert _overrides(args)["epsilon"] == 2.0


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\ndp_audit_seed = 11\n")
    return pytester


def test_pytest_collects_a_two_world_item_per_applicable_world_selectable_by_k_and_m(project):
    result = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "dp-audit::dp-audit[[]third-party-private[]]",
            "dp-audit::every-update[[]third-party-private[]]",
            "dp-audit::two-world[[]third-party-private-dataset_size[]]",
            "dp-audit::two-world[[]third-party-private-fixed_batch[]]",
            "dp-audit::two-world[[]third-party-private-realised_batch[]]",
            "dp-audit::two-world[[]third-party-private-worst_case_record[]]",
            "*6 tests collected*",
        ]
    )
    only_worlds = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--collect-only",
                      "-q", "-m", "dp_audit_two_world")  # fmt: skip
    only_worlds.stdout.fnmatch_lines(["*4/6 tests collected (2 deselected)*"])
    every = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--collect-only",
                "-q", "-m", "dp_audit_every_update")  # fmt: skip
    every.stdout.fnmatch_lines(["dp-audit::every-update[[]third-party-private[]]", "*1/6 tests collected (5 deselected)*"])
    one = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--collect-only", "-q",
              "-k", "realised_batch")  # fmt: skip
    one.stdout.fnmatch_lines(["dp-audit::two-world[[]third-party-private-realised_batch[]]", "*1/6 tests collected*"])
    none = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--dp-audit-worlds=none",
               "--collect-only", "-q")  # fmt: skip
    none.stdout.fnmatch_lines(["*2 tests collected*"])


def test_an_every_update_audit_of_a_trainer_that_hands_nothing_over_is_counted_and_skipped_as_not_run(project, tmp_path):
    report = tmp_path / "report.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "-m", "dp_audit_every_update",
                 "-rs", f"--dp-audit-report={report}")  # fmt: skip
    result.assert_outcomes(skipped=1, deselected=5)
    result.stdout.fnmatch_lines(["*Not run: third-party-private: the trainer handed over no updates*"])
    data = json.loads(report.read_text())
    assert data["planned_audits"] == 1 and data["audits"][0]["observed"] == "every update"
    off = run(project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--dp-audit-every-update=false",
              "--collect-only", "-q")  # fmt: skip
    off.stdout.fnmatch_lines(["*5 tests collected*"])


def test_a_bad_worlds_option_is_a_usage_error_naming_it(project):
    result = run(project, "--dp-audit", "--dp-audit-worlds=shuffle")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dp-audit-worlds='shuffle' is invalid: worlds must be applicable or none or names*"])


THIRD_PARTY = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from dpverify.registry import register_implementation
from tests.third_party import ThirdPartyDPSGD

for normaliser in ("designated", "dataset", "realised"):
    register_implementation(ThirdPartyDPSGD(f"theirs-{{normaliser}}", normaliser))
"""


@pytest.mark.slow
def test_the_default_gate_finds_a_third_partys_normaliser_bugs_and_passes_the_designated_one(pytester):
    """Without any option: the dataset-size and realised-batch worlds refute both normalisers that read the
    private data (each separates the worlds in every run measured, benchmarks/results/two-world-gate.md),
    and pass the one that divides by the designated q·|D|."""
    pytest.importorskip("torch")
    pytester.makeconftest(THIRD_PARTY)
    result = run(pytester, "--dp-audit", "--dp-audit-seed=3", "-k", "dataset_size or realised_batch")
    result.assert_outcomes(passed=2, failed=4, deselected=12)
    for bug in ("dataset", "realised"):
        for world in ("dataset_size", "realised_batch"):
            result.stdout.fnmatch_lines([f"FAILED dp-audit::two-world[[]theirs-{bug}-{world}[]]*"])
    assert result.stdout.str().count("verdict VIOLATION (two_world design") >= 4


SHUFFLING_THIRD_PARTY = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from dpverify.registry import register_implementation
from tests.third_party import ThirdPartyDPSGD

for batches in ("poisson", "shuffled"):
    register_implementation(ThirdPartyDPSGD(f"theirs-{{batches}}", "designated", batches=batches))
"""


@pytest.mark.slow
def test_the_default_gate_refutes_a_third_partys_shuffled_batches_and_passes_its_poisson_twin(pytester):
    """Without any option: the fixed-batch world, whose adversary sees every update the trainer hands over,
    refutes fixed-size batches of a shuffled dataset accounted as Poisson (the ideal mechanism at this
    setting is refuted at every seed in simulation, benchmarks/results/every-update-fixed-batch.md) and
    passes Poisson sampling (a false alarm has probability at most the audit's level)."""
    pytest.importorskip("torch")
    pytester.makeconftest(SHUFFLING_THIRD_PARTY)
    result = run(pytester, "--dp-audit", "--dp-audit-seed=1", "-k", "fixed_batch")
    result.assert_outcomes(passed=1, failed=1, deselected=10)
    result.stdout.fnmatch_lines(["FAILED dp-audit::two-world[[]theirs-shuffled-fixed_batch[]]*"])


LEAKY_LAYERS = CONFTEST + f"""
register_implementation(GaussianMechanism(signal=3.0, info=ImplementationInfo(
    name="leaky-layers", library="numpy", layers=("embedding", "linear_3d"), layer_issues=(("linear_3d", {LAYER_ISSUE!r}),))))
"""


def test_pytest_finds_a_layer_designs_known_issue_and_fails_a_violation_in_the_paths_other_audits(pytester, tmp_path):
    """The mechanism's canaries carry three times the claimed signal, a leak every design shows: the linear_3d audit reports it as the known issue found again (a
    warning, no failure and no xfail), the one-run audit and the embedding design fail as a refuted private path."""
    pytester.makeconftest(LEAKY_LAYERS)
    report = tmp_path / "r.json"
    result = run(pytester, "--dp-audit", "--dp-audit-implementations=leaky-layers", "--dp-audit-worlds=none",
                 "--dp-audit-every-update=false", "--dp-audit-seed=11", f"--dp-audit-report={report}")  # fmt: skip
    result.assert_outcomes(passed=1, failed=2)  # and no xfail
    result.stdout.fnmatch_lines([f"*KnownIssueFound: known issue {LAYER_ISSUE} found again*"])
    for name in ("dp-audit[[]leaky-layers[]]", "layer[[]leaky-layers-embedding[]]"):  # a DPViolation's message and rerun
        result.stdout.fnmatch_lines(["leaky-layers: verdict VIOLATION*", f"Reproduce with: pytest --dp-audit*dp-audit::{name}*"])
    result.stdout.fnmatch_lines(["FAILED dp-audit::dp-audit[[]leaky-layers[]]*", "FAILED dp-audit::layer[[]leaky-layers-embedding[]]*"])
    data = json.loads(report.read_text())
    entries = {a["nodeid"].split("::")[-1]: a for a in data["audits"]}
    assert {name: (a["expected"], a["issue"], a["counted"], a["verdict"]) for name, a in entries.items()} == {
        "dp-audit[leaky-layers]": ("private", None, True, "violation"),
        "layer[leaky-layers-embedding]": ("private", None, True, "violation"),
        "layer[leaky-layers-linear_3d]": ("known-issue", LAYER_ISSUE, False, "violation"),
    }
    assert data["planned_audits"] == 2


def test_the_command_line_judges_and_reports_a_layer_designs_known_issue_as_pytest_does(tmp_path, capsys):
    from dpverify.cli import main
    from dpverify.registry import register_implementation, unregister_implementation
    from tests.doubles import GaussianMechanism

    register_implementation(GaussianMechanism(signal=3.0, info=LAYERED))
    try:
        assert main(["list"]) == 0
        assert f"private; known issue {LAYER_ISSUE} in linear_3d" in capsys.readouterr().out
        status = main(["audit", "layered", "--worlds", "none", "--every-update", "off", "--seed", "3", "--report", str(tmp_path / "r.json")])
    finally:
        unregister_implementation("layered")
    assert status == 1  # the one-run audit and the embedding design: a path expected private refuted
    marks = {a["nodeid"]: (a["expected"], a["issue"], a["counted"]) for a in json.loads((tmp_path / "r.json").read_text())["audits"]}
    assert marks == {
        "dpverify audit layered": ("private", None, True),
        "dpverify audit layered layer embedding": ("private", None, True),
        "dpverify audit layered layer linear_3d": ("known-issue", LAYER_ISSUE, False),
    }
    assert re.search(r"layered layer linear_3d .* violation K ", capsys.readouterr().out)


def test_the_dp_audit_fixture_judges_an_audit_of_the_layer_design_by_its_known_issue(pytester):
    pytester.makeconftest(LEAKY_LAYERS)
    pytester.makepyfile(
        """
        import pytest
        from dpverify.config import layer_config
        from dpverify.pytest.fixture import KnownIssueFound
        from dpverify.results import DPViolation

        def test_the_design_that_finds_it(dp_audit):
            with pytest.warns(KnownIssueFound, match="known issue https://example.org/3d found again"):
                assert dp_audit("leaky-layers", config=layer_config("quick", "linear_3d")).verdict == "violation"

        def test_another_design(dp_audit):
            with pytest.raises(DPViolation):
                dp_audit("leaky-layers", config=layer_config("quick", "embedding"))
        """
    )
    run(pytester, "--dp-audit", "--dp-audit-implementations=none", "--dp-audit-seed=11").assert_outcomes(passed=2)


def test_the_default_gate_selection_is_written_once():
    """pyproject.toml's dp_audit_implementations is the selection of both gates: the pytest plugin reads it as
    its ini value, and scripts/gate_selection.py reads it from there for scripts/audit.sh (the main job) and
    for scripts/test.sh's JAX run (its exclusions), neither of which keeps a copy."""
    import subprocess
    import sys
    import tomllib

    from dpverify.session import selected_by

    selection = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["dp_audit_implementations"]
    patterns = [pattern.strip() for pattern in selection.split(",")]

    def printed(*arguments: str) -> list[str]:
        command = [sys.executable, str(REPO / "scripts" / "gate_selection.py"), *arguments]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()

    assert printed() == patterns
    assert printed("--exclusions") == [pattern for pattern in patterns if pattern.startswith("!")]
    for name in ("audit.sh", "test.sh"):
        script = (REPO / "scripts" / name).read_text()
        assert "scripts/gate_selection.py" in script, name
        assert not [pattern for pattern in patterns[1:] if pattern.removeprefix("!") in script], name  # no copy
    assert patterns[0] == "*" and selected_by(patterns, "opacus-ghost")
    assert not selected_by(patterns, "jax-privacy-keras-no-noise") and not selected_by(patterns, "opacus-lm-hooks-clip-2c")
