"""The contract's step callback: every audit kind hands it to the trainer, and the bundled Opacus,
TF-Privacy and reference trainers call it once per DP step, as ``progress(step, steps)``."""

import pytest

pytest.importorskip("torch")

from dpverify.audits import run_audit  # noqa: E402
from dpverify.audits.language import LanguageAuditConfig  # noqa: E402
from dpverify.config import profile_config  # noqa: E402
from dpverify.registry import get_implementation  # noqa: E402

SMALL = dict(m=100, dimension=100, hidden_width=50, epochs=3, device="cpu", pooled_runs=1)


@pytest.mark.parametrize(
    "name, config",
    [
        ("reference-dpsgd", profile_config("quick", **SMALL)),
        ("opacus-ghost", profile_config("quick", **SMALL, sampling_rate=0.5)),
        ("opacus-hooks", profile_config("quick", **SMALL, design="pair")),
        ("reference-dpsgd", profile_config("quick", design="in_distribution", m=50, epochs=2, device="cpu")),
        ("opacus-lm", LanguageAuditConfig().with_overrides(m=50, epochs=2, device="cpu")),
        ("tf-privacy-keras", profile_config("quick", **SMALL, sampling_rate=0.5)),
        ("tf-privacy-fast-clipping", profile_config("quick", **SMALL)),
    ],
    ids=["reference", "opacus-subsampled", "opacus-pair", "data-design", "language", "tf-privacy", "tf-fast-clipping"],
)
def test_trainers_report_every_step(name, config):
    implementation = get_implementation(name)
    if implementation.unavailable_reason():
        pytest.skip(implementation.unavailable_reason())
    if config.design == "in_distribution":
        pytest.importorskip("sklearn")
    calls = []
    result = run_audit(implementation, config, step_progress=lambda step, steps: calls.append((step, steps)))
    assert result.verdict != "error", result.error
    steps = config.hyperparameters.steps
    assert calls == [(step, steps) for step in range(1, steps + 1)]
