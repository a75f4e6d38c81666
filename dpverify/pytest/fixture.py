"""The ``dp_audit`` fixture object, and the one function every audit of a session goes through.

Imported lazily by the plugin (it pulls in numpy and the engine), only when an audit actually runs.
"""

from __future__ import annotations

import warnings
from typing import Any

from dpverify.audits import run_audit
from dpverify.config import OVERRIDABLE, AuditConfig, profile_config
from dpverify.contract import Implementation
from dpverify.registry import get_implementation
from dpverify.results import AuditError, AuditResult, DPViolation
from dpverify.pytest.stash import RESULTS_KEY
from dpverify.session import AuditSession

#: Marker keywords: audit settings except the session's own (seed, confidence), plus profile and audits.
MARKER_KEYWORDS = tuple(name for name in OVERRIDABLE if name not in ("seed", "confidence")) + ("profile", "audits")


class AuditBudgetExceeded(RuntimeError):
    """A test ran more audits than it declared, which would break the session-wide level."""


def audit_config(session: AuditSession, overrides: dict[str, Any]) -> AuditConfig:
    """The session's profile with ``overrides`` (marker or call keywords) and the session's device."""
    overrides = dict(overrides)
    profile = overrides.pop("profile", session.profile)
    overrides.pop("audits", None)
    overrides.setdefault("epsilon", session.epsilon)
    overrides.setdefault("device", session.device)
    return profile_config(profile, **overrides)


def execute_audit(
    session: AuditSession,
    node: Any,
    implementation: Implementation | str,
    config: AuditConfig,
    *,
    key: str,
) -> AuditResult:
    """Run one audit at the session's per-audit confidence and seed, and record it on ``node``."""
    if isinstance(implementation, str):
        implementation = get_implementation(implementation)
    config = config.with_overrides(seed=session.audit_seed(key), confidence=session.per_audit_confidence)
    result = run_audit(implementation, config)
    # The planned count travels with the result: under xdist only the workers collect and count.
    node.stash.setdefault(RESULTS_KEY, []).append({**result.to_dict(), "planned_audits": session.planned_audits})
    if session.plots_dir:
        _save_plots(result, session.plots_dir)
    return result


def reproduce_hint(session: AuditSession, node: Any) -> str:
    selector = f'-k "{node.name}"' if node.nodeid.startswith("::") else f'"{node.nodeid}"'
    return f"pytest --dp-audit --dp-audit-seed {session.seed} --dp-audit-profile {session.profile} {selector}"


def raise_for_verdict(result: AuditResult, *, reproduce: str) -> None:
    if result.verdict == "violation":
        raise DPViolation(result, reproduce=reproduce)
    if result.verdict == "error":
        raise AuditError(result)


class DPAudit:
    """``dp_audit(implementation, config=None, **settings) -> AuditResult``.

    Runs one audit; raises :class:`~dpverify.results.DPViolation` when the claim is refuted and
    :class:`~dpverify.results.AuditError` when training failed. Settings come from, in order, the call's
    keywords, the test's ``dp_audit`` marker, the command line, the environment and the ini file; a
    ``config`` passed explicitly (e.g. drawn by Hypothesis) is used as given, with the call's keywords on
    top. The seed and the confidence are always the session's.
    """

    def __init__(self, session: AuditSession, node: Any, marker_settings: dict[str, Any], budget: int) -> None:
        self._session = session
        self._node = node
        self._marker_settings = marker_settings
        self._budget = budget
        self.calls = 0
        self.violations = 0

    def config(self, **settings: Any) -> AuditConfig:
        """The configuration an audit with ``settings`` would run (before the session's seed and level)."""
        return audit_config(self._session, {**self._marker_settings, **settings})

    def __call__(self, implementation: Implementation | str, config: AuditConfig | None = None, **settings: Any) -> AuditResult:
        if not self._session.enabled:
            import pytest

            pytest.skip("DP audits are off; run pytest with --dp-audit")
        self.calls += 1
        if self.calls > self._budget and not self.violations:
            raise AuditBudgetExceeded(
                f"{self._node.nodeid} ran {self.calls} audits but declared {self._budget}; the session divides "
                "its level by the declared count, so declare more with @pytest.mark.dp_audit(audits=N)"
            )
        config = self.config(**settings) if config is None else config.with_overrides(**settings)
        if isinstance(config, AuditConfig) and config.is_data_dependent:
            from dpverify.datasets import data_unavailable_reason

            reason = data_unavailable_reason(config.data.dataset)
            if reason:
                import pytest

                pytest.skip(reason)
        result = execute_audit(self._session, self._node, implementation, config, key=f"{self._node.nodeid}#{self.calls}")
        if result.verdict == "violation":
            self.violations += 1
        raise_for_verdict(result, reproduce=reproduce_hint(self._session, self._node))
        return result


def _save_plots(result: AuditResult, directory: str) -> None:
    try:
        from dpverify.plots import save_audit_plots
    except ImportError:
        warnings.warn("--dp-audit-plots needs matplotlib: pip install 'dpverify[plots]'", stacklevel=2)
        return
    save_audit_plots(result, directory)
