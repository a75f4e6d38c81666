"""Where the plugin keeps its state on pytest objects, and the report property results travel in (so the
summary also works under pytest-xdist, whose controller sees only reports)."""

from __future__ import annotations

import pytest

from dpverify.session import AuditSession

#: Name of the user property that carries one audit's JSON on a test report.
RESULT_PROPERTY = "dp_audit_result"
#: Name of the user property that says a ready-made audit's implementation cannot run here, and why.
UNAVAILABLE_PROPERTY = "dp_audit_unavailable"
SESSION_KEY = pytest.StashKey[AuditSession]()
#: How many audits the session's plan counted for an item: the budget its audits are held to.
PLANNED_KEY = pytest.StashKey[int]()
#: ``--dp-audit-only`` (``"only"``), ``--dp-audit-skip`` (``"skip"``) or neither (``None``).
SELECTION_KEY = pytest.StashKey["str | None"]()
#: The virtual module of the ready-made audits (their node ids are ``dp-audit::<name>``).
READY_MADE_MODULE = "dp-audit"
