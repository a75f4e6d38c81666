"""What a person sees while an audit runs: its stage, its DP steps and its seconds, on one line.

An audit says its stages (:data:`dpverify.audits.planning.Progress`: "training run 2 of 4", "querying the
black box", "testing the claim") and the trainer reports its DP steps of the current run
(:data:`dpverify.contract.StepProgress`); :class:`ProgressLine` joins them into "training run 2 of 4:
step 7 of 10". On a terminal the line is redrawn in place, at most every ``interval`` seconds; in a log
it is a plain line for the first stage and then at most one per :data:`LOG_INTERVAL` seconds, so a CI log
gets a few lines per audit instead of one per step. The audit's outcome (:meth:`ProgressLine.finish`)
always shows and stays. The CLI draws on a stream (:class:`StreamDisplay`), pytest through its terminal
reporter (:mod:`dpverify.pytest.progress`).
"""

from __future__ import annotations

import shutil
import time
from typing import Callable, Protocol, TextIO

__all__ = ["LOG_INTERVAL", "Display", "ProgressLine", "StreamDisplay"]

#: Seconds between two progress lines in a log (not a terminal): a 10-minute audit writes about 20.
LOG_INTERVAL = 30.0


class Display(Protocol):
    """Where a :class:`ProgressLine` goes: ``in_place`` redraws one line (a terminal), otherwise each
    :meth:`show` is a line of its own; :meth:`end` follows the audit's last line."""

    in_place: bool

    def show(self, line: str) -> None: ...

    def end(self) -> None: ...


class StreamDisplay:
    """A text stream: redrawn with ``\\r`` on a terminal, plain lines elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.in_place = stream.isatty()
        self.drawn = 0

    def show(self, line: str) -> None:
        if not self.in_place:
            print(line, file=self.stream, flush=True)
            return
        line = line[: shutil.get_terminal_size().columns - 1]
        self.stream.write("\r" + line.ljust(self.drawn))
        self.stream.flush()
        self.drawn = len(line)

    def end(self) -> None:
        if self.in_place:
            self.stream.write("\n")
            self.stream.flush()


class ProgressLine:
    """One audit's progress on ``display``: :meth:`stage` and :meth:`step` are the audit's ``progress``
    and ``step_progress`` callbacks, :meth:`finish` its last line. A stage forgets the previous stage's
    steps, so a step counter is always the current training run's."""

    def __init__(
        self, label: str, display: Display, *, interval: float = 0.1, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.label, self.display, self.clock = label, display, clock
        self.interval = interval if display.in_place else LOG_INTERVAL
        self.started = clock()
        self.stage_text = "starting"
        self.steps: tuple[int, int] | None = None
        self.last_shown: float | None = None

    def stage(self, message: str) -> None:
        self.stage_text, self.steps = message, None
        self._update()

    def step(self, step: int, steps: int) -> None:
        self.steps = (step, steps)
        self._update()

    def finish(self, outcome: str) -> None:
        """The audit's last line, which stays."""
        self.display.show(self._line(outcome, self.clock()))
        self.display.end()

    @property
    def text(self) -> str:
        """The current stage, with the training run's step when one has been reported."""
        if self.steps is None:
            return self.stage_text
        return f"{self.stage_text}: step {self.steps[0]} of {self.steps[1]}"

    def _update(self) -> None:
        now = self.clock()
        if self.last_shown is not None and now - self.last_shown < self.interval:
            return
        self.last_shown = now
        self.display.show(self._line(self.text, now))

    def _line(self, text: str, now: float) -> str:
        return f"{self.label} {now - self.started:6.1f}s {text}"
