"""A session of audits, framework-free (the pytest plugin and the CLI share it): the level shared among
audits, the seed, the gathered results, the terminal table and the JSON report.

The session promises: a correct implementation fails *anywhere* in the session with probability at most
``1 − confidence``. At collection every audit that could raise a false alarm is counted (one per
ready-made audit of an implementation expected to be private, ``audits=N`` from a ``dp_audit`` marker, or
a Hypothesis test's ``max_examples``) and each audit gets confidence ``1 − (1 − confidence)/N``
(Bonferroni), so the union bound holds whichever audits fail. Audits of declared buggy variants fail the
session only when they are *not* refuted, so they take no share of the level; nor do known issues, nor a
Hypothesis test's audits after its first failure. Each report entry says whether the level counts it
(``counted``). A comparison with a baseline that fails the session (``--dp-audit-compare-fail``) is a
second family of tests at its own full level.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shlex
import sys
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from dpverify._text import decided_by, deficit_text, report_number
from dpverify.execution import Executor, ExecutorSpec

if TYPE_CHECKING:
    from dpverify.compare import Comparison
    from dpverify.config import AuditConfig
    from dpverify.contract import Implementation, ImplementationInfo
    from dpverify.gate import GateAudit
    from dpverify.results import AuditResult


def utc_now() -> str:
    """The time now in UTC, ISO 8601 to the second (``2026-11-26T07:01:02Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def process_command() -> str:
    """This process's command line as a shell would take it (what the report records by default)."""
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else ""


#: A pattern that starts with this excludes the names it matches (``*,!jax-privacy-keras-no*``).
EXCLUDE = "!"


def selected_by(patterns: Sequence[str], name: str) -> bool:
    """Whether ``name`` matches one of the glob ``patterns`` and none of the exclusions among them (a
    pattern after :data:`EXCLUDE`). Exclusions take from what the other patterns select, so a list of
    exclusions alone selects nothing."""
    import fnmatch

    excluded = [p.removeprefix(EXCLUDE) for p in patterns if p.startswith(EXCLUDE)]
    included = [p for p in patterns if not p.startswith(EXCLUDE)]
    return any(fnmatch.fnmatchcase(name, p) for p in included) and not any(fnmatch.fnmatchcase(name, p) for p in excluded)


class PlanExceeded(RuntimeError):
    """An audit would run past the session's plan, which would break the session-wide level."""


@dataclass(eq=False)
class AuditSession:
    """``confidence_per_audit``, when given, is every audit's own level (to reproduce one audit as it ran);
    otherwise the session's level is split over ``planned_audits``, and :meth:`start_audit` refuses an
    audit past the plan. ``executor`` says where the audits' independent runs train: one executor for
    the whole session (:meth:`executor_for_audits`), shut down by :meth:`close`."""

    enabled: bool
    profile: str
    confidence: float
    seed: int
    device: str
    epsilon: float
    implementations: tuple[str, ...]
    report_path: str | None
    plots_dir: str | None
    planned_audits: int = 0
    confidence_per_audit: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: The default gate's two-world audits: ``"applicable"``, ``"none"`` or world names (:mod:`dpverify.gate`).
    worlds: str | tuple[str, ...] = "applicable"
    #: Whether the default gate runs each classifier's every-update audit (:mod:`dpverify.gate`).
    every_update: bool = True
    #: The default gate's layer-design audits: ``"applicable"`` or ``"none"`` (:mod:`dpverify.gate`).
    layers: str = "applicable"
    strict: bool = False
    timeout: float | None = None
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    audits_started: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)
    #: The baseline report (``--compare``, ``--dp-audit-compare``), read and checked before any audit
    #: (:meth:`load_baseline`), and the comparison with it (:meth:`dpverify.compare.Comparison.to_dict`), when
    #: one was made (:meth:`compare`).
    baseline: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None
    #: What the report says made it, and when the session started.
    command: str = field(default_factory=process_command)
    started_at: str = field(default_factory=utc_now)
    _executor: Executor | None = field(default=None, init=False, repr=False)

    @property
    def per_audit_confidence(self) -> float:
        if self.confidence_per_audit is not None:
            return self.confidence_per_audit
        return 1.0 - (1.0 - self.confidence) / max(1, self.planned_audits)

    def start_audit(self, *, counted: bool, where: str) -> None:
        """Count one audit as it starts. A ``counted`` audit (one that could raise a false alarm) past the
        plan raises :class:`PlanExceeded`: it would have run at a looser level than the session promised."""
        if not counted or self.confidence_per_audit is not None:
            return
        self.audits_started += 1
        if self.audits_started > self.planned_audits:
            raise PlanExceeded(
                f"{where}: audit {self.audits_started} of a session that planned {self.planned_audits}; the "
                "session's level is split over the audits planned at collection, so an audit the plan did not "
                "count cannot run. Request the dp_audit fixture as a test argument (not through "
                "request.getfixturevalue) or declare the test's audits with @pytest.mark.dp_audit(audits=N)"
            )

    def executor_for_audits(self) -> Executor:
        """The session's executor, started on first use (a pool's processes and Ray only when runs come)."""
        if self._executor is None:
            self._executor = self.executor.start()
        return self._executor

    def close(self) -> None:
        """Shut the session's executor down (its worker processes, a Ray cluster it started)."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def gate_audits(self, infos: list[ImplementationInfo]) -> list[GateAudit]:
        """The default gate's audits of ``infos`` as this session asks for them: its worlds, every-update
        audits and layer designs, and the one-run audits at q = 1 where its profile and settings train there
        (:func:`dpverify.gate.gate_audits`). The plan of both front ends, the command line and the plugin."""
        from dpverify.config import one_run_full_batch
        from dpverify.gate import gate_audits

        return gate_audits(
            infos,
            worlds=self.worlds,
            every_update=self.every_update,
            layers=self.layers == "applicable",
            full_batch=one_run_full_batch(self.profile, self.settings),
        )

    def gate_config(self, audit: GateAudit, *, one_run: Callable[[], AuditConfig]) -> AuditConfig:
        """The configuration of the gate's ``audit`` (:meth:`~dpverify.gate.GateAudit.config`) at this
        session's profile, device and time limit: an every-update, layer or world audit takes those of the
        session's settings its design lets change (it designates its own σ); ``one_run`` builds a one-run
        audit's, whose settings each front end ranks its own way."""
        limit = {} if self.timeout is None else {"timeout": self.timeout}
        return audit.config(self.profile, {"device": self.device, **limit, **self.settings}, one_run=one_run)

    def load_baseline(self, path: str | None, *, option: str) -> None:
        """Read and check the baseline report at ``path`` (none: no comparison) before any audit runs: one
        that cannot be compared with is a ``ValueError`` naming ``option``, not a failure after the audits."""
        if not path:
            return
        from dpverify.compare import BaselineError, load_baseline

        try:
            self.baseline = load_baseline(path)
        except BaselineError as exc:
            raise ValueError(f"{option}: {exc}") from None

    def compare(self) -> Comparison | None:
        """The results compared with the baseline, kept for the report (:attr:`comparison`); ``None``
        without a baseline."""
        if self.baseline is None:
            return None
        from dpverify.compare import compare_reports

        comparison = compare_reports(self.baseline, self.results, confidence=self.confidence)
        self.comparison = comparison.to_dict()
        return comparison

    def audit_seed(self, key: str) -> int:
        """A seed for one audit, from the session seed and a stable key (same on every xdist worker)."""
        return zlib.crc32(f"{self.seed}:{key}".encode()) & 0x7FFFFFFF

    def selected(self, name: str) -> bool:
        """Whether the session audits ``name``: every name when no pattern is given, else one that matches
        a pattern and no exclusion (:func:`selected_by`)."""
        return not self.implementations or selected_by(self.implementations, name)

    def gather(self, result: dict[str, Any]) -> None:
        """Add one audit's JSON result; a result that carries ``planned_audits`` (from an xdist worker, the
        only place that collects and counts) raises the plan to it."""
        result = dict(result)
        self.planned_audits = max(self.planned_audits, result.pop("planned_audits", 0))
        self.results.append(result)

    def header(self, *, rerun: str) -> str:
        """The run's settings in one line, ending with how to ``rerun`` it (the face's own flag)."""
        from dpverify.audits.planning import resolve_device

        return (
            f"dpverify: DP audits on (profile {self.profile}, seed {self.seed}, device {resolve_device(self.device)}, "
            f"session confidence {self.confidence:g}); rerun with {rerun}"
        )

    def report(self, *, complete: bool = True, stopped: str | None = None) -> dict[str, Any]:
        """The JSON report: what made it (versions, command line, UTC times), the level, one entry per audit.
        ``complete`` is false in a report written while audits still run, and in one of a run that stopped
        before its end (``stopped`` says why: interrupted, or stopped after failures by ``-x``)."""
        from dpverify import __version__

        return {
            "dpverify_version": __version__,
            "python_version": platform.python_version(),
            "libraries": {r["library"]: r["library_version"] for r in self.results if "library" in r},
            "command": self.command,
            "started_at": self.started_at,
            "written_at": utc_now(),
            "complete": complete and stopped is None,
            "stopped": stopped,
            "confidence": self.confidence,
            "per_audit_confidence": self.per_audit_confidence,
            "planned_audits": self.planned_audits,
            "seed": self.seed,
            "profile": self.profile,
            "audits": self.results,
            **({"comparison": self.comparison} if self.comparison is not None else {}),
        }

    def write_report(self, *, complete: bool = True, stopped: str | None = None) -> Path | None:
        """Write :meth:`report` to ``report_path`` atomically (a reader, or a run killed mid-write, sees the
        previous report or the new one, never half of one); ``None`` when no path is set. Call it before
        the first audit too: an unwritable path then fails at once, not after every audit has run."""
        if not self.report_path:
            return None
        path = Path(self.report_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(self.report(complete=complete, stopped=stopped), indent=2, allow_nan=False) + "\n")
        return path

    def summary_lines(self, *, ascii: bool = False) -> list[str]:
        """The terminal table: one row per audit, expected outcomes marked apart from unexpected ones.

        The test column tells apart two audits of one implementation. Both tests show: ε_L is the (ε, δ)
        test's bound, curve ε_L the curve test's (the ε of the weakest member of the claim's family it
        refutes), curve p its smallest tail bound, and "decided" names the test that refuted the claim. ρ is
        the share of the claimed signal the canaries carried and k* the smallest noise deficit the audit
        would refute with probability 0.8 ("none": not even 10×; "n/a": a two-world audit whose score reads
        the noise's scale, not the record). "counted" says whether the session's level counts the audit. The
        note says why an audit errored, could not see, what failed beside its verdict, or how many canaries
        an undecided one needs. ``ascii`` spells ε and ∞ in ASCII before the columns are aligned,
        for a terminal that cannot show them."""
        header = ("implementation", "test", "design", "claimed ε", "ε_L", "curve ε_L", "curve p", "decided", "ρ", "k*",
                  "ε_O", "verdict", "expected", "counted", "s", "note")  # fmt: skip
        rows = [header]
        for r in sorted(self.results, key=lambda r: (r["implementation"], r.get("nodeid") or "", r["seed"])):
            expected = r["expected"] if r["detectability"] is None else f"{r['expected']} ({r['detectability']})"
            rows.append(
                (
                    r["implementation"],
                    r.get("nodeid") or "-",
                    _design(r),
                    report_number(r, "claimed_epsilon"),
                    report_number(r, "epsilon_lower_bound"),
                    report_number(r, "curve_epsilon_lower_bound"),
                    "-" if r.get("curve_p_value") is None else f"{r['curve_p_value']:.2g}",
                    decided_by(r),
                    *_power_cells(r),
                    report_number(r, "optimal_epsilon"),
                    f"{r['verdict']} {outcome_mark(r)}".rstrip(),
                    expected,
                    _counted_cell(r),
                    "-" if r.get("seconds") is None else f"{r['seconds']:.1f}",
                    _note(r),
                )
            )
        if ascii:
            rows = [tuple(to_ascii(str(cell)) for cell in row) for row in rows]
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * width for width in widths))
        lines.append(
            f"{len(self.results)} audit(s); each at confidence {self.per_audit_confidence:.5f} so that the "
            f"session keeps {self.confidence:g} over {self.planned_audits} planned audit(s): the plan counts "
            "the audits of implementations expected private, the only ones that can raise a false alarm (a buggy "
            "variant's violation and a known issue's are the expected outcomes). '!' marks an outcome other "
            "than expected, '~' a subtle (D3/D4) variant not caught, 'K' a known issue of an unmodified library "
            "found again. 'counted' says whether an audit is one of them: 'no' for buggy variants and known "
            "issues, and for a Hypothesis test's audits after its first failure (replays, outside the level: the "
            "test has failed already)."
        )
        return lines


