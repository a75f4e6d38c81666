"""The ``dp_audit`` fixture object, and the one path every audit of a session goes through (the fixture and
the ready-made items alike): configuration, counting against the plan, seed and level, recording on the
test's report, and judging the verdict against the implementation's expectation.

Imported lazily by the plugin (it pulls in numpy and the engine), only when an audit actually runs.
"""

from __future__ import annotations

import json
import time
import warnings
import zlib
from typing import Any, NoReturn

import pytest

from dpverify.audits import auditor_failure, refused_result, run_audit, undecidable
from dpverify.config import OVERRIDABLE, AuditConfig, profile_config
from dpverify.contract import Implementation
from dpverify.registry import get_implementation, registered_implementations
from dpverify.results import AuditError, AuditResult, DPViolation
from dpverify.pytest.progress import audit_progress
from dpverify.pytest.stash import RESULT_PROPERTY
from dpverify.session import MUST_CATCH, AuditSession, audit_entry, with_plots

#: Marker keywords: audit settings except the session's own (seed, confidence), plus profile and audits.
MARKER_KEYWORDS = tuple(name for name in OVERRIDABLE if name not in ("seed", "confidence")) + ("profile", "audits")
#: Fields of a result that also travel as their own JUnit properties, for CI systems that read JUnit XML.
JUNIT_FIELDS = (
    "implementation",
    "verdict",
    "claimed_epsilon",
    "epsilon_lower_bound",
    "curve_epsilon_lower_bound",
    "curve_p_value",
    "curve_refuted",
    "confidence",
    "seed",
)
#: Fields of the result's power (:class:`dpverify.stats.power.AuditPower`) that travel as JUnit properties.
JUNIT_POWER_FIELDS = ("signal_fraction", "smallest_deficit", "blind")


class KnownIssueFound(UserWarning):
    """An unmodified library leaked as its upstream report says: shown in the warnings summary."""


class UndecidedExample(UserWarning):
    """A Hypothesis example whose audit could not decide: noted, and the property test goes on."""


class AuditBudgetExceeded(RuntimeError):
    """A test ran more audits than the plan counted for it, which would break the session-wide level."""


#: The two spellings of one setting, the privacy target: a level that names either replaces the other.
PRIVACY_TARGETS = ("epsilon", "noise_multiplier")


def merge_levels(*levels: dict[str, Any]) -> dict[str, Any]:
    """Settings from the lowest level to the highest, each overriding the ones before it; a level that names
    a privacy target (ε or σ) replaces the lower levels' target whole, so a marker's ``noise_multiplier``
    is honoured over the session's ε. A level naming both is a ``ValueError``."""
    merged: dict[str, Any] = {}
    for level in levels:
        named = [name for name in PRIVACY_TARGETS if name in level]
        if len(named) > 1:
            raise ValueError("give one privacy target, epsilon or noise_multiplier, not both")
        if named:
            for name in PRIVACY_TARGETS:
                merged.pop(name, None)
        merged.update(level)
    return merged


def audit_config(session: AuditSession, overrides: dict[str, Any]) -> AuditConfig:
    """The session's profile with, in rising precedence, the session's target ε, its ``--dp-audit-set``
    settings and ``overrides`` (marker or call keywords; see :func:`merge_levels`), and the session's device
    and time limit where those do not say."""
    overrides = merge_levels({"epsilon": session.epsilon}, session.settings, overrides)
    profile = overrides.pop("profile", session.profile)
    overrides.pop("audits", None)
    overrides.setdefault("device", session.device)
    if session.timeout is not None:
        overrides.setdefault("timeout", session.timeout)
    return profile_config(profile, **overrides)


