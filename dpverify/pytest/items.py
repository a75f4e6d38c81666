"""The ready-made audit tests, no test code needed: per selected implementation its one-run audit, its
every-update audit, a two-world audit of each crafted world that applies to it and an audit of each layer
design it trains (:mod:`dpverify.gate`), under a virtual module ``dp-audit`` (node ids
``dp-audit::dp-audit[<name>]``, ``dp-audit::every-update[<name>]``, ``dp-audit::two-world[<name>-<world>]``
and ``dp-audit::layer[<name>-<layer>]``, JUnit class ``dp-audit``), marked ``dp_audit`` (and
``dp_audit_every_update`` or ``dp_audit_two_world``), so ``-k``, ``-m`` and JUnit readers see them as tests
like any other.

Expectations are :func:`dpverify.pytest.fixture.judge`'s: a private implementation must not be refuted; a
D1/D2 buggy variant must be (else the item fails: the audit missed a bug it should catch); an uncaught
D3/D4 variant is an expected failure (xfail); an audit that cannot decide is skipped with the number of
canaries it would need (a failure under ``--dp-audit-strict``); an error always fails.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dpverify.gate import GateAudit
from dpverify.pytest.stash import SESSION_KEY, UNAVAILABLE_PROPERTY
from dpverify.session import AuditSession


class DPAuditModule(pytest.Collector):
    """The virtual module the ready-made items live in: it collects nothing by itself; the plugin adds the
    items of the selected implementations."""

    def collect(self) -> list[pytest.Item]:
        return []


class DPAuditItem(pytest.Item):
    def __init__(self, *, audit: GateAudit, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.audit = audit
        self.add_marker("dp_audit")
        if audit.world is not None:
            self.add_marker("dp_audit_two_world")
        if audit.every_update:
            self.add_marker("dp_audit_every_update")

    @property
    def implementation_name(self) -> str:
        return self.audit.implementation_name

    @property
    def expected(self) -> str:
        return self.audit.expected

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
            self.user_properties.append((UNAVAILABLE_PROPERTY, json.dumps(unavailable_record(implementation))))
            pytest.skip(reason)
        audit = self.audit
        config = session.gate_config(audit, one_run=lambda: audit_config(session, {}))
        audited = implementation.audited_in(config.architecture)  # a layer design's known issue, if it has one
        result = execute_audit(session, self, audited, config, key=audit.seed_key, counted=audit.counted)
        judge(result, audited, strict=session.strict, reproduce=reproduce_hint(session, self, implementation))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from dpverify.results import AuditError, DPViolation

        if isinstance(excinfo.value, (DPViolation, AuditError)):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        what = "dp-audit" if self.audit.world is None else f"two-world audit ({self.audit.world})"
        if self.audit.every_update:
            what = "every-update audit"
        elif self.audit.layer is not None:
            what = f"layer audit ({self.audit.layer})"
        return self.path, None, f"{what} of {self.implementation_name}"


def unavailable_record(implementation: Any) -> dict[str, Any]:
    """Why ``implementation`` cannot run here, for the summary: its family (its extra, else its library),
    the modules missing and how to get them."""
    from dpverify.contract import install_hint

    info, missing = implementation.info, implementation.missing_requirements()
    return {"implementation": info.name, "family": info.extra or info.library, "missing": list(missing), "hint": install_hint(info.extra, missing)}


def not_audited_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per family whose ready-made audits were skipped because it is not installed here:
    ``not audited here: jax-privacy (6 implementations) needs jax, keras: run ...``."""
    families: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        families.setdefault(record["family"], []).append(record)
    lines = []
    for family, members in sorted(families.items()):
        names = {record["implementation"] for record in members}
        missing = sorted({module for record in members for module in record["missing"]})
        count = f"{len(names)} implementation{'s' if len(names) != 1 else ''}"
        lines.append(f"not audited here: {family} ({count}) needs {', '.join(missing)}: {members[0]['hint']}")
    return lines
