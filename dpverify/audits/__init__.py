"""Audits: one kind per module over the shared steps (:mod:`~dpverify.audits.planning` before training,
:mod:`~dpverify.audits.membership` and :mod:`~dpverify.audits.training` through the contract,
:mod:`~dpverify.audits.claims` and :mod:`~dpverify.audits.verdict` after it), and :func:`run_audit`, which
picks the kind from above (nothing below imports this package's ``__init__``)."""

from __future__ import annotations

import traceback
from typing import Any

from dpverify.audits.classification import run_classification_audit
from dpverify.audits.data_dependent import run_data_audit
from dpverify.audits.language import language_config_like, run_language_audit
from dpverify.audits.planning import Progress, Undecidable, one_run_undecidable
from dpverify.audits.two_world import run_two_world_design, two_world_undecidable
from dpverify.audits.verdict import result_fields
from dpverify.config import AuditConfig
from dpverify.contract import Implementation, StepProgress
from dpverify.execution import Executor
from dpverify.results import AuditResult, audit_result


def run_audit(
    implementation: Implementation,
    config: Any,
    *,
    progress: Progress | None = None,
    step_progress: StepProgress | None = None,
    executor: Executor | None = None,
) -> AuditResult:
    """Audit ``implementation`` once under ``config``; never raises for a failing implementation.

    A failure in training, in the black box or in the claim ends as verdict ``error``. A language-model
    implementation runs :func:`~dpverify.audits.language.run_language_audit` (a classification
    :class:`AuditConfig` lends it its privacy target, level, seed and device); a data-dependent design
    runs :func:`~dpverify.audits.data_dependent.run_data_audit`; ``two_world`` runs
    :func:`~dpverify.audits.two_world.run_two_world_design` (many trainings; the trainer's steps are not
    reported); the rest run
    :func:`~dpverify.audits.classification.run_classification_audit`. ``progress`` hears the audit's
    stages ("training run 2 of 4", "querying the black box", "testing the claim"), ``step_progress`` the
    trainer's DP steps of the current run (:attr:`dpverify.contract.Request.progress`; they restart with
    each pooled run, which ``progress`` announces).
    ``executor`` (:mod:`dpverify.execution`; default in-process) trains the independent runs of a
    two-world audit and the pooled runs of a synthetic-canary one; the result does not depend on it.
    """
    if implementation.info.task == "language":
        return run_language_audit(implementation, language_config_like(config), progress=progress, step_progress=step_progress)
    if not isinstance(config, AuditConfig):
        raise TypeError(
            f"{implementation.info.name} trains a classifier; audit it with a dpverify.config.AuditConfig, "
            f"got {type(config).__name__}"
        )
    if config.design == "two_world":
        return run_two_world_design(implementation, config, progress=progress, executor=executor)
    if config.is_data_dependent:
        return run_data_audit(implementation, config, progress=progress, step_progress=step_progress)
    return run_classification_audit(implementation, config, progress=progress, step_progress=step_progress, executor=executor)


def undecidable(implementation: Implementation, config: Any) -> Undecidable | None:
    """Why the audit :func:`run_audit` would run of ``implementation`` under ``config`` could only end
    undecided, known before any training (``None``: it may decide): the check every face (the CLI, the
    ready-made audits, the ``dp_audit`` fixture) makes before training, so that none trains for nothing."""
    if implementation.info.task == "language":
        return one_run_undecidable(language_config_like(config))
    if not isinstance(config, AuditConfig):
        return None  # run_audit names the mistake
    if config.design == "two_world":
        return two_world_undecidable(config)
    return one_run_undecidable(config, run_sizes=(config.audit_size,) if config.is_data_dependent else None)


def refused_result(implementation: Implementation, config: Any, refusal: Undecidable) -> AuditResult:
    """Verdict ``undecided`` of an audit refused before training (:func:`undecidable` gave ``refusal``):
    nothing ran, so no claim, bound or ceiling (NaN); ``canaries_needed`` is the setting that would decide,
    and ``claim_derivation`` says why it was not run."""
    settings = _as_run(implementation, config)
    return audit_result(
        result_fields(implementation, settings, settings.audit_size),
        verdict="undecided",
        canaries_needed=refusal.needed,
        claim_derivation=f"Not run: {refusal.message()}",
        device=str(settings.device),
        seconds=0.0,
    )


def _as_run(implementation: Implementation, config: Any) -> Any:
    """``config`` as :func:`run_audit` runs it for ``implementation`` (a language model's own config)."""
    return language_config_like(config) if implementation.info.task == "language" else config


def auditor_failure(implementation: Implementation, config: Any, exc: Exception, *, seconds: float) -> AuditResult:
    """Verdict ``error`` for an audit of ``implementation`` under ``config`` whose own code raised ``exc``
    (a dpverify bug, not the implementation's failure, which :func:`run_audit` reports itself): the faces
    record it and go on, so one audit's crash never ends the session nor goes unreported."""
    settings = _as_run(implementation, config)
    where = "".join(traceback.format_exception(exc, limit=-3)).rstrip()
    return audit_result(
        result_fields(implementation, settings, settings.audit_size),
        verdict="error",
        device=str(settings.device),
        seconds=seconds,
        error=f"{implementation.info.name}: the audit itself failed ({type(exc).__name__}: {exc}); this is a "
        f"dpverify bug, please report it with this trace:\n{where}",
    )
