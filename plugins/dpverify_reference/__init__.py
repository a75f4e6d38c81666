"""Reference DP-SGD: a short, plain-torch DP-SGD that the other implementations are measured against.

A correct step (``docs/bugs.md``): Poisson sampling with rate q; per-example gradient norms over all
parameters (ghost norms: no per-example gradient is materialised); each example's loss reweighted by
min(1, C/‖grad_i‖), so a second backward gives the sum of clipped rows; Gaussian noise N(0, σ²C²) on every
coordinate, fresh each step; divide by the data-independent expected batch size q·N; plain SGD step.
The claim comes from Google's ``dp_accounting`` (RDP, add/remove), not from dpverify's own code.

Importing this package is cheap: torch and dp_accounting are imported inside :meth:`ReferenceDPSGD.train`.
"""

from __future__ import annotations

from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest

__all__ = ["ReferenceDPSGD", "implementations"]


class ReferenceDPSGD(Implementation):
    """The reference DP-SGD (``reference-dpsgd``)."""

    info = ImplementationInfo(
        name="reference-dpsgd",
        library="torch",
        requires=("torch", "dp_accounting"),
        extra="torch",
        notes=(
            "plain-torch DP-SGD with ghost per-example norms and loss reweighting; "
            "claim: dp_accounting RDP (add/remove), PLD in other_epsilons['dp_accounting.pld']"
        ),
    )

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_reference.dpsgd import train_reference

        return train_reference(request, name=self.info.name)


def implementations() -> list[Implementation]:
    """Entry point of the group ``dpverify.implementations``."""
    return [ReferenceDPSGD()]