def execute_audit(
    session: AuditSession,
    node: Any,
    implementation: Implementation,
    config: Any,
    *,
    key: str,
    counted: bool,
    undecided_goes_on: bool = False,
) -> AuditResult:
    """Count the audit against the session's plan, run it at the session's per-audit confidence and the
    seed of ``key`` with its progress shown as ``--dp-audit-progress`` says, and record it on ``node``'s
    reports (JUnit properties included). An audit that could only end undecided is refused before
    training: a skip, a failure under ``--dp-audit-strict``; with ``undecided_goes_on`` (a Hypothesis
    example, not strict) a warning and an ``undecided`` result of nothing run, so the test goes on, and an
    audit of a private implementation that ends undecided is noted with a warning too."""
    config = config.with_overrides(seed=session.audit_seed(key), confidence=session.per_audit_confidence)
    refusal = undecidable(implementation, config)
    if refusal is not None:
        message = f"{implementation.info.name}: not run: {refusal.message()} (a dp_audit marker keyword, or --dp-audit-set)"
        if not undecided_goes_on or session.strict:
            _cannot_decide(message, strict=session.strict)
        warnings.warn(f"{node.nodeid}: an undecided example: {message}", UndecidedExample, stacklevel=3)
        return refused_result(implementation, config, refusal)
    session.start_audit(counted=counted, where=node.nodeid)
    progress = audit_progress(node.config, f"dp-audit {implementation.info.name}")
    started = time.perf_counter()
    try:
        result = run_audit(
            implementation,
            config,
            progress=progress and progress.stage,
            step_progress=progress and progress.step,
            executor=session.executor_for_audits(),
        )
    except (ValueError, TypeError):  # the test's own mistake (a setting, a config), named by the message
        raise
    except Exception as exc:  # the audit's own failure: an error verdict with its report entry, not a lost one
        result = auditor_failure(implementation, config, exc, seconds=time.perf_counter() - started)
    if progress is not None:
        progress.finish(result.headline())
    if undecided_goes_on and result.verdict == "undecided" and implementation.info.expected == "private":
        warnings.warn(f"{node.nodeid}: an undecided example: {result.summary()}", UndecidedExample, stacklevel=3)
    if session.plots_dir:
        result = with_plots(result, session.plots_dir)
    record = audit_entry(result, implementation, nodeid=node.nodeid, counted=counted)
    node.user_properties.extend((f"dp_audit_{name}", record.get(name)) for name in JUNIT_FIELDS)
    power = record.get("power") or {}
    node.user_properties.extend((f"dp_audit_{name}", power.get(name)) for name in JUNIT_POWER_FIELDS)
    # The planned count travels with the result: under xdist only the workers collect and count.
    node.user_properties.append((RESULT_PROPERTY, json.dumps({**record, "planned_audits": session.planned_audits})))
    return result


def reproduce_hint(session: AuditSession, node: Any, implementation: Implementation) -> str:
    """The command that reruns this audit as it ran: same seed, target, device, settings and level."""
    parts = [
        "pytest --dp-audit",
        f"--dp-audit-seed {session.seed}",
        f"--dp-audit-profile {session.profile}",
        f"--dp-audit-epsilon {session.epsilon:g}",
        f"--dp-audit-device {session.device}",
        f"--dp-audit-confidence-per-audit {session.per_audit_confidence!r}",
    ]
    if any(registered is implementation for registered in registered_implementations()):
        parts.append(f"--dp-audit-implementations {implementation.info.name}")
    parts += [f"--dp-audit-set '{name}={value!r}'" for name, value in session.settings.items()]
    parts.append(f'"{node.nodeid}"')  # a ready-made audit's node id selects it too (dp-audit::dp-audit[name])
    return " ".join(parts)


def judge(result: AuditResult, implementation: Implementation, *, strict: bool, reproduce: str) -> None:
    """Raise, skip or xfail as ``result`` means for a test of ``implementation``, by its expectation.

    Expected private: a violation raises :class:`DPViolation`, an undecided audit skips (fails under
    ``strict``: undecided is never a pass). A buggy variant: its violation is the expected outcome; a
    D1/D2 variant not caught fails (the audit missed a bug it must catch), a D3/D4 one is an expected
    failure. A known issue of an unmodified library: found again, the test passes and says so (a finding
    with its evidence and upstream report, not an xfail); not found, it passes as an audit would. An
    error always raises :class:`AuditError`.
    """
    info = implementation.info
    if result.verdict == "error":
        raise AuditError(result)
    if info.expected == "known-issue":
        if result.verdict == "violation":
            warnings.warn(f"known issue {info.issue} found again: {result.summary()}", KnownIssueFound, stacklevel=2)
        return
    if info.expected == "violation":
        if result.verdict == "violation":
            return
        missed = f"buggy variant {info.name} ({info.detectability}: {info.breaks}) was not caught: {result.summary()}"
        if info.detectability in MUST_CATCH:
            pytest.fail(missed, pytrace=False)
        pytest.xfail(missed)
    if result.verdict == "violation":
        raise DPViolation(result, reproduce=reproduce)
    if result.verdict == "undecided":
        _undecided(result, strict=strict)


def _undecided(result: AuditResult, *, strict: bool) -> NoReturn:
    _cannot_decide(result.summary(), strict=strict)


def _not_a_pass(message: str) -> str:
    return f"{message} (undecided is not a pass: --dp-audit-strict makes it a failure)"