def audit_entry(
    result: AuditResult, implementation: Implementation, *, nodeid: str | None = None, counted: bool = False
) -> dict[str, Any]:
    """One audit as the report holds it: the result's fields, the library and its version, the known issue's
    address the audit was judged against (``issue``: the implementation's, or its layer design's), the test that
    ran it (``nodeid``: a pytest node id, or ``dpverify audit <name>`` from the command line) and whether
    the session's level counts it (``counted``; the table's column of that name). Never raises: should the
    result's fields fail to convert, the entry holds its verdict and plain fields, with the failure among
    its ``auxiliary_failures`` (the report is written after the verdict and never loses it)."""
    from dpverify.results import beside_verdict

    failures: list[tuple[str, str]] = []
    fields = beside_verdict("report entry", result.to_dict, failures) or _plain_fields(result)
    version = beside_verdict("report entry", implementation.library_version, failures)
    fields["auxiliary_failures"] = [*fields["auxiliary_failures"], *({"what": what, "error": error} for what, error in failures)]
    entry = {"nodeid": nodeid} if nodeid else {}
    return {
        **entry,
        **fields,
        "counted": counted,
        "issue": implementation.info.issue,
        "library": implementation.info.library,
        "library_version": version,
    }


#: Fields of a report entry that :func:`_plain_fields` copies as they are when the full entry failed.
_PLAIN_FIELDS = ("implementation", "expected", "detectability", "design", "relation", "claim_consistent", "curve_refuted",
                 "confidence", "canaries_needed", "m", "guesses", "correct", "verdict", "seed", "device", "error")  # fmt: skip
