"""Each audit's progress line under pytest (``--dp-audit-progress``: auto, always or never).

auto shows it on a terminal, redrawn at most once a second below the test's line, and leaves the audit's
outcome there; not when pytest runs quietly (``-q``), nor when output goes to a file or pipe. always shows
it there too, as a log gets it (the first stage, a line per 30 s, the outcome), ``-q`` or not. A pytest-xdist
worker shows nothing either way: it cannot write to the terminal, and its audits are in the session's table
at the end. pytest captures output while a test runs, so each write suspends capturing.
"""

from __future__ import annotations

import contextlib
import shutil
from typing import Any

from dpverify.progress import ProgressLine
from dpverify.pytest import options

#: Seconds between two redraws of the line on a terminal.
REDRAW_INTERVAL = 1.0


class ReporterDisplay:
    """pytest's terminal reporter as a :class:`~dpverify.progress.Display`: the first line starts on a line
    of its own, the last stays."""

    def __init__(self, reporter: Any, capture: Any) -> None:
        self.reporter, self.capture = reporter, capture
        self.in_place = bool(reporter.isatty())
        self.shown = False

    def show(self, line: str) -> None:
        with self._uncaptured():
            if not self.shown:
                self.reporter.ensure_newline()
                self.shown = True
            if self.in_place:
                self.reporter.rewrite(line[: shutil.get_terminal_size().columns - 1], erase=True)
                self.reporter.flush()
            else:
                self.reporter.write_line(line)

    def end(self) -> None:
        """End the line on a terminal where pytest would write the test's outcome letter right after it
        (``-v`` starts its outcome line with a newline of its own)."""
        if self.in_place and self.reporter.verbosity <= 0:
            with self._uncaptured():
                self.reporter.line("")

    def _uncaptured(self) -> Any:
        return self.capture.global_and_fixture_disabled() if self.capture else contextlib.nullcontext()


def audit_progress(config: Any, label: str) -> ProgressLine | None:
    """The progress line of an audit called ``label`` in a session with pytest ``config``, or ``None``
    where ``--dp-audit-progress`` shows none."""
    choice = options.resolve(config, "progress")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if choice == "never" or reporter is None or hasattr(config, "workerinput"):
        return None
    if choice == "auto" and (not reporter.isatty() or reporter.verbosity < 0):
        return None
    display = ReporterDisplay(reporter, config.pluginmanager.get_plugin("capturemanager"))
    return ProgressLine(label, display, interval=REDRAW_INTERVAL)
