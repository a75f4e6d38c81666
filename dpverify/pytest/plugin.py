"""pytest hooks and fixtures of dpverify (registered through the ``pytest11`` entry point).

Imports nothing heavy: numpy, the engine and any DP library are imported only when an audit runs.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from dpverify.pytest import options
from dpverify.pytest.stash import RESULT_PROPERTY, RESULTS_KEY, SESSION_KEY
from dpverify.session import AuditSession, outcome_as_expected

MARKER_HELP = (
    "dp_audit(**settings): settings for the audits this test runs through the dp_audit fixture "
    "(epsilon, delta, design, m, dimension, num_classes, hidden_width, epochs, ..., profile), and "
    "audits=N: how many audits the test runs (the session divides its level among all audits)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    try:
        seed = options.resolve(config, "seed")
        worker_input = getattr(config, "workerinput", None)
        if worker_input is not None and "dp_audit_seed" in worker_input:
            seed = worker_input["dp_audit_seed"]
        elif seed is None:
            seed = random.SystemRandom().randrange(2**31)
        session = AuditSession(
            enabled=options.audit_enabled(config),
            profile=options.resolve(config, "profile"),
            confidence=options.resolve(config, "confidence"),
            seed=seed,
            device=options.resolve(config, "device"),
            epsilon=options.resolve(config, "epsilon"),
            implementations=options.resolve(config, "implementations"),
            report_path=options.resolve(config, "report"),
            plots_dir=options.resolve(config, "plots"),
        )
    except options.OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(ResultGatherer(session), "dpverify-results")


class ResultGatherer:
    """Gathers audit results from test reports: in-process, or from every worker in the xdist controller
    (which collects nothing itself, so it learns the planned count from the workers' results)."""

    def __init__(self, session: AuditSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == RESULT_PROPERTY:
                self.session.gather(json.loads(value))


def pytest_unconfigure(config: pytest.Config) -> None:
    from dpverify.registry import forget_registrations

    forget_registrations()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker audits with the controller's seed."""
    node.workerinput["dp_audit_seed"] = node.config.stash[SESSION_KEY].seed


def pytest_report_header(config: pytest.Config) -> str | None:
    session = config.stash[SESSION_KEY]
    return session.header(rerun=f"--dp-audit-seed {session.seed}") if session.enabled else None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from dpverify.pytest.items import DPAuditItem
    from dpverify.registry import is_bundled, registered_implementations

    audit_session = config.stash[SESSION_KEY]
    for implementation in registered_implementations() if audit_session.enabled else ():
        name = implementation.info.name
        wanted = audit_session.selected(name) if audit_session.implementations else not is_bundled(name)
        if wanted:
            items.append(
                DPAuditItem.from_parent(
                    session, name=f"dp-audit[{name}]", implementation_name=name, expected=implementation.info.expected
                )
            )
    planned = 0
    for item in items:
        if isinstance(item, DPAuditItem):
            # A buggy variant fails the session only when it is *not* refuted, so its audits cannot cause
            # a false alarm and need no share of the level.
            planned += item.expected == "private"
        elif "dp_audit" in getattr(item, "fixturenames", ()):
            planned += _declared_audits(item)
    audit_session.planned_audits = planned


def _declared_audits(item: pytest.Item) -> int:
    """How many audits ``item`` may run: its marker's ``audits``, a Hypothesis test's max_examples, or 1."""
    settings = _marker_settings(item)
    if "audits" in settings:
        return settings["audits"]
    hypothesis_settings = getattr(getattr(item, "function", None), "_hypothesis_internal_use_settings", None)
    return int(hypothesis_settings.max_examples) if hypothesis_settings is not None else 1


def _marker_settings(item: pytest.Item) -> dict[str, Any]:
    """The ``dp_audit`` marker's keywords (closest marker wins per key), validated."""
    merged: dict[str, Any] = {}
    for marker in reversed(list(item.iter_markers("dp_audit"))):
        if marker.args:
            raise pytest.UsageError(f"{item.nodeid}: dp_audit marker takes keywords only, got {marker.args!r}")
        merged.update(marker.kwargs)
    if not merged:
        return merged
    from dpverify.pytest.fixture import MARKER_KEYWORDS

    unknown = sorted(set(merged) - set(MARKER_KEYWORDS))
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: unknown dp_audit marker keyword(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(MARKER_KEYWORDS))} (seed and confidence are the session's)"
        )
    audits = merged.get("audits", 1)
    if isinstance(audits, bool) or not isinstance(audits, int) or audits < 1:
        raise pytest.UsageError(f"{item.nodeid}: dp_audit marker audits must be an integer >= 1, got {audits!r}")
    return merged


@pytest.fixture
def dp_audit(request: pytest.FixtureRequest) -> Any:
    """Run audits from your own tests: ``dp_audit(implementation, config=None, **settings) -> AuditResult``."""
    from dpverify.pytest.fixture import DPAudit, audit_config

    session = request.config.stash[SESSION_KEY]
    if not session.enabled:
        pytest.skip("DP audits are off; run pytest with --dp-audit")
    settings = _marker_settings(request.node)
    try:
        audit_config(session, settings)
    except ValueError as exc:
        raise pytest.UsageError(f"{request.node.nodeid}: dp_audit marker: {exc}") from None
    return DPAudit(session, request.node, settings, _declared_audits(request.node))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dp_implementation" not in metafunc.fixturenames:
        return
    from dpverify.registry import registered_implementations

    params = []
    for implementation in registered_implementations():
        reason = implementation.unavailable_reason()
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(implementation, id=implementation.info.name, marks=marks))
    metafunc.parametrize("dp_implementation", params, indirect=True)


@pytest.fixture
def dp_implementation(request: pytest.FixtureRequest) -> Any:
    """Each registered implementation in turn (ids are their names)."""
    return request.param


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        for result in item.stash.get(RESULTS_KEY, []):
            report.user_properties.append((RESULT_PROPERTY, json.dumps(result)))
        item.stash[RESULTS_KEY] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    audit_session = session.config.stash[SESSION_KEY]
    if audit_session.enabled and not hasattr(session.config, "workerinput"):
        audit_session.write_report()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash[SESSION_KEY]
    if not session.results or hasattr(config, "workerinput"):
        return
    terminalreporter.write_sep("=", "dp-audit summary")
    for line in session.summary_lines():
        terminalreporter.write_line(line)
    unexpected = [r for r in session.results if not outcome_as_expected(r)]
    if unexpected:
        terminalreporter.write_line(f"{len(unexpected)} outcome(s) other than expected (marked '!').")
    if session.report_path:
        terminalreporter.write_line(f"dp-audit JSON report: {session.report_path}")
