"""The JSON report and the terminal table: every number a JSON number or null, ∞ said explicitly, an
errored audit without a bound, rows told apart, and a report file that is never half written."""

import json
import math
import os

import numpy as np
import pytest

from dpverify.audits import run_audit
from dpverify.config import profile_config
from dpverify.results import AuditResult
from dpverify.session import AuditSession, audit_entry
from tests.doubles import Broken


def _session(tmp_path=None, **fields) -> AuditSession:
    return AuditSession(
        enabled=True, profile="quick", confidence=0.95, seed=0, device="cpu", epsilon=2.0, implementations=(),
        report_path=None if tmp_path is None else str(tmp_path / "report.json"), plots_dir=None, **fields,
    )


def _result(**fields) -> AuditResult:
    values = dict(
        implementation="test-broken", design="inclusion", relation="add_remove", claimed_epsilon=2.0, delta=1e-5,
        epsilon_lower_bound=0.5, confidence=0.95, m=200, guesses=10, correct=8, optimal_epsilon=3.6, verdict="pass",
        seed=1, device="cpu", seconds=1.0,
    )
    return AuditResult(**{**values, **fields})


def test_infinity_is_null_and_named_never_a_string():
    entry = _result(claimed_epsilon=math.inf, library_epsilon=math.inf, verdict="undecided").to_dict()
    assert entry["claimed_epsilon"] is None and entry["library_epsilon"] is None
    assert entry["infinite"] == ["claimed_epsilon", "library_epsilon"]
    for name in ("claimed_epsilon", "library_epsilon", "epsilon_lower_bound", "optimal_epsilon", "test_accuracy"):
        assert entry[name] is None or isinstance(entry[name], float), name
    json.dumps(entry, allow_nan=False)
    finite = _result().to_dict()
    assert finite["infinite"] == [] and finite["claimed_epsilon"] == 2.0


def test_an_errored_audit_reports_no_bound_and_its_reason_in_the_table():
    result = run_audit(Broken(), profile_config("quick", m=50, dimension=50, epochs=1))
    assert result.verdict == "error" and math.isnan(result.epsilon_lower_bound)
    entry = audit_entry(result, Broken())
    assert entry["epsilon_lower_bound"] is None and entry["claimed_epsilon"] is None and entry["infinite"] == []
    assert "ε_L" not in result.summary() and "optimizer exploded" in result.summary()
    session = _session()
    session.results.append(entry)
    header, _, row = session.summary_lines()[:3]
    assert row[header.index("ε_L") :].split()[0] == "-"
    assert "training raised RuntimeError: optimizer exploded" in row


def test_the_test_column_tells_two_audits_of_one_implementation_apart():
    session = _session()
    for nodeid in ("tests/test_a.py::test_one", None):
        session.results.append(audit_entry(_result(), Broken(), nodeid=nodeid))
    rows = session.summary_lines()[2:4]
    assert rows[0] != rows[1]
    assert any("tests/test_a.py::test_one" in row for row in rows) and any(" - " in row for row in rows)
    assert "nodeid" not in audit_entry(_result(), Broken())


def test_ascii_table_aligns_after_spelling_out_symbols():
    session = _session()
    session.results.append(audit_entry(_result(claimed_epsilon=math.inf, verdict="undecided"), Broken()))
    header, rule, row = session.summary_lines(ascii=True)[:3]
    assert all(line.isascii() for line in (header, rule, row)) and "claimed eps" in header and " inf " in row
    # Each column's rule starts where its header does.
    starts = [i for i in range(1, len(rule)) if rule[i] == "-" and rule[i - 1] == " "]
    assert len(starts) == 15 and all(header[i - 2 : i] == "  " and header[i] != " " for i in starts)


def test_the_report_says_what_made_it(tmp_path):
    session = _session(tmp_path, command="dpverify audit test-broken")
    session.results.append(audit_entry(_result(), Broken(), nodeid="dpverify audit test-broken"))
    data = json.loads(session.write_report(complete=False).read_text())
    from dpverify import __version__

    assert data["dpverify_version"] == __version__ and data["libraries"] == {"numpy": np.__version__}
    assert data["command"] == "dpverify audit test-broken" and data["complete"] is False
    assert data["started_at"].endswith("Z") and data["written_at"] >= data["started_at"]
    assert data["audits"][0]["nodeid"] == "dpverify audit test-broken"


def test_a_failed_write_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    session = _session(tmp_path)
    path = session.write_report()
    before = path.read_text()
    session.results.append(audit_entry(_result(), Broken()))

    def crash(source, target):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        session.write_report()
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
