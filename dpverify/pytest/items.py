"""The ready-made audit tests: one item per selected implementation, no test code needed, under a virtual
module ``dp-audit`` (node ids ``dp-audit::dp-audit[<name>]``, JUnit class ``dp-audit``) and marked
``dp_audit``, so ``-k``, ``-m dp_audit`` and JUnit readers see them as tests like any other.

Expectations are :func:`dpverify.pytest.fixture.judge`'s: a private implementation must not be refuted; a
D1/D2 buggy variant must be (else the item fails: the audit missed a bug it should catch); an uncaught
D3/D4 variant is an expected failure (xfail); an audit that cannot decide is skipped with the number of
canaries it would need (a failure under ``--dp-audit-strict``); an error always fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from dpverify.pytest.stash import SESSION_KEY
from dpverify.session import AuditSession

MODULE = "dp-audit"


class DPAuditModule(pytest.Collector):
    """The virtual module the ready-made items live in: it collects nothing by itself; the plugin adds the
    items of the selected implementations."""

    def collect(self) -> list[pytest.Item]:
        return []


class DPAuditItem(pytest.Item):
    def __init__(self, *, implementation_name: str, expected: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.implementation_name = implementation_name
        self.expected = expected
        self.add_marker("dp_audit")

    @property
    def audit_session(self) -> AuditSession:
        return self.config.stash[SESSION_KEY]

    def runtest(self) -> None:
        from dpverify.pytest.fixture import audit_config, execute_audit, judge, reproduce_hint
        from dpverify.registry import get_implementation

        session = self.audit_session
        implementation = get_implementation(self.implementation_name)
        reason = implementation.unavailable_reason()
        if reason:
            pytest.skip(reason)
        # Keyed by the name alone, so one seed means one audit here and in `dpverify audit --seed`. A buggy
        # variant's audit cannot raise a false alarm, so the plan gives it no share of the level.
        result = execute_audit(
            session, self, implementation, audit_config(session, {}), key=self.implementation_name,
            counted=self.expected == "private",
        )
        judge(result, implementation, strict=session.strict, reproduce=reproduce_hint(session, self, implementation))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from dpverify.results import AuditError, DPViolation

        if isinstance(excinfo.value, (DPViolation, AuditError)):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"dp-audit of {self.implementation_name}"
