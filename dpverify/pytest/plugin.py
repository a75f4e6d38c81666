"""pytest hooks and fixtures of dpverify (registered through the ``pytest11`` entry point).

Imports nothing heavy: numpy, the engine and any DP library are imported only when an audit runs.
"""

from __future__ import annotations

import fnmatch
import json
import random
import sys
from typing import Any

import pytest

from dpverify.pytest import options
from dpverify.pytest.stash import PLANNED_KEY, READY_MADE_MODULE, RESULT_PROPERTY, SELECTION_KEY, SESSION_KEY, UNAVAILABLE_PROPERTY
from dpverify.execution import ExecutorSpec
from dpverify.session import EXCLUDE, AuditSession, outcome_as_expected
from dpverify.workers import confine_jax_worker

#: The comparison with the ``--dp-audit-compare`` baseline made at the end.
COMPARISON_KEY = pytest.StashKey[Any]()

MARKER_HELP = (
    "dp_audit(**settings): settings for the audits this test runs through the dp_audit fixture "
    "(epsilon, delta, design, m, dimension, num_classes, hidden_width, epochs, ..., profile), and "
    "audits=N: how many audits the test runs (the session divides its level among all audits)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    config.addinivalue_line("markers", "dp_audit_two_world: a ready-made two-world (many-run) audit")
    config.addinivalue_line("markers", "dp_audit_every_update: a ready-made audit whose adversary sees every update")
    config.stash[NAMED_KEY] = _take_named_audits(config)
    try:
        config.stash[SELECTION_KEY] = options.audit_selection(config)
        session = _session(config)
        _load_baseline(config, session)
        options.resolve(config, "progress")  # checked here; each audit reads it (dpverify.pytest.progress)
    except options.OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if session.enabled and getattr(config, "workerinput", None) is not None:
        confine_jax_worker(session.executor.kind)  # before a test module starts XLA, whose pool sizes itself by the cores
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(ResultGatherer(session), "dpverify-results")


def _session(config: pytest.Config) -> AuditSession:
    """The session from the settings, each checked here, before anything is collected or trained."""
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
        confidence_per_audit=options.resolve(config, "confidence-per-audit"),
        seed=seed,
        device=options.resolve(config, "device"),
        epsilon=options.resolve(config, "epsilon"),
        implementations=options.resolve(config, "implementations"),
        worlds=options.resolve(config, "worlds"),
        every_update=options.resolve(config, "every-update"),
        layers=options.resolve(config, "layers"),
        settings=_settings(options.resolve(config, "set")),
        strict=options.resolve(config, "strict"),
        timeout=options.resolve(config, "timeout"),
        executor=_executor(config),
        report_path=options.resolve(config, "report"),
        plots_dir=options.resolve(config, "plots"),
    )
    if session.enabled:
        _check_device(session.device)
        _check_settings(session)
        for path, what in ((session.report_path, "--dp-audit-report"), (session.plots_dir, "--dp-audit-plots")):
            _check_writable(path, what, directory=what == "--dp-audit-plots")
    return session


def _load_baseline(config: pytest.Config, session: AuditSession) -> None:
    """The ``--dp-audit-compare`` report, checked at start (the xdist controller compares; workers need none)."""
    if not session.enabled or hasattr(config, "workerinput"):
        return
    try:
        session.load_baseline(options.resolve(config, "compare"), option="--dp-audit-compare")
    except ValueError as exc:
        raise options.OptionError(str(exc)) from None


def _compare(session: pytest.Session) -> None:
    """Compare the gathered results with the baseline, for the report and the summary; a significant rise
    fails the session under ``--dp-audit-compare-fail``."""
    comparison = session.config.stash[SESSION_KEY].compare()
    if comparison is None:
        return
    session.config.stash[COMPARISON_KEY] = comparison
    if comparison.risen and options.resolve(session.config, "compare-fail") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _settings(pairs: tuple[str, ...]) -> dict[str, Any]:
    if not pairs:
        return {}
    from dpverify.config import parse_settings  # framework-free, but pulls in numpy: only when used
    from dpverify.pytest.fixture import MARKER_KEYWORDS
    try:
        settings = parse_settings(pairs)
    except ValueError as exc:
        raise options.OptionError(f"--dp-audit-set: {exc}") from None
    unknown = sorted(set(settings) - set(MARKER_KEYWORDS) - {"audits"})
    if unknown:
        raise options.OptionError(
            f"--dp-audit-set: unknown audit setting(s) {', '.join(unknown)}; known: {', '.join(sorted(MARKER_KEYWORDS))}"
        )
    return settings


