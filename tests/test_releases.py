"""The supported releases: the spec scripts/release.sh takes, the environments nox makes for them, the declared
ranges, and which ``make_private`` call each Opacus release gets, all without installing another release."""

import inspect
import re
import subprocess
import sys
import tomllib

import pytest

from dpverify.releases import environment_for, libraries, parse_release, releases
from dpverify_jaxprivacy._releases import missing_path as jax_missing_path
from dpverify_opacus._releases import (
    GHOST_LINEAR_BIAS_3D,
    GHOST_MAX_GRAD_NORM,
    installed_version,
    make_private_call,
    missing_path,
    parse_version,
)
from dpverify_tfprivacy._releases import DENSE_BIAS_3D, missing_step
from tests.test_plugin import REPO

OPACUS = [release.version for release in releases() if release.library.package == "opacus"]


@pytest.mark.parametrize(
    "spec, package, version",
    [("opacus==1.5.2", "opacus", "1.5.2"), ("opacus==1.5.0", "opacus", "1.5"), ("Opacus==1.4", "opacus", "1.4.0"),
     ("tensorflow_privacy==0.9.0", "tensorflow-privacy", "0.9.0"), ("jax-privacy==2.0", "jax-privacy", "2.0.0"),
     ("jax_privacy==1.0.0", "jax-privacy", "1.0.0")],
)  # fmt: skip
def test_a_spec_names_a_supported_release_as_the_index_spells_it(spec, package, version):
    release = parse_release(spec)
    assert (release.library.package, release.version) == (package, version)
    assert release.session == f"release({package}=={version})"