#: Number fields of a report entry that it copies when finite.
_PLAIN_NUMBERS = ("claimed_epsilon", "library_epsilon", "delta", "epsilon_lower_bound", "curve_epsilon_lower_bound",
                  "curve_p_value", "optimal_epsilon", "seconds")  # fmt: skip


def _plain_fields(result: AuditResult) -> dict[str, Any]:
    """The verdict and the fields the table reads, as plain JSON, for an entry whose full conversion
    failed."""

    def number(value: Any) -> float | None:
        try:
            return float(value) if math.isfinite(float(value)) else None
        except (TypeError, ValueError):
            return None

    fields: dict[str, Any] = {name: _plain(getattr(result, name, None)) for name in _PLAIN_FIELDS}
    fields.update({name: number(getattr(result, name, None)) for name in _PLAIN_NUMBERS})
    fields.update(infinite=[], power=None, config={}, bound_by_guesses=[])
    fields["auxiliary_failures"] = [{"what": what, "error": error} for what, error in result.auxiliary_failures]
    return fields


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def with_plots(result: AuditResult, directory: str) -> AuditResult:
    """``result`` once its pictures are saved in ``directory`` (:mod:`dpverify.plots`); should they fail
    (matplotlib missing included), the failure travels beside the verdict in ``auxiliary_failures``."""
    from dpverify.results import beside_verdict

    def save() -> None:
        try:
            from dpverify.plots import save_audit_plots
        except ImportError as exc:
            raise ImportError(f"plots need matplotlib ({exc}): pip install 'dpverify[plots]'") from exc
        save_audit_plots(result, directory)

    failures: list[tuple[str, str]] = []
    beside_verdict("plots", save, failures)
    return dataclasses.replace(result, auxiliary_failures=(*result.auxiliary_failures, *failures)) if failures else result


