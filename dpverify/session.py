"""A session of audits, framework-free (the pytest plugin and the CLI share it): the level shared among
audits, the seed, the gathered results, the terminal table and the JSON report.

The session promises: a correct implementation fails *anywhere* in the session with probability at most
``1 − confidence``. At collection every audit that could raise a false alarm is counted (one per
ready-made audit of an implementation expected to be private, ``audits=N`` from a ``dp_audit`` marker, or
a Hypothesis test's ``max_examples``) and each audit gets confidence ``1 − (1 − confidence)/N``
(Bonferroni), so the union bound holds whichever audits fail. Audits of declared buggy variants fail the
session only when they are *not* refuted, so they take no share of the level.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class PlanExceeded(RuntimeError):
    """An audit would run past the session's plan, which would break the session-wide level."""


@dataclass(eq=False)
class AuditSession:
    """``confidence_per_audit``, when given, is every audit's own level (to reproduce one audit as it ran);
    otherwise the session's level is split over ``planned_audits``, and :meth:`start_audit` refuses an
    audit past the plan."""

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
    strict: bool = False
    timeout: float | None = None
    audits_started: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)

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

    def audit_seed(self, key: str) -> int:
        """A seed for one audit, from the session seed and a stable key (same on every xdist worker)."""
        return zlib.crc32(f"{self.seed}:{key}".encode()) & 0x7FFFFFFF

    def selected(self, name: str) -> bool:
        import fnmatch

        return not self.implementations or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.implementations)

    def gather(self, result: dict[str, Any]) -> None:
        """Add one audit's JSON result; a result that carries ``planned_audits`` (from an xdist worker, the
        only place that collects and counts) raises the plan to it."""
        result = dict(result)
        self.planned_audits = max(self.planned_audits, result.pop("planned_audits", 0))
        self.results.append(result)

    def header(self, *, rerun: str) -> str:
        """The run's settings in one line, ending with how to ``rerun`` it (the face's own flag)."""
        from dpverify.audits.steps import resolve_device

        return (
            f"dpverify: DP audits on (profile {self.profile}, seed {self.seed}, device {resolve_device(self.device)}, "
            f"session confidence {self.confidence:g}); rerun with {rerun}"
        )

    def report(self) -> dict[str, Any]:
        return {
            "confidence": self.confidence,
            "per_audit_confidence": self.per_audit_confidence,
            "planned_audits": self.planned_audits,
            "seed": self.seed,
            "profile": self.profile,
            "audits": self.results,
        }

    def write_report(self) -> Path | None:
        if not self.report_path:
            return None
        path = Path(self.report_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=2, allow_nan=False))
        return path

    def summary_lines(self) -> list[str]:
        """The terminal table: one row per audit, expected outcomes marked apart from unexpected ones."""
        header = ("implementation", "design", "relation", "claimed ε", "ε_L", "ε_O", "verdict", "expected", "s")
        rows = [header]
        for r in sorted(self.results, key=lambda r: (r["implementation"], r["seed"])):
            expected = r["expected"] if r["detectability"] is None else f"{r['expected']} ({r['detectability']})"
            rows.append(
                (
                    r["implementation"],
                    r["design"],
                    r["relation"],
                    _fmt(r["claimed_epsilon"]),
                    _fmt(r["epsilon_lower_bound"]),
                    _fmt(r["optimal_epsilon"]),
                    f"{r['verdict']} {outcome_mark(r)}".rstrip(),
                    expected,
                    f"{r['seconds']:.1f}",
                )
            )
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * width for width in widths))
        lines.append(
            f"{len(self.results)} audit(s); each at confidence {self.per_audit_confidence:.5f} so that the "
            f"session keeps {self.confidence:g} over {self.planned_audits} planned audit(s). "
            "'!' marks an outcome other than expected, '~' a subtle (D3/D4) variant not caught, 'K' a known "
            "issue of an unmodified library found again."
        )
        return lines


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


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return "∞" if value == "inf" else value
    return "∞" if math.isinf(value) else ("nan" if math.isnan(value) else f"{value:.3f}")