def _check_settings(session: AuditSession) -> None:
    """Build the configurations ``--dp-audit-set`` makes, the one-run audits' and the selected gate worlds',
    so that a bad value (``m=abc``) is a usage error naming it now, not a crash in every audit."""
    if not session.settings:
        return
    from dpverify.canaries.worlds import world_names
    from dpverify.gate import GateAudit
    from dpverify.pytest.fixture import audit_config

    worlds = {"applicable": world_names(), "none": ()}.get(session.worlds, session.worlds)
    checked = [GateAudit("", "private"), *([GateAudit("", "private", every_update=True)] if session.every_update else [])]
    try:
        for audit in [*checked, *(GateAudit("", "private", world) for world in worlds)]:
            session.gate_config(audit, one_run=lambda: audit_config(session, {}))
    except ValueError as exc:
        raise options.OptionError(f"--dp-audit-set: {exc}") from None


def _executor(config: pytest.Config) -> ExecutorSpec:
    settings = {name.replace("-", "_"): options.resolve(config, name) for name in ("executor", "workers", "ray-address")}
    try:
        return ExecutorSpec(**settings)
    except ValueError as exc:
        raise options.OptionError(f"--dp-audit-executor, --dp-audit-workers, --dp-audit-ray-address: {exc}") from None


def _check_device(device: str) -> None:
    if device != "cuda":
        return
    from dpverify.audits.planning import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise options.OptionError(f"--dp-audit-device: {exc}") from None


def _check_writable(path: str | None, option: str, *, directory: bool) -> None:
    """Write ``path`` now (:func:`~dpverify._validation.check_writable`), so a bad path fails at once, not
    after every audit has run."""
    if not path:
        return
    from dpverify._validation import check_writable

    try:
        check_writable(path, directory=directory)
    except ValueError as exc:
        raise options.OptionError(f"{option}={path!r}: {exc}; give a writable path") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    from dpverify.registry import forget_registrations

    forget_registrations()
    if SESSION_KEY in config.stash:
        config.stash[SESSION_KEY].close()


class ResultGatherer:
    """Gathers audit results from test reports: in-process, or from every worker in the xdist controller
    (which collects nothing itself, so it learns the planned count from the workers' results). Results
    ride on the teardown report, which carries every property the test recorded; the JSON report is
    rewritten after each, so an interrupted session keeps what it ran."""

    def __init__(self, session: AuditSession) -> None:
        self.session = session
        #: The ready-made audits skipped because their implementation's library is not installed here.
        self.unavailable: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        gathered = False
        for name, value in report.user_properties:
            if name == RESULT_PROPERTY:
                self.session.gather(json.loads(value))
                gathered = True
            elif name == UNAVAILABLE_PROPERTY:
                self.unavailable.append(json.loads(value))
        if gathered and self.session.enabled:
            try:
                self.session.write_report(complete=False)
            except Exception as exc:  # the verdicts stand; the report at the session's end says whether it can
                sys.stderr.write(f"dpverify: warning: the report could not be rewritten after {report.nodeid}: {type(exc).__name__}: {exc}\n")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker audits with the controller's seed."""
    node.workerinput["dp_audit_seed"] = node.config.stash[SESSION_KEY].seed


