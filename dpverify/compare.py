"""Release-to-release comparison: this run's audits against a saved JSON report (the baseline), flagging
an implementation whose audits got significantly more right than they did in the baseline.

The pytest plugin (``--dp-audit-compare``) and the CLI (``dpverify audit --compare``) only call
:func:`load_baseline` at start and :func:`compare_reports` at the end. Framework-free; scipy is imported
when a comparison is made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpverify._text import report_number

#: Fields every audit entry of a report must have for a comparison (:func:`dpverify.session.audit_entry`).
COMPARED_FIELDS = (
    "implementation",
    "design",
    "verdict",
    "config",
    "guesses",
    "correct",
    "bound_by_guesses",
    "epsilon_lower_bound",
    "curve_epsilon_lower_bound",
    "curve_p_value",
)
#: Config fields of the run, not of what was audited: a baseline from another seed or level still matches.
RUN_FIELDS = ("seed", "confidence", "device", "timeout")


class BaselineError(ValueError):
    """The baseline report cannot be compared with; the message names the path and what is wrong."""


def load_baseline(path: str | Path) -> dict[str, Any]:
    """The report at ``path``, checked: readable, JSON, a dpverify report whose audits carry
    :data:`COMPARED_FIELDS`, from a compatible dpverify (the same major version, and the same minor
    while the major is 0). Raises :class:`BaselineError` naming ``path``."""
    from dpverify import __version__

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"baseline {path}: no such file; write one with --dp-audit-report or --report") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"baseline {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {path}: not JSON ({exc})") from None
    if not isinstance(report, dict) or "dpverify_version" not in report or not isinstance(report.get("audits"), list):
        raise BaselineError(f"baseline {path}: not a dpverify report (no dpverify_version and audits list)")
    version = str(report["dpverify_version"])
    if _release_series(version) != _release_series(__version__):
        raise BaselineError(
            f"baseline {path}: written by dpverify {version}, incompatible with this dpverify {__version__}; "
            "write a new baseline with this version"
        )
    for index, entry in enumerate(report["audits"]):
        missing = [name for name in COMPARED_FIELDS if not isinstance(entry, dict) or name not in entry]
        if missing:
            raise BaselineError(f"baseline {path}: audit {index} lacks {', '.join(missing)}; not a dpverify report")
    return {**report, "path": str(path)}


def _release_series(version: str) -> tuple[str, ...]:
    """What must match for reports to be compatible: the major version, and the minor while it is 0."""
    parts = version.split(".")
    return tuple(parts[:2]) if parts[0] == "0" else tuple(parts[:1])


def rise_p_value(*, guesses: Any, baseline_correct: Any, correct: Any) -> Any:
    """Fisher's exact one-sided p-value that ``correct`` of ``guesses`` is a higher rate than
    ``baseline_correct`` of ``guesses`` (see :class:`AuditComparison`); broadcasts over numpy arrays."""
    from scipy.stats import hypergeom

    return hypergeom.sf(correct - 1, 2 * guesses, baseline_correct + correct, guesses)


@dataclass(frozen=True, kw_only=True)
class AuditComparison:
    """One audit of this run against its baseline match.

    The (ε, δ) bound ε_L grows with the correct guesses at a fixed number of guesses k, m, δ and level,
    so a rise in ε_L at the baseline's deciding count is a rise in the rate of correct guesses there.
    The test: k = ``guesses`` is the baseline's deciding count (its largest ε_L); the baseline got
    c_b = ``baseline_correct`` right and this run c_n = ``correct`` at the same k. Each run's k guesses are
    taken as independent trials with the run's own rate, p_b and p_n (the model behind the one-run bound,
    where a private run's guesses are dominated by independent trials; seeds differ, so the runs are
    independent). H0: p_n ≤ p_b. Given the total c_b + c_n, c_n is hypergeometric under p_n = p_b, and
    stochastically smaller below it, so Fisher's exact one-sided p-value

        p = P[X ≥ c_n],  X ~ Hypergeometric(population 2k, c_b + c_n successes in it, k drawn)

    has P[p ≤ α] ≤ α under H0. Taking k at the baseline's largest ε_L favours the baseline (its c_b is
    the high one), which only makes the test more cautious. The independence of one run's guesses is a
    model, not a theorem (they share the run's trained model): a count that varies more than a binomial
    one between seeds would raise the false-alarm rate. Measured: reference-dpsgd at the quick profile
    over 30 seeds had a count variance 0.66 to 1.07 times the binomial one at every guess count from 100
    to 10 000, and the test at 0.05 flagged 2.0 to 4.4 % of the ordered pairs of those seeds; the level
    under the model is checked by simulation (tests/test_compare.py). ``rose`` is p ≤ ``level``, the session's
    level 1 − confidence split over the compared audits (Bonferroni), so a comparison raises a false
    alarm anywhere with probability at most 1 − confidence. The curve test's ε and p-values are shown
    side by side, not tested (its p-value is a tail bound of one run, not a rate).

    ``p_value`` is ``None`` when the audits cannot be compared (``note`` says why: an error, guess
    counts that differ, no guesses)."""

    implementation: str
    test: str
    baseline: dict[str, Any]
    current: dict[str, Any]
    guesses: int | None
    baseline_correct: int | None
    correct: int | None
    p_value: float | None
    level: float
    note: str = ""

    @property
    def rose(self) -> bool:
        return self.p_value is not None and self.p_value <= self.level

    def to_dict(self) -> dict[str, Any]:
        return {
            "implementation": self.implementation,
            "test": self.test,
            "guesses": self.guesses,
            "baseline_correct": self.baseline_correct,
            "correct": self.correct,
            "p_value": self.p_value,
            "level": self.level,
            "rose": self.rose,
            "note": self.note,
            **{f"baseline_{name}": self.baseline[name] for name in SHOWN_FIELDS + ("seed",)},
            **{name: self.current[name] for name in SHOWN_FIELDS + ("seed",)},
        }


#: Fields a comparison shows for both runs.
SHOWN_FIELDS = ("epsilon_lower_bound", "curve_epsilon_lower_bound", "curve_p_value", "verdict")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """This run against a baseline: ``compared`` the matched audits, ``unmatched`` this run's audits with
    no baseline match, ``not_rerun`` the baseline's audits this run did not repeat, ``confidence`` the
    session's (its level 1 − confidence is split over the comparable audits)."""

    baseline_path: str
    baseline_version: str
    baseline_started_at: str
    confidence: float
    compared: tuple[AuditComparison, ...]
    unmatched: tuple[str, ...]
    not_rerun: tuple[str, ...]

    @property
    def risen(self) -> tuple[AuditComparison, ...]:
        return tuple(c for c in self.compared if c.rose)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline_path,
            "baseline_dpverify_version": self.baseline_version,
            "baseline_started_at": self.baseline_started_at,
            "confidence": self.confidence,
            "audits": [c.to_dict() for c in self.compared],
            "unmatched": list(self.unmatched),
            "not_rerun": list(self.not_rerun),
            "risen": len(self.risen),
        }

    def lines(self) -> list[str]:
        """The terminal section: one row per matched audit, baseline → now, then what did not match."""
        rows = [("implementation", "test", "ε_L", "curve ε_L", "curve p", "verdict", "rise of correct guesses")]
        for c in sorted(self.compared, key=lambda c: (c.implementation, c.test)):
            rows.append(
                (
                    c.implementation,
                    c.test,
                    *(f"{_shown(c.baseline, name)} → {_shown(c.current, name)}" for name in SHOWN_FIELDS),
                    _rise(c),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * width for width in widths))
        lines += [f"no baseline match: {label}" for label in self.unmatched]
        lines += [f"in the baseline, not run now: {label}" for label in self.not_rerun]
        comparable = sum(c.p_value is not None for c in self.compared)
        lines.append(
            f"baseline {self.baseline_path} (dpverify {self.baseline_version}, started {self.baseline_started_at}): "
            f"{len(self.compared)} audit(s) matched, {comparable} compared by Fisher's exact one-sided test of the "
            f"correct guesses at the baseline's deciding count, each at level {_level(self.compared)} so that all "
            f"keep {1 - self.confidence:.3g}; {len(self.risen)} rose significantly. A family of its own beside the "
            f"audits' level: failing the session on a rise (compare-fail) can add up to {1 - self.confidence:.3g} to "
            "the chance that a correct, unchanged implementation fails it."
        )
        return lines


