"""Wording shared by the result's summary and the session's table (imports nothing heavy)."""

from __future__ import annotations

import math
from typing import Any


def deficit_text(deficit: float) -> str:
    """k* rounded up to 0.1, so that the promise "would catch a k ≥ … noise deficit" keeps."""
    return f"{math.ceil(deficit * 10 - 1e-9) / 10:.1f}"


def decided_by(result: dict[str, Any]) -> str:
    """Which test refuted a report entry's claim: "ε,δ", "curve", both ("ε,δ+curve"), or "claim" (it
    contradicts its own numbers); "-" when none did."""
    if result["verdict"] != "violation":
        return "-"
    if not result["claim_consistent"]:
        return "claim"
    infinite = result.get("infinite", ())
    lower = math.inf if "epsilon_lower_bound" in infinite else result["epsilon_lower_bound"]
    claimed = math.inf if "claimed_epsilon" in infinite else result["claimed_epsilon"]
    steinke = lower is not None and claimed is not None and lower > claimed
    tests = [name for name, refuted in (("ε,δ", steinke), ("curve", result["curve_refuted"])) if refuted]
    return "+".join(tests) or "-"


def report_number(result: dict[str, Any], name: str) -> str:
    """A number field of a report entry for the table: ∞ when the entry lists it as infinite, '-' when it
    has no value (see :meth:`dpverify.results.AuditResult.to_dict`)."""
    if name in result.get("infinite", ()):
        return "∞"
    value = result[name]
    return "-" if value is None else f"{value:.3f}"
