import json

import pytest

from dpverify.cli import main


def test_bound_prints_the_bound_and_the_optimum(capsys):
    assert main(["bound", "--m", "1000", "--guesses", "100", "--correct", "100"]) == 0
    out = capsys.readouterr().out
    assert "epsilon_lower_bound = " in out and "optimal for m=1000: 5.78" in out


def test_bound_rejects_impossible_counts(capsys):
    assert main(["bound", "--m", "10", "--guesses", "5", "--correct", "6"]) == 2
    assert "correct" in capsys.readouterr().err


def test_list_names_every_bundled_implementation_and_its_availability(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("reference-dpsgd", "opacus-ghost", "opacus-no-noise", "tf-privacy-keras"):
        assert name in out
    assert "buggy variant, D1" in out


def test_audit_needs_a_name_or_all_and_a_known_name(capsys):
    assert main(["audit"]) == 2
    assert "name at least one implementation" in capsys.readouterr().err
    assert main(["audit", "no-such-thing"]) == 2
    assert "no registered implementation matches no-such-thing" in capsys.readouterr().err


def test_audit_runs_and_reports(tmp_path, capsys):
    pytest.importorskip("opacus")
    report = tmp_path / "r.json"
    code = main(["audit", "opacus-no-noise", "--m", "200", "--epochs", "5", "--report", str(report)])
    out = capsys.readouterr().out
    (audit,) = json.loads(report.read_text())["audits"]
    # Without noise the 200 canaries are memorised outright: ε_L sits at the audit's ceiling, far above 2.
    assert audit["implementation"] == "opacus-no-noise" and audit["verdict"] == "violation", audit["error"]
    assert "opacus-no-noise" in out and code == 0


def test_set_routes_each_setting_to_the_audit_that_knows_it():
    from dpverify.cli import _config_for, _settings
    from dpverify.registry import get_implementation

    overrides = {"m": 300, **_settings(["prefix_length=6", "num_tags=50", "trigger_mode=gaussian"])}
    assert overrides["prefix_length"] == 6 and overrides["trigger_mode"] == "gaussian"
    language = _config_for(get_implementation("opacus-lm"), "quick", overrides)
    assert (language.canaries.m, language.canaries.prefix_length) == (300, 6)
    classifier = _config_for(get_implementation("opacus-ghost"), "quick", {**overrides, "design": "multitask"})
    assert (classifier.data.m, classifier.data.num_tags, classifier.data.trigger_mode) == (300, 50, "gaussian")
    with pytest.raises(ValueError, match="unknown audit setting.*prefix_lenght"):
        _config_for(get_implementation("opacus-ghost"), "quick", {"prefix_lenght": 6})
    with pytest.raises(ValueError, match="--set takes NAME=VALUE"):
        _settings(["m"])