def _shown(entry: dict[str, Any], name: str) -> str:
    if name == "verdict":
        return entry["verdict"]
    if name == "curve_p_value":
        return "-" if entry[name] is None else f"{entry[name]:.3g}"
    return report_number(entry, name)


def _rise(comparison: AuditComparison) -> str:
    if comparison.p_value is None:
        return f"not compared: {comparison.note}"
    counts = f"{comparison.baseline_correct} → {comparison.correct} of {comparison.guesses}"
    if comparison.rose:
        return f"ROSE significantly (p = {comparison.p_value:.3g}; {counts})"
    return f"no significant rise (p = {comparison.p_value:.3g}; {counts})"


def _level(compared: tuple[AuditComparison, ...]) -> str:
    return f"{compared[0].level:.3g}" if compared else "-"


def audit_label(entry: dict[str, Any]) -> str:
    """An audit as the comparison names it: implementation and test (node id, or design and world)."""
    return f"{entry['implementation']} {_test(entry)}"


def _test(entry: dict[str, Any]) -> str:
    if entry.get("nodeid"):
        return entry["nodeid"]
    world = entry["config"].get("worlds", {}).get("world") if entry["design"] == "two_world" else None
    return entry["design"] if world is None else f"{entry['design']}:{world}"


def match_key(entry: dict[str, Any]) -> tuple[str, str, str]:
    """What must be equal for two audits to be compared: implementation, test and configuration (without
    :data:`RUN_FIELDS`). A report made before audits recorded what their adversary saw audited the final
    model."""
    config = {"observe": "final_model", **entry["config"]}
    config = {name: value for name, value in config.items() if name not in RUN_FIELDS}
    return entry["implementation"], _test(entry), json.dumps(config, sort_keys=True, default=str)