def pytest_report_header(config: pytest.Config) -> str | None:
    session = config.stash[SESSION_KEY]
    return session.header(rerun=f"--dp-audit-seed {session.seed}") if session.enabled else None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ready-made audits of the selected implementations (before ``-k``/``-m`` deselect any) under
    the virtual module ``dp-audit``: each one's one-run audit and the two-world audits of the worlds that
    apply to it (``--dp-audit-worlds``), reported as collected so the counts add up. Those the command
    line names by node id are added; the others when the run asks for the whole suite (:func:`_whole_suite`)
    or for the audits (``--dp-audit-only``), not when it names test files of its own. Then
    ``--dp-audit-only`` deselects every other test and ``--dp-audit-skip`` every audit (reported as
    deselected)."""
    selection = config.stash[SELECTION_KEY]
    audit_session = config.stash[SESSION_KEY]
    named = config.stash[NAMED_KEY]
    if named and not audit_session.enabled:
        raise pytest.UsageError(f"{', '.join(named)}: the ready-made audits run with --dp-audit")
    if audit_session.enabled and selection != "skip" and (named or selection == "only" or _whole_suite(config)):
        _add_ready_made_audits(session, audit_session, items, named=named)
    if selection is not None:
        keep = selection == "only"
        deselected = [item for item in items if _is_audit(item) != keep]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if _is_audit(item) == keep]


def _add_ready_made_audits(
    session: pytest.Session, audit_session: AuditSession, items: list[pytest.Item], *, named: tuple[str, ...]
) -> None:
    """Add the ready-made audits, only those ``named`` (node ids, or the module) when any are; a name that
    matches none is a usage error listing them."""
    from dpverify.pytest.items import DPAuditItem, DPAuditModule

    module = DPAuditModule.from_parent(session, name=READY_MADE_MODULE, nodeid=READY_MADE_MODULE)
    infos = [implementation.info for implementation in _selected_implementations(audit_session)]
    added = [
        DPAuditItem.from_parent(module, name=audit.test_name, audit=audit) for audit in audit_session.gate_audits(infos)
    ]
    if named:
        unmatched = [name for name in named if name != READY_MADE_MODULE and name not in {a.nodeid for a in added}]
        if unmatched:
            raise pytest.UsageError(
                f"{', '.join(unmatched)} names no ready-made audit of this session; its audits: "
                f"{', '.join(a.nodeid for a in added) or 'none'} (--dp-audit-implementations chooses the implementations)"
            )
        added = [a for a in added if READY_MADE_MODULE in named or a.nodeid in named]
    if added:
        items.extend(added)
        session.config.hook.pytest_collectreport(report=pytest.CollectReport(module.nodeid, "passed", None, added))


#: The ready-made audits the command line names by node id (taken out of the paths pytest looks for).
NAMED_KEY = pytest.StashKey["tuple[str, ...]"]()


def _take_named_audits(config: pytest.Config) -> tuple[str, ...]:
    """The ready-made audits the command line names by node id, as the test summary prints them
    (``dp-audit::dp-audit[leaky]``, or ``dp-audit`` for all), taken out of ``config.args``: they live in a
    virtual module, not in a file that pytest could find. (An xdist worker parses the same command line.)"""
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return ()
    named = tuple(
        arg
        for arg in config.args
        if arg.split("::")[0] == READY_MADE_MODULE and not (config.invocation_params.dir / READY_MADE_MODULE).exists()
    )
    config.args[:] = [arg for arg in config.args if arg not in named]
    return named


def _whole_suite(config: pytest.Config) -> bool:
    """Whether the run collects the whole suite: no path given (pytest took ``testpaths`` or the current
    directory), or only paths that are the root directory, the current directory or a ``testpaths`` entry.
    Naming a test file or a test selects it alone, so the ready-made audits are then not added; ``-k`` and
    ``-m`` filter the whole suite, so ``-m dp_audit`` runs them."""
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return True
    here = config.invocation_params.dir
    suite = {config.rootpath.resolve(), here.resolve()}
    suite.update((config.rootpath / entry).resolve() for entry in config.getini("testpaths"))
    return all("::" not in arg and (here / arg).resolve() in suite for arg in config.args)


def _is_audit(item: pytest.Item) -> bool:
    """A DP audit: a ready-made one, or a test marked ``dp_audit`` or using the ``dp_audit`` fixture."""
    from dpverify.pytest.items import DPAuditItem

    return (
        isinstance(item, DPAuditItem)
        or "dp_audit" in getattr(item, "fixturenames", ())
        or item.get_closest_marker("dp_audit") is not None
    )


def _selected_implementations(audit_session: AuditSession) -> list[Any]:
    """The implementations the session audits: those ``--dp-audit-implementations`` names (a name or glob
    that matches nothing is a usage error listing the names; ``none``: no implementation), by default those
    not bundled with dpverify."""
    from dpverify.registry import is_bundled, registered_implementations

    registered = registered_implementations()
    if not audit_session.implementations:
        return [i for i in registered if not is_bundled(i.info.name)]
    if audit_session.implementations == ("none",):
        return []
    if all(pattern.startswith(EXCLUDE) for pattern in audit_session.implementations):
        raise pytest.UsageError(
            f"--dp-audit-implementations: {', '.join(audit_session.implementations)} only leaves out; name what to "
            f"audit first, e.g. '*,{audit_session.implementations[0]}'"
        )
    unmatched = [
        pattern
        for pattern in audit_session.implementations
        if not any(fnmatch.fnmatchcase(i.info.name, pattern.removeprefix(EXCLUDE)) for i in registered)
    ]
    if unmatched:
        raise pytest.UsageError(
            f"--dp-audit-implementations: {', '.join(unmatched)} matches no registered implementation; "
            f"registered: {', '.join(i.info.name for i in registered)}"
        )
    return [i for i in registered if audit_session.selected(i.info.name)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plan the session's level from the items that will run (after ``-k``, ``-m`` and node-id selection):
    each keeps its own count, the budget its audits are held to."""
    audit_session = session.config.stash[SESSION_KEY]
    if not audit_session.enabled:
        return
    from dpverify.pytest.items import DPAuditItem

    planned = 0
    for item in session.items:
        if isinstance(item, DPAuditItem):
            count = int(item.audit.counted)
        elif _is_audit(item):
            count = _declared_audits(item)
        else:
            continue
        item.stash[PLANNED_KEY] = count
        planned += count
    audit_session.planned_audits = planned


