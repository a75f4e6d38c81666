"""Choosing what a session audits: names and glob patterns, and exclusions (a pattern after ``!``) that
take from what the other patterns choose, in the CLI and in pytest alike."""

import json

import pytest

from dpverify.cli import main
from dpverify.session import selected_by
from tests.test_plugin import CONFTEST, run

NAMES = ("jax-privacy-keras", "jax-privacy-keras-accumulation", "jax-privacy-keras-no-noise", "opacus-ghost")


@pytest.mark.parametrize(
    "patterns, chosen",
    [
        (("*",), NAMES),
        (("*", "!jax-privacy-keras-no*"), ("jax-privacy-keras", "jax-privacy-keras-accumulation", "opacus-ghost")),
        (("jax-*", "!*-accumulation", "!*-no-*"), ("jax-privacy-keras",)),
        (("opacus-ghost", "!opacus-*"), ()),
        (("!opacus-ghost",), ()),  # exclusions alone choose nothing
    ],
)
def test_exclusions_take_from_what_the_other_patterns_choose(patterns, chosen):
    assert tuple(name for name in NAMES if selected_by(patterns, name)) == chosen


def _planned(capsys) -> set[str]:
    return {entry["implementation"] for entry in json.loads(capsys.readouterr().out)["audits"]}


def test_the_cli_takes_exclusions_with_names_or_after_all(capsys):
    assert main(["audit", "opacus-lm*", "!opacus-lm-hooks*", "!*-embedding", "--worlds", "none", "--every-update", "off", "--plan"]) == 0
    assert _planned(capsys) == {"opacus-lm", "opacus-lm-clip-2c", "opacus-lm-no-noise"}
    assert main(["audit", "--all", "!opacus-*", "!tf-privacy-*", "!jax-privacy-*", "--worlds", "none", "--every-update", "off", "--plan"]) == 0
    assert _planned(capsys) == {"reference-dpsgd"}


def test_all_with_a_name_to_audit_is_a_usage_error_that_shows_an_exclusion(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["audit", "--all", "opacus-ghost", "--plan"])
    assert stopped.value.code == 2
    assert "--all takes only exclusions, e.g. '!opacus-lm*'" in capsys.readouterr().err


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    return pytester


def test_pytest_leaves_out_what_an_exclusion_matches(project):
    result = run(project, "--dp-audit", "--dp-audit-implementations=third-party-*,leaky,!leaky", "--dp-audit-worlds=none", "--dp-audit-every-update=false",
                 "--collect-only", "-q")  # fmt: skip
    result.stdout.fnmatch_lines(["dp-audit::dp-audit[[]third-party-private[]]", "*1 test collected*"])


@pytest.mark.parametrize(
    "selection, message",
    [
        ("!leaky", "!leaky only leaves out; name what to audit first, e.g. '*,!leaky'"),
        ("third-party-*,!leak", "!leak matches no registered implementation"),
    ],
)
def test_pytest_refuses_exclusions_alone_and_one_that_matches_nothing(project, selection, message):
    result = run(project, "--dp-audit", f"--dp-audit-implementations={selection}", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