def compare_reports(baseline: dict[str, Any], results: list[dict[str, Any]], *, confidence: float) -> Comparison:
    """Match ``results`` (this run's report entries) with ``baseline``'s audits by :func:`match_key`, in
    order where a key repeats, and test each match (:class:`AuditComparison`) at level
    (1 − ``confidence``)/n over the n comparable matches."""
    remaining: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for entry in baseline["audits"]:
        remaining.setdefault(match_key(entry), []).append(entry)
    pairs, unmatched = [], []
    for entry in results:
        candidates = remaining.get(match_key(entry))
        if candidates:
            pairs.append((candidates.pop(0), entry))
        else:
            unmatched.append(audit_label(entry))
    counts = [_counts(old, new) for old, new in pairs]
    comparable = sum(isinstance(count, tuple) for count in counts)
    level = (1.0 - confidence) / max(1, comparable)
    compared = tuple(_compared(old, new, count, level) for (old, new), count in zip(pairs, counts))
    return Comparison(
        baseline_path=baseline.get("path", ""),
        baseline_version=str(baseline["dpverify_version"]),
        baseline_started_at=str(baseline.get("started_at", "-")),
        confidence=confidence,
        compared=compared,
        unmatched=tuple(unmatched),
        not_rerun=tuple(audit_label(entry) for entries in remaining.values() for entry in entries),
    )


def _counts(baseline: dict[str, Any], current: dict[str, Any]) -> tuple[int, int, int] | str:
    """``(k, c_b, c_n)`` at the baseline's deciding count k, or why the two cannot be compared."""
    if "error" in (baseline["verdict"], current["verdict"]):
        return "an audit ended in error"
    guesses = baseline["guesses"]
    if not guesses:
        return "the baseline made no guesses"
    by_count = {int(row[0]): int(row[1]) for row in current["bound_by_guesses"]}
    by_count.setdefault(int(current["guesses"]), int(current["correct"]))
    if guesses not in by_count:
        return f"this run made no {guesses} guesses (its guess counts differ from the baseline's)"
    return int(guesses), int(baseline["correct"]), by_count[guesses]


def _compared(
    baseline: dict[str, Any], current: dict[str, Any], counts: tuple[int, int, int] | str, level: float
) -> AuditComparison:
    shared = dict(implementation=current["implementation"], test=_test(current), baseline=baseline, current=current, level=level)
    if isinstance(counts, str):
        return AuditComparison(**shared, guesses=None, baseline_correct=None, correct=None, p_value=None, note=counts)
    guesses, baseline_correct, correct = counts
    p_value = rise_p_value(guesses=guesses, baseline_correct=baseline_correct, correct=correct)
    return AuditComparison(
        **shared, guesses=guesses, baseline_correct=baseline_correct, correct=correct, p_value=min(1.0, float(p_value))
    )