class MarkerError(ValueError):
    """A ``dp_audit`` marker with a bad argument; it fails its own test, never the whole session."""


def _declared_audits(item: pytest.Item) -> int:
    """How many audits ``item`` may run: its marker's ``audits``, a Hypothesis test's max_examples, or 1
    (also for a bad marker: the test fails at setup without auditing)."""
    try:
        settings = _marker_settings(item)
    except MarkerError:
        return 1
    if "audits" in settings:
        return settings["audits"]
    hypothesis_settings = getattr(getattr(item, "function", None), "_hypothesis_internal_use_settings", None)
    return int(hypothesis_settings.max_examples) if hypothesis_settings is not None else 1


def _marker_settings(item: pytest.Item) -> dict[str, Any]:
    """The ``dp_audit`` marker's keywords (closest marker wins per key), checked; a bad one raises
    :class:`MarkerError` naming the test, the keyword and the known ones."""
    merged: dict[str, Any] = {}
    for marker in reversed(list(item.iter_markers("dp_audit"))):
        if marker.args:
            raise MarkerError(f"{item.nodeid}: dp_audit marker takes keywords only, got {marker.args!r}")
        merged.update(marker.kwargs)
    if not merged:
        return merged
    from dpverify.pytest.fixture import MARKER_KEYWORDS

    unknown = sorted(set(merged) - set(MARKER_KEYWORDS))
    if unknown:
        raise MarkerError(
            f"{item.nodeid}: unknown dp_audit marker keyword(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(MARKER_KEYWORDS))} (seed and confidence are the session's)"
        )
    audits = merged.get("audits", 1)
    if isinstance(audits, bool) or not isinstance(audits, int) or audits < 1:
        raise MarkerError(f"{item.nodeid}: dp_audit marker audits must be an integer >= 1, got {audits!r}")
    return merged