def _cannot_decide(message: str, *, strict: bool) -> NoReturn:
    message = _not_a_pass(message)
    if strict:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def example_key(node: Any, implementation: Implementation, config: Any) -> str:
    """A Hypothesis example's seed key: its own settings, so a replayed or shrunk example keeps its seed."""
    digest = zlib.crc32(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    return f"{node.nodeid}#{implementation.info.name}#{digest:08x}"


class DPAudit:
    """``dp_audit(implementation, config=None, **settings) -> AuditResult``.

    Runs one audit of ``implementation`` (an object or a registered name) and judges it as the ready-made
    audits do (:func:`judge`): a private implementation's refuted claim raises
    :class:`~dpverify.results.DPViolation`, a buggy variant's expected violation returns its result. An
    implementation whose library is missing skips with the extra to install. Settings come from, in
    order, the call's keywords, the test's ``dp_audit`` marker, ``--dp-audit-set``, the profile; a
    ``config`` passed explicitly (e.g. drawn by Hypothesis) is used as given, with the call's keywords on
    top. The seed and the confidence are always the session's.

    The test may run as many audits as the plan counted for it (``budget``). In a Hypothesis test, once an
    audit has failed the test fails whatever follows, so the audits Hypothesis runs while shrinking and
    replaying are not counted; each example is seeded from its own settings, so a replay repeats it. An
    example that cannot decide (refused before training, or undecided after) does not end a Hypothesis
    test: it is noted (an :class:`UndecidedExample` warning), its undecided result returned, and the test
    goes on with the next example; the test is undecided (skipped) only when every example was
    (:meth:`undecided_reason`), and fails as soon as one is a violation. Under ``--dp-audit-strict`` the first
    undecided example fails the test, as anywhere else.
    """

    def __init__(self, session: AuditSession, node: Any, marker_settings: dict[str, Any], budget: int) -> None:
        self._session = session
        self._node = node
        self._marker_settings = marker_settings
        self._budget = budget
        self._hypothesis = bool(getattr(getattr(node, "function", None), "is_hypothesis_test", False))
        self._failed = False
        self.calls = 0
        #: Hypothesis examples audited (or refused), and the summaries of those left undecided.
        self.examples = 0
        self.undecided: list[str] = []

    def config(self, **settings: Any) -> AuditConfig:
        """The configuration an audit with ``settings`` would run (before the session's seed and level)."""
        return audit_config(self._session, merge_levels(self._marker_settings, settings))

    def __call__(self, implementation: Implementation | str, config: AuditConfig | None = None, **settings: Any) -> AuditResult:
        if not self._session.enabled:
            pytest.skip("DP audits are off; run pytest with --dp-audit")
        if isinstance(implementation, str):
            implementation = get_implementation(implementation)
        reason = implementation.unavailable_reason()
        if reason:
            pytest.skip(reason)
        config = self.config(**settings) if config is None else config.with_overrides(**settings)
        if isinstance(config, AuditConfig) and config.is_data_dependent:
            from dpverify.datasets import data_unavailable_reason

            reason = data_unavailable_reason(config.data.dataset)
            if reason:
                pytest.skip(reason)
        counted = self._count()
        key = example_key(self._node, implementation, config) if self._hypothesis else f"{self._node.nodeid}#{self.calls}"
        goes_on = self._hypothesis and not self._session.strict
        audited = implementation.audited_in(config.architecture)  # a layer design's known issue, if it has one
        result = execute_audit(
            self._session, self._node, audited, config, key=key, counted=counted, undecided_goes_on=goes_on
        )
        self.examples += 1
        if goes_on and result.verdict == "undecided" and audited.info.expected == "private":
            self.undecided.append(result.summary())  # noted by execute_audit
            return result
        try:
            judge(result, audited, strict=self._session.strict, reproduce=reproduce_hint(self._session, self._node, implementation))
        except BaseException:
            self._failed = True
            raise
        return result

    def undecided_reason(self) -> str | None:
        """Why a Hypothesis test that did not fail is undecided (the plugin skips it: undecided is never a
        pass): every example's audit was; ``None`` when one decided, which makes the test's outcome."""
        if self._hypothesis and self.examples and len(self.undecided) == self.examples:
            return _not_a_pass(f"every one of the {self.examples} example(s) was undecided; the first: {self.undecided[0]}")
        return None

    def _count(self) -> bool:
        """Count one audit against this test's budget; ``False`` for a Hypothesis test's audits after a
        failure (shrinking and replaying), which cannot make a failing test fail."""
        if self._hypothesis and self._failed:
            return False
        self.calls += 1
        if self.calls > self._budget:
            planned = f"counted {self._budget} audit(s) for it" if self._budget else "did not count it"
            raise AuditBudgetExceeded(
                f"{self._node.nodeid} ran audit {self.calls}, but the session's plan {planned}; the session "
                "divides its level by the audits it planned at collection. Request the dp_audit fixture as a "
                "test argument and declare the test's audits with @pytest.mark.dp_audit(audits=N)"
            )
        return True

