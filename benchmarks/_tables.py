"""What every benchmark's results file ends with, written one way: the total wall time, then the file written
and printed. A benchmark run as ``python benchmarks/<name>.py`` imports it from its own folder."""

from __future__ import annotations

import time
from pathlib import Path


def write_table(output: str | Path, lines: list[str], *, started: float) -> None:
    """Write ``lines`` and the wall time since ``started`` (a ``time.perf_counter()``) to ``output``, and print them."""
    text = "\n".join([*lines, f"Total wall time: {time.perf_counter() - started:.0f} s."]) + "\n"
    Path(output).write_text(text)
    print(text, end="")
