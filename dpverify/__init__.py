"""dpverify: audit differentially private training implementations with one-run UniAud audits.

The names below are imported on first use, so ``import dpverify`` (and the pytest plugin) stays light.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AuditConfig": "dpverify.config",
    "profile_config": "dpverify.config",
    "run_audit": "dpverify.audits",
    "AuditResult": "dpverify.results",
    "DPViolation": "dpverify.results",
    "AuditError": "dpverify.results",
    "Implementation": "dpverify.contract",
    "ImplementationInfo": "dpverify.contract",
    "TrainingRequest": "dpverify.contract",
    "TrainedModel": "dpverify.contract",
    "PrivacyClaim": "dpverify.contract",
    "register_implementation": "dpverify.registry",
    "get_implementation": "dpverify.registry",
    "registered_implementations": "dpverify.registry",
    "LanguageAuditConfig": "dpverify.audits.language",
    "run_language_audit": "dpverify.audits.language",
    "SequenceRequest": "dpverify.contract",
    "SequenceModel": "dpverify.contract",
    "LanguageImplementation": "dpverify.contract",
    "epsilon_lower_bound": "dpverify.stats.bounds",
    "optimal_epsilon": "dpverify.stats.bounds",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dpverify' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
