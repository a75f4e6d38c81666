"""The ready-made audit test: one collected item per registered implementation, no test code needed.

Expectations: a private implementation must not be refuted; a buggy variant of class D1 or D2 must be
(else the item fails: the audit missed a bug it should catch); a D3/D4 variant is run and reported, and
an uncaught one is an expected failure (xfail), not a failure. An audit that cannot decide is skipped
with the number of canaries it would need; an error always fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from dpverify.pytest.stash import SESSION_KEY
from dpverify.session import MUST_CATCH, AuditSession


class DPAuditItem(pytest.Item):
    def __init__(self, *, implementation_name: str, expected: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.implementation_name = implementation_name
        self.expected = expected

    @property
    def audit_session(self) -> AuditSession:
        return self.config.stash[SESSION_KEY]

    def runtest(self) -> None:
        from dpverify.pytest.fixture import audit_config, execute_audit, raise_for_verdict, reproduce_hint
        from dpverify.registry import get_implementation

        session = self.audit_session
        implementation = get_implementation(self.implementation_name)
        reason = implementation.unavailable_reason()
        if reason:
            pytest.skip(reason)
        result = execute_audit(session, self, implementation, audit_config(session, {}), key=self.nodeid)
        info = implementation.info
        if info.expected == "violation" and result.verdict != "error":
            if result.verdict == "violation":
                return
            missed = (
                f"buggy variant {info.name} ({info.detectability}: {info.breaks}) was not caught: {result.summary()}"
            )
            if info.detectability in MUST_CATCH:
                pytest.fail(missed, pytrace=False)
            pytest.xfail(missed)
        raise_for_verdict(result, reproduce=reproduce_hint(session, self))
        if result.verdict == "undecided":
            pytest.skip(result.summary())

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from dpverify.results import AuditError, DPViolation

        if isinstance(excinfo.value, (DPViolation, AuditError)):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"dp-audit of {self.implementation_name}"
