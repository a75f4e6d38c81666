"""Training through the contract: each pooled run's request trained within its time limit
(:func:`train_through_contract`), its black box queried and checked for shape and NaN
(:func:`query_black_box`) and for being the designated model (:func:`designated_model_defect`), scored
(:func:`train_and_score`), and the clock that keeps the auditor's seconds apart from the trainer's. A step
that fails raises :class:`AuditFailure`, which the audit turns into verdict ``error``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator

import numpy as np

from dpverify.audits.planning import Progress
from dpverify.contract import Implementation, PrivacyClaim, Request, StepProgress, TrainedModel, TrainingRequest


class AuditFailure(Exception):
    """A step of an audit failed because of the implementation under audit (its training, black box or
    claim); ``device`` is where it ran, when known. The audit reports it as verdict ``error``."""

    def __init__(self, cause: str, *, device: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.device = device


class NotRun(AuditFailure):
    """The audit could not test the claim, for the reason given: it says so as verdict ``undecided`` with
    that reason (design rule 16), never a pass nor an error."""


class ObservationMissing(NotRun):
    """The trainer did not hand over what the audit's adversary observes (every update): the audit did not
    run, and says so as verdict ``undecided`` (design rule 16), never a pass nor an error."""


class ClaimContradictsItself(AuditFailure):
    """The claim's ε is below the least ε of its own mechanism in its own relation
    (:func:`dpverify.audits.claims.claim_inconsistency`), found where the design cannot test it otherwise:
    verdict ``violation`` with that reason, whatever the scores."""


class ClaimNotTestable(NotRun):
    """The claim cannot be tested in the audit's neighbouring relation, or its mechanism cannot be turned
    into a privacy curve (:func:`dpverify.audits.claims.claim_in_relation`): ``undecided`` with the reason."""


@dataclass
class AuditClock:
    """When the audit started, and how many of its seconds were the auditor's own work."""

    started: float
    auditor_seconds: float = 0.0
    black_box_seconds: float = 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self.started


class _TimedBlackBoxes:
    """``trained`` whose black boxes add their seconds to ``clock.black_box_seconds``: answering queries is
    the trained model's work, not the auditor's (canaries, scores, guesses and the bound)."""

    def __init__(self, trained: Any, clock: AuditClock) -> None:
        self._trained, self._clock = trained, clock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._trained, name)
        if not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self._clock.black_box_seconds += time.perf_counter() - started

        return timed


class _TimeUp(BaseException):
    """Raised inside training when its time limit passes (a BaseException, so a trainer's own
    ``except Exception`` cannot swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Interrupt the block with :class:`_TimeUp` after ``seconds`` (wall clock), by ``SIGALRM``: the
    main thread of a POSIX process only, as pytest-timeout's signal method; elsewhere, no limit."""
    usable = seconds is not None and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def time_up(signum: int, frame: Any) -> None:
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def train_through_contract(
    implementation: Implementation, request: Request, *, returns: type = TrainedModel, timeout: float | None = None
) -> Any:
    """``implementation.train(request)`` within ``timeout`` seconds, checked to return a ``returns`` (the
    contract's black-box type: :class:`TrainedModel`, or :class:`~dpverify.contract.SequenceModel` for a
    language model) with a claim."""
    try:
        with time_limit(timeout):
            trained = implementation.train(request)
    except _TimeUp:
        raise AuditFailure(
            f"training ran past the audit's time limit of {timeout:g} s (raise it with --dp-audit-timeout, "
            "the marker's timeout=, or a profile for a faster machine)"
        ) from None
    except Exception as exc:  # the implementation's failure is the audit's verdict, not a crash
        raise AuditFailure(f"training raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}") from exc
    if not isinstance(trained, returns) or not isinstance(getattr(trained, "claim", None), PrivacyClaim):
        expected = f"{returns.__module__}.{returns.__qualname__}"
        raise AuditFailure(f"train() must return a {expected} with a PrivacyClaim, got {trained!r}")
    return trained


def query_black_box(
    trained: TrainedModel, features: np.ndarray, *, expected_shape: tuple[int, int], head: str = "predict_log_proba"
) -> np.ndarray:
    """The black box ``head`` of ``trained`` on ``features`` as float64, checked for shape and finiteness."""
    predict = getattr(trained, head)
    if predict is None:
        raise AuditFailure(f"returned no {head} black box; the request asked for it", device=trained.device)
    try:
        log_probs = np.asarray(predict(features), dtype=np.float64)
    except Exception as exc:
        raise AuditFailure(f"{head} raised {type(exc).__name__}: {exc}", device=trained.device) from exc
    if log_probs.shape != expected_shape:
        raise AuditFailure(
            f"{head} returned shape {log_probs.shape}, expected {expected_shape} (records × outputs)",
            device=trained.device,
        )
    if not np.all(np.isfinite(log_probs)):
        rows = int(np.count_nonzero(~np.isfinite(log_probs).all(axis=1)))
        raise AuditFailure(
            f"{head} returned NaN or infinite values in {rows} of {expected_shape[0]} rows (did training diverge? "
            "try a smaller learning_rate)",
            device=trained.device,
        )
    return log_probs