#: ASCII for the symbols dpverify prints, for a terminal whose encoding lacks them.
ASCII_FALLBACK = {"ε": "eps", "∞": "inf", "σ": "sigma", "δ": "delta", "≤": "<=", "≥": ">=", "−": "-", "→": "->"}


def to_ascii(text: str) -> str:
    """``text`` with :data:`ASCII_FALLBACK` spellings, any other non-ASCII character as '?'."""
    return "".join(char if char.isascii() else ASCII_FALLBACK.get(char, "?") for char in text)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, then rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


#: Variants a one-run black-box audit must catch; D3/D4 variants are reported, a miss is a known limit.
MUST_CATCH = ("D1", "D2")


def outcome_mark(result: dict[str, Any]) -> str:
    """'' as expected; '~' a D3/D4 variant not caught (a known limit); 'K' a known issue of an unmodified
    library found again (a finding, reported); '!' anything else unexpected: a private implementation
    refuted, a D1/D2 variant missed, or an error."""
    if result["verdict"] == "error":
        return "!"
    if result["expected"] == "known-issue":
        return "K" if result["verdict"] == "violation" else ""
    if result["expected"] == "violation":
        if result["verdict"] == "violation":
            return ""
        return "!" if result["detectability"] in MUST_CATCH else "~"
    return "!" if result["verdict"] == "violation" else ""