@pytest.mark.parametrize(
    "spec, message",
    [("opacus=1.5.2", "PACKAGE==VERSION"), ("opacus", "PACKAGE==VERSION"), ("opacus>=1.5", "PACKAGE==VERSION"),
     ("opacus==1.3.0", "supported: 1.4.0, 1.4.1, 1.5,"), ("opacus==1.7.0", "not a supported release"),
     ("jax-privacy==1.5.0", "supported: 1.0.0, 2.0.0"), ("tensorflow==2.15.1", "known: jax-privacy, opacus, tensorflow-privacy")],
)  # fmt: skip
def test_a_bad_spec_says_what_is_supported(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_release(spec)


def test_each_release_gets_its_own_environment_and_report():
    release = parse_release("opacus==1.5.2")
    assert release.envdir == ".venvs/release-opacus-1-5-2"  # nox's normalisation of "release(opacus==1.5.2)"
    assert release.report == "release-opacus-1.5.2.json"
    assert len({r.envdir for r in releases()}) == len(releases())


def test_the_release_replaces_its_pin_in_the_family_constraints():
    release = parse_release("jax-privacy==2.0.0")
    kept = release.constraints("jax==0.10.2\njax_privacy==2.0.0\nkeras==3.15.1\n# a comment\n")
    assert kept == "jax==0.10.2\nkeras==3.15.1\n# a comment\n"
    pins = (REPO / "constraints.txt").read_text()
    assert "opacus==" in pins and "opacus==" not in parse_release("opacus==1.4.0").constraints(pins)
    assert "torch==2.13.0" in parse_release("opacus==1.4.0").constraints(pins)
    assert release.requirements == ("jax-privacy==2.0.0",)


def test_a_release_whose_pins_conflict_with_the_familys_gets_its_own():
    """JAX-Privacy 1.0.0 pins jax 0.6.2 where the family pins 0.10.2: its own pins are installed with it and
    the family's pins of those packages leave the constraints; the others stay."""
    release = parse_release("jax-privacy==1.0.0")
    pins = (REPO / "constraints-jax.txt").read_text()
    assert release.requirements[0] == "jax-privacy==1.0.0"
    assert {"jax==0.6.2", "jaxlib==0.6.2", "keras==3.11.3"} <= set(release.requirements)
    kept = release.constraints(pins)
    assert "jax==0.10.2" in pins and not re.search(r"^(jax|jaxlib|keras|jax-privacy)==", kept, re.M)
    assert "dp-accounting==0.6.0" in kept and "numpy==" in kept


def test_the_declared_ranges_are_the_tested_ranges():
    """pyproject's extras bound each library by its first and last supported release (pin the only one)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    declared = {re.split("[=<>]", r)[0]: r for extra in extras.values() for r in extra}
    for library in libraries():
        first, last = library.versions[0], library.versions[-1]
        assert declared[library.package] == (f"{library.package}>={first},<={last}" if first != last else f"{library.package}=={first}")
        assert any(r.startswith(library.package) for r in extras[library.extra])  # its extra installs it


def test_the_plugins_describe_the_libraries_and_the_noxfile_reads_them_before_any_environment_exists():
    """Each library is its plugin's record; without numpy or an installed dpverify (nox's own environment,
    scripts/release.sh) the records are read from the source tree, the same ones."""
    assert [library.package for library in libraries()] == ["jax-privacy", "opacus", "tensorflow-privacy"]
    bare = subprocess.run(
        [sys.executable, "-S", "-c", "from dpverify.releases import releases; print(*[r.spec for r in releases()])"],
        cwd=REPO, env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert bare.stdout.split() == [release.spec for release in releases()]
    assert (environment_for("opacus"), environment_for("tf-privacy"), environment_for("jax-privacy")) == (
        ".venvs/torch", ".venvs/torch", ".venvs/jax"
    )  # fmt: skip
    assert environment_for("torch") == ".venvs/torch" and environment_for("ray") is None and environment_for(None) is None


@pytest.mark.parametrize(
    "version, mode, criterion, clipping, double_backward",
    [("1.4.0", "hooks", False, "flat", False), ("1.4.1", "hooks", False, "flat", False),
     ("1.5", "ghost", False, "ghost", True), ("1.5.2", "ghost", False, "ghost", True),
     ("1.5.2", "hooks", False, "flat", False), ("1.5.3", "ghost", True, "flat", False),
     ("1.5.4", "hooks", True, "flat", False), ("1.6.0", "ghost", True, "flat", False)],
)  # fmt: skip
def test_each_release_gets_the_make_private_call_its_documentation_shows(version, mode, criterion, clipping, double_backward):
    call = make_private_call(parse_version(version), mode)
    assert (call.criterion, call.clipping, call.double_backward) == (criterion, clipping, double_backward)


def test_a_path_a_release_lacks_is_named_with_the_reason_never_called():
    assert "first shipped in Opacus 1.5.0" in missing_path(parse_version("1.4.1"), "ghost")
    assert missing_path(parse_version("1.4.1"), "hooks") is None
    assert "first shipped in Opacus 1.5.3" in missing_path(parse_version("1.5.2"), "ghost", norm_sampler="embedding")
    assert missing_path(parse_version("1.5.3"), "ghost", norm_sampler="embedding") is None
    assert missing_path(parse_version("1.5"), "ghost", norm_sampler="linear_3d") is None
    with pytest.raises(ValueError, match="1.4 has no 'ghost' path"):
        make_private_call(parse_version("1.4.0"), "ghost")


def test_a_jax_privacy_path_1_0_0_lacks_is_named_with_the_reason():
    """1.0.0's Keras API has no Poisson sampling in fit and calls neither clipped_grad nor gaussian_privatizer:
    the Poisson Keras paths and every Keras variant are n/a there; its fixed-batch path and the core path
    (variants included) run; 2.0.0 has every path."""
    assert "first shipped in JAX-Privacy 2.0.0" in jax_missing_path((1,), "keras", poisson_in_fit=True, variant=False)
    assert "DpsgdGradientComputer" in jax_missing_path((1,), "keras", poisson_in_fit=True, variant=True)
    assert jax_missing_path((1,), "keras", poisson_in_fit=False, variant=False) is None
    assert jax_missing_path((1,), "core", poisson_in_fit=True, variant=True) is None
    assert all(jax_missing_path((2,), path, poisson_in_fit=p, variant=v) is None
               for path in ("core", "keras") for p in (True, False) for v in (True, False))  # fmt: skip


def test_the_ghost_clipping_norm_finding_holds_from_1_5_0_until_its_fix_in_1_5_3():
    holds = [v for v in OPACUS if GHOST_MAX_GRAD_NORM.at(parse_version(v)) is GHOST_MAX_GRAD_NORM]
    assert holds == ["1.5", "1.5.1", "1.5.2"]
    assert GHOST_MAX_GRAD_NORM.at(None) is None
    assert parse_version("1.5.0") == parse_version("1.5") < parse_version("1.5.3") < parse_version("1.10")


@pytest.mark.parametrize(
    "version, expected, layer_issues",
    [("1.5.2", "known-issue", ()), ("1.5.3", "private", (("linear_3d", GHOST_LINEAR_BIAS_3D.issue),)), ("1.5.4", "private", ())],
)
def test_the_ghost_linear_bias_finding_is_opacus_ghosts_linear_3d_design_alone_on_1_5_3(monkeypatch, version, expected, layer_issues):
    """1.5.0–1.5.3 square the bias's dot products (#751, fixed in 1.5.4): on 1.5.3 the ghost path stays expected
    private and only its linear_3d design expects the finding; on 1.5.0–1.5.2 the whole path is #664's known
    issue already; hooks mode takes no norm sampler and the variants keep their own expectation."""
    import dpverify_opacus
    from dpverify_opacus import _releases

    from dpverify.gate import gate_audits

    assert [v for v in OPACUS if GHOST_LINEAR_BIAS_3D.at(parse_version(v))] == ["1.5", "1.5.1", "1.5.2", "1.5.3"]
    monkeypatch.setattr(_releases, "installed_version", lambda: parse_version(version))
    built = {i.info.name: i.info for i in dpverify_opacus.implementations()}
    ghost = built["opacus-ghost"]
    assert (ghost.expected, ghost.layer_issues) == (expected, layer_issues)
    assert (GHOST_LINEAR_BIAS_3D.summary in ghost.notes) is (version != "1.5.4")
    assert built["opacus-hooks"].layer_issues == () and built["opacus-hooks"].expected == "private"
    if version == "1.5.3":
        audits = {a.test_name: a.expected for a in gate_audits([ghost])}
        assert audits.pop("layer[opacus-ghost-linear_3d]") == "known-issue"
        assert set(audits.values()) == {"private"} and "layer[opacus-ghost-embedding]" in audits


def test_tf_privacys_dense_bias_finding_holds_on_0_8_12_and_its_variant_is_n_a_there_only():
    tf_privacy = [parse_version(r.version) for r in releases() if r.library.package == "tensorflow-privacy"]
    assert [DENSE_BIAS_3D.at(v) for v in tf_privacy] == [DENSE_BIAS_3D, None] and DENSE_BIAS_3D.at(None) is None
    assert "first shipped in TF-Privacy 0.9.0" in missing_step(parse_version("0.8.12"), "linear_bias_norm")
    assert missing_step(parse_version("0.9.0"), "linear_bias_norm") is None
    assert missing_step(parse_version("0.8.12"), "embedding_norm") is None


def test_on_0_8_12_the_dense_bias_finding_is_tf_privacy_fast_clippings_linear_3d_designs_alone(monkeypatch):
    """The path stays expected private: its every-update audit, worlds and other designs run and count on
    0.8.12 as on 0.9.0; only the design that finds the finding expects it (the release itself:
    scripts/release.sh tensorflow-privacy==0.8.12)."""
    import dpverify_tfprivacy
    from dpverify_tfprivacy import _releases

    from dpverify.gate import gate_audits

    monkeypatch.setattr(_releases, "installed_version", lambda: parse_version("0.8.12"))
    info = dpverify_tfprivacy._fast_clipping_info()
    assert info.expected == "private" and info.layer_issues == (("linear_3d", DENSE_BIAS_3D.issue),)
    assert f"Installed release: {DENSE_BIAS_3D.summary}." in info.notes
    audits = {a.test_name: a.expected for a in gate_audits([info])}
    assert audits.pop("layer[tf-privacy-fast-clipping-linear_3d]") == "known-issue"
    assert {"every-update[tf-privacy-fast-clipping]", "layer[tf-privacy-fast-clipping-embedding]"} <= set(audits)
    assert set(audits.values()) == {"private"}
    monkeypatch.setattr(_releases, "installed_version", lambda: parse_version("0.9.0"))
    assert dpverify_tfprivacy._fast_clipping_info().layer_issues == ()


def test_the_installed_tf_privacy_has_the_einsum_norm_exactly_where_the_variant_is_built():
    pytest.importorskip("tensorflow_privacy", reason="needs TF-Privacy: pip install 'dpverify[tf-privacy]'")
    from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import einsum_utils

    from dpverify_tfprivacy._releases import installed_version

    has_it = hasattr(einsum_utils, "compute_fast_einsum_squared_gradient_norm")
    assert has_it is (missing_step(installed_version(), "linear_bias_norm") is None)


def test_the_installed_release_takes_the_arguments_its_call_passes():
    """Against the installed Opacus itself: make_private has a criterion parameter exactly when the dispatch
    passes one."""
    from opacus import PrivacyEngine

    parameters = inspect.signature(PrivacyEngine.make_private).parameters
    assert make_private_call(installed_version(), "hooks").criterion == ("criterion" in parameters)
    assert "clipping" in parameters


@pytest.mark.parametrize(
    "args, message",
    [([], "usage: bash scripts/release.sh PACKAGE==VERSION"), (["opacus=1.5.2"], "a release is PACKAGE==VERSION"),
     (["opacus==1.3.0"], "opacus==1.3.0 is not a supported release; supported: 1.4.0"),
     (["opacus==1.5.2", "--report"], "--report needs a path"), (["opacus==1.5.2", "--jobs", "2"], "unknown argument --jobs")],
)  # fmt: skip
def test_release_script_refuses_bad_arguments_before_making_anything(args, message):
    done = subprocess.run(["bash", str(REPO / "scripts/release.sh"), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr
    assert "nox" not in done.stderr


def test_a_gates_report_records_the_release_its_known_issues_and_the_paths_it_lacks(tmp_path):
    """Against the installed Opacus: every registered Opacus path runs here (none n/a), and the report
    names the installed release and the known issue's link."""
    import json

    from dpverify.release_gate import record_release

    from importlib import metadata

    installed = metadata.version("opacus")
    release = next(r for r in releases() if r.library.package == "opacus" and parse_version(r.version) == installed_version())
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"audits": []}))
    assert record_release(release, str(report)) == []
    data = json.loads(report.read_text())
    assert data["release"] == {"spec": release.spec, "installed": installed}
    assert data["issues"]["opacus-dataloader"] == "https://github.com/pytorch/opacus/issues/571"
    assert data["not_applicable"] == []