#: Turns the trained black box into ``(scores, membership, test accuracy or None)``.
Scorer = Callable[[TrainedModel], "tuple[np.ndarray, np.ndarray, float | None]"]


@dataclass(frozen=True)
class ScoredRun:
    """One training run, trained and scored, as it leaves the process it ran in (the model stays there):
    the scorer's scores, secret bits and test accuracy, and the run's claim and device (what
    :func:`claimed_epsilon` and :func:`concluded_result` read). ``not_designated`` says how the black box
    showed that it is not the model the request designated (:func:`designated_model_defect`), or is ``None``."""

    scores: np.ndarray
    membership: np.ndarray
    test_accuracy: float | None
    claim: PrivacyClaim
    device: str
    not_designated: str | None = None


def designated_model_defect(trained: TrainedModel, request: Request) -> str | None:
    """Why ``trained`` is not the softmax regression ``request`` designates (``hidden_width=0``), from its
    black box alone, or ``None`` (also for any other model): a softmax regression's class differences of
    log-probabilities are affine in the input, exactly (:func:`dpverify.conformance.affinity_defect`);
    a trainer that builds its own model answers otherwise, and its Dirac canaries then carry a fraction of
    the signal the design promises."""
    if not isinstance(request, TrainingRequest) or not request.architecture.is_softmax_regression:
        return None
    from dpverify.conformance import affinity_defect

    def log_proba(probes: np.ndarray) -> np.ndarray:
        return query_black_box(trained, probes, expected_shape=(probes.shape[0], request.num_classes))

    defect, tolerance = affinity_defect(log_proba, request)
    if defect <= tolerance:
        return None
    return (
        f"the model is not the designated zero-initialised softmax regression: its responses are not affine in "
        f"the input (defect {defect:.3g}, float32 rounding allows {tolerance:.3g}); does the trainer build its own "
        "model instead of the requested architecture (hidden_width=0)?"
    )


def train_and_score(
    implementation: Implementation,
    request: Request,
    score: Scorer,
    *,
    timeout: float | None,
    clock: AuditClock,
    say: Progress,
    returns: type = TrainedModel,
) -> ScoredRun:
    """Train ``implementation`` on ``request`` within ``timeout`` seconds and ``score`` its black box (the
    auditor's time on ``clock``, the black box's answers excluded)."""
    trained = train_through_contract(implementation, request, returns=returns, timeout=timeout)
    say("querying the black box")
    scoring_started, answering = time.perf_counter(), clock.black_box_seconds
    scores, membership, accuracy = score(_TimedBlackBoxes(trained, clock))
    not_designated = designated_model_defect(trained, request)
    clock.auditor_seconds += time.perf_counter() - scoring_started - (clock.black_box_seconds - answering)
    return ScoredRun(scores, membership, accuracy, trained.claim, trained.device, not_designated)


def each_pooled_run(
    config: Any,
    one_run: Callable[..., tuple[Request, Scorer]],
    *,
    device: str,
    clock: AuditClock,
    step_progress: StepProgress | None,
    say: Progress,
) -> Iterator[tuple[Request, Scorer]]:
    """Each of ``config.pooled_runs`` runs' request and scorer from ``one_run(config, run, device=...,
    step_progress=...)``, made only when its turn comes: holding every run's canaries at once would cost R
    times one run's (10 GB for the classification gpu profile). With several runs, each is said ("training
    run 2 of 4") before it trains, so its steps read as its own; making them counts as the auditor's time."""
    for run in range(config.pooled_runs):
        started = time.perf_counter()
        prepared = one_run(config, run, device=device, step_progress=step_progress)
        clock.auditor_seconds += time.perf_counter() - started
        if config.pooled_runs > 1:
            say(f"training run {run + 1} of {config.pooled_runs}")
        yield prepared


def until_failure(items: Iterable[Any]) -> tuple[list[Any], AuditFailure | None]:
    """The items up to the first :class:`AuditFailure`, and that failure (``None``: none): what a task of
    runs returns from a worker, so that the runs before a failure come back with it."""
    done: list[Any] = []
    try:
        for item in items:
            done.append(item)
    except AuditFailure as failure:
        return done, failure
    return done, None


def in_task_order(results: Generator[tuple[list[Any], AuditFailure | None], None, None]) -> Generator[Any, None, None]:
    """The items of :func:`until_failure` tasks in order, as ``results`` (an executor's map) gives them,
    raising a task's failure after the items before it; the tasks not reached are cancelled."""
    try:
        for items, failure in results:
            yield from items
            if failure is not None:
                raise failure
    finally:
        results.close()
