"""Wording shared by the result's summary and the session's table (imports nothing heavy)."""

from __future__ import annotations

import math


def deficit_text(deficit: float) -> str:
    """k* rounded up to 0.1, so that the promise "would catch a k ≥ … noise deficit" keeps."""
    return f"{math.ceil(deficit * 10 - 1e-9) / 10:.1f}"