def outcome_as_expected(result: dict[str, Any]) -> bool:
    return outcome_mark(result) != "!"


def _design(result: dict[str, Any]) -> str:
    """The design, with its world for a two-world audit (``two_world:dataset_size``), its layer for a layer
    design (``inclusion:embedding``), and ``@updates`` where the adversary saw every released update rather
    than the final model."""
    design = result["design"]
    if design == "two_world":
        design = f"two_world:{(result.get('config') or {}).get('worlds', {}).get('world', '?')}"
    layer = ((result.get("config") or {}).get("architecture") or {}).get("layer")
    if layer is not None:
        design = f"{design}:{layer}"
    return f"{design}@updates" if result.get("observed") == "every update" else design


def _counted_cell(result: dict[str, Any]) -> str:
    """'yes' for an audit the session's level counts, 'no' for one outside it, '-' when the entry does not
    say (a report of an earlier version)."""
    counted = result.get("counted")
    return "-" if counted is None else "yes" if counted else "no"


def _power_cells(result: dict[str, Any]) -> tuple[str, str]:
    """(ρ, k*) of a report entry: k* rounded up to 0.1, "none" beyond 10×, "not stated" where the design has
    no validated model for it, "-" where a refuted claim did not ask it, "n/a" without a power measure."""
    power = result.get("power")
    if power is None:
        return "-", "n/a" if result["design"] == "two_world" and result["verdict"] != "error" else "-"
    rho = "-" if power["signal_fraction"] is None else f"{power['signal_fraction']:.2f}"
    deficit = power["smallest_deficit"]
    if not power.get("deficit_asked", True):
        return rho, "-"
    if not power.get("deficit_stated", True):
        return rho, "not stated"
    return rho, "none" if deficit is None else deficit_text(deficit)


#: Longest note the table shows; the report holds the whole error.
NOTE_WIDTH = 72


def _clipped(note: str) -> str:
    return note if len(note) <= NOTE_WIDTH else note[: NOTE_WIDTH - 3] + "..."


def _note(result: dict[str, Any]) -> str:
    """Why an audit errored (its first line), why it could not see, or how many canaries an undecided one
    needs."""
    if result["verdict"] == "error" and result["error"]:
        return _clipped(result["error"].splitlines()[0])
    if result.get("not_run"):
        return _clipped(f"not run: {result['not_run']}")
    blind = (result.get("power") or {}).get("blind")
    if result["verdict"] == "undecided" and blind:
        return _clipped(f"could not see: {blind}")
    failures = result.get("auxiliary_failures") or []
    if failures:
        return _clipped("failed beside the verdict: " + "; ".join(f"{f['what']}: {f['error']}" for f in failures))
    if result["verdict"] == "undecided":
        needed = result["canaries_needed"]
        if "claimed_epsilon" in result.get("infinite", ()):
            return "no audit refutes ε = ∞"
        if needed:
            return f"needs m >= {needed}"
        from dpverify.audits.planning import MAX_CANARIES

        return f"no m up to {MAX_CANARIES:,} decides it"
    return ""