@pytest.fixture
def dp_audit(request: pytest.FixtureRequest) -> Any:
    """Run audits from your own tests: ``dp_audit(implementation, config=None, **settings) -> AuditResult``."""
    from dpverify.pytest.fixture import DPAudit, audit_config

    session = request.config.stash[SESSION_KEY]
    if not session.enabled:
        pytest.skip("DP audits are off; run pytest with --dp-audit")
    problem = None
    try:
        settings = _marker_settings(request.node)
        audit_config(session, settings)
    except MarkerError as exc:
        problem = str(exc)
    except ValueError as exc:
        problem = f"{request.node.nodeid}: dp_audit marker: {exc}"
    if problem:  # failed outside the except clause: the message once, not again as the failure's context
        pytest.fail(problem, pytrace=False)
    return DPAudit(session, request.node, settings, request.node.stash.get(PLANNED_KEY, 0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A Hypothesis test that passed with every example undecided is undecided itself: its report becomes a
    skip (:meth:`dpverify.pytest.fixture.DPAudit.undecided_reason`). A test that failed keeps its outcome."""
    outcome = yield
    report = outcome.get_result()
    reason = getattr(getattr(item, "funcargs", {}).get("dp_audit"), "undecided_reason", None)
    if call.when == "call" and report.passed and reason is not None and (why := reason()) is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"Skipped: {why}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``dp_implementation`` takes the implementations the session audits, as the ready-made items do (the
    fixture judges each by its own expectation); with audits off, every registered one, to be skipped."""
    if "dp_implementation" not in metafunc.fixturenames:
        return
    from dpverify.registry import registered_implementations

    audit_session = metafunc.config.stash[SESSION_KEY]
    chosen = _selected_implementations(audit_session) if audit_session.enabled else registered_implementations()
    params = []
    for implementation in chosen:
        reason = implementation.unavailable_reason()
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(implementation, id=implementation.info.name, marks=marks))
    metafunc.parametrize("dp_implementation", params, indirect=True)


@pytest.fixture
def dp_implementation(request: pytest.FixtureRequest) -> Any:
    """Each implementation the session audits in turn (ids are their names)."""
    return request.param


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    audit_session = session.config.stash[SESSION_KEY]
    if audit_session.enabled and not hasattr(session.config, "workerinput"):
        _compare(session)
        session.config.stash[STOPPED_KEY] = stopped = _stopped(session, exitstatus)
        audit_session.write_report(stopped=stopped)


#: Why the session stopped before its end (``None``: it ran every selected test), for the summary.
STOPPED_KEY = pytest.StashKey["str | None"]()


def _stopped(session: pytest.Session, exitstatus: int) -> str | None:
    """Why the session ended before running every selected test, or ``None``: interrupted (Ctrl-C; under
    xdist also a worker's failure limit), stopped by ``-x``/``--maxfail`` (the audits not run are missing
    from the report, so it is not complete), or an internal error."""
    reason = session.shouldfail or session.shouldstop
    if reason:
        return str(reason)
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "interrupted"
    if exitstatus == pytest.ExitCode.INTERNAL_ERROR:
        return "internal error"
    return None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from dpverify.pytest.items import not_audited_lines

    session = config.stash[SESSION_KEY]
    not_audited = not_audited_lines(config.pluginmanager.get_plugin("dpverify-results").unavailable)
    if not (session.results or not_audited) or hasattr(config, "workerinput"):
        return
    terminalreporter.write_sep("=", "dp-audit summary")
    for line in session.summary_lines() if session.results else ():
        terminalreporter.write_line(line)
    unexpected = [r for r in session.results if not outcome_as_expected(r)]
    if unexpected:
        terminalreporter.write_line(f"{len(unexpected)} outcome(s) other than expected (marked '!').")
    for line in not_audited:
        terminalreporter.write_line(line)
    if session.report_path:
        stopped = config.stash.get(STOPPED_KEY, None)
        terminalreporter.write_line(f"dp-audit JSON report: {session.report_path}" + (f" (incomplete: {stopped})" if stopped else ""))
    comparison = config.stash.get(COMPARISON_KEY, None)
    if comparison is not None:
        terminalreporter.write_sep("=", "dp-audit comparison with the baseline")
        for line in comparison.lines():
            terminalreporter.write_line(line)
        if comparison.risen and options.resolve(config, "compare-fail"):
            terminalreporter.write_line(f"{len(comparison.risen)} significant rise(s): --dp-audit-compare-fail fails the session.")
