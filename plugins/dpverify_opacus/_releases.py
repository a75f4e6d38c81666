"""How each Opacus release from 1.4.0 to 1.6.0 is called: its ``make_private`` for a ``grad_sample_mode``,
the paths it does not have, and the findings that hold for it. Imports neither torch nor opacus, so the
registry and the tests can ask it about any release.

The releases differ where the plugin calls them (read in each release's ``privacy_engine.py``):

- 1.4.0, 1.4.1: no ghost clipping (``grad_sample_mode="ghost"`` first shipped in 1.5.0, Opacus PR #656);
  ``make_private`` takes no criterion.
- 1.5.0–1.5.2: ghost clipping through ``make_private(grad_sample_mode="ghost", clipping="ghost")`` as PR #656
  documents it; ``make_private`` takes no criterion (1.5.2 forwards an unknown ``criterion=`` to the
  optimizer, whose ``__init__`` rejects it), returns (module, optimizer, loader), and the caller runs
  ghost clipping's two backward passes (1.5.2 packages them as ``double_backward``). Its ``make_private``
  does not hand ``max_grad_norm`` to the ghost module, which then clips at its default 1 while the noise
  is σ·C (Opacus PR #664, fixed in 1.5.3): a finding, :data:`GHOST_MAX_GRAD_NORM`.
- 1.5.3 and later: ``make_private(criterion=...)``; in ghost mode it returns the DP loss as a fourth value.

Ghost clipping's Linear norm sampler (``compute_linear_norm_sample``, ``grad_sample/linear.py``) takes a 3-D
input's bias norm as √(Σᵢⱼ (gᵢ·gⱼ)²) in 1.5.0–1.5.3 and as √(Σᵢⱼ gᵢ·gⱼ) = |Σ_t g_t|, exact, from 1.5.4 (Opacus
PR #751): a finding, :data:`GHOST_LINEAR_BIAS_3D`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpverify.releases import Finding, Library, installed_release, parse_version

__all__ = [
    "GHOST_LINEAR_BIAS_3D",
    "GHOST_MAX_GRAD_NORM",
    "LIBRARY",
    "Finding",
    "MakePrivateCall",
    "installed_version",
    "make_private_call",
    "missing_path",
    "parse_version",
]

#: What dpverify gates of Opacus (:mod:`dpverify.releases`): all releases 1.4.0–1.6.0 (1.5 is the index's name
#: of 1.5.0), in the torch family's environment.
LIBRARY = Library(
    package="opacus", extra="opacus", family="torch", constraints="constraints.txt",
    implementations="opacus-*", versions=("1.4.0", "1.4.1", "1.5", "1.5.1", "1.5.2", "1.5.3", "1.5.4", "1.6.0"),
)

#: The first release with ghost clipping, and the first whose ``make_private`` takes the criterion.
GHOST_FIRST = (1, 5)
CRITERION_FIRST = (1, 5, 3)


#: Opacus 1.5.0–1.5.2: make_private's ghost module clips at its default max_grad_norm 1, not at C.
GHOST_MAX_GRAD_NORM = Finding(
    issue="https://github.com/pytorch/opacus/pull/664",
    first=GHOST_FIRST,
    fixed=CRITERION_FIRST,
    summary="make_private(grad_sample_mode='ghost') does not pass max_grad_norm to "
    "GradSampleModuleFastGradientClipping, which clips each row at its default 1 while the optimizer's noise is "
    "σ·C: at C < 1 a record moves the sum by up to 1, more than the C the noise is drawn for (Opacus PR #664 "
    "'privacy engine erroneously wasn't using the max_grad_norm argument', fixed in 1.5.3)",
)


#: Opacus 1.5.0–1.5.3: ghost clipping's Linear bias norm on a 3-D input squares the positions' dot products.
GHOST_LINEAR_BIAS_3D = Finding(
    issue="https://github.com/pytorch/opacus/pull/751",
    first=GHOST_FIRST,
    fixed=(1, 5, 4),
    summary="ghost clipping's Linear norm sampler (grad_sample/linear.py, compute_linear_norm_sample) takes a "
    "3-D (sequence) input's bias norm as √(Σᵢⱼ (gᵢ·gⱼ)²) instead of √(Σᵢⱼ gᵢ·gⱼ) = |Σ_t g_t|: where each "
    "position's output gradient has a norm below 1 it states too little, and the record is clipped too weakly "
    "(Opacus PR #751, fixed in 1.5.4)",
)


@dataclass(frozen=True)
class MakePrivateCall:
    """``make_private`` as a release's documentation calls it in one ``grad_sample_mode``.

    ``criterion``: it takes the training criterion (and in ghost mode returns the DP loss as a fourth
    value). ``clipping``: its ``clipping`` argument. ``double_backward``: the caller runs ghost clipping's
    two backward passes on the per-sample loss (the releases before ``make_private`` took the criterion).
    """

    criterion: bool
    clipping: str
    double_backward: bool


def installed_version() -> tuple[int, ...] | None:
    """The installed Opacus release, or ``None`` when Opacus is not installed."""
    return installed_release("opacus")


def missing_path(version: tuple[int, ...], grad_sample_mode: str, *, norm_sampler: str | None = None) -> str | None:
    """Why release ``version`` has no ``grad_sample_mode`` path (or, for a layer variant, no norm sampler of
    ``norm_sampler``'s layer design to break), or ``None`` when it has one."""
    if grad_sample_mode == "ghost" and version < GHOST_FIRST:
        return "ghost clipping (grad_sample_mode='ghost') first shipped in Opacus 1.5.0 (PR #656)"
    if norm_sampler == "embedding" and version < CRITERION_FIRST:
        return "Opacus' Embedding norm sampler (compute_embedding_norm_sample) first shipped in Opacus 1.5.3"
    return None


def make_private_call(version: tuple[int, ...], grad_sample_mode: str) -> MakePrivateCall:
    """How release ``version`` is called in ``grad_sample_mode``; a ValueError for a path it lacks."""
    reason = missing_path(version, grad_sample_mode)
    if reason is not None:
        raise ValueError(f"Opacus {'.'.join(map(str, version))} has no {grad_sample_mode!r} path: {reason}")
    ghost = grad_sample_mode == "ghost"
    takes_criterion = version >= CRITERION_FIRST
    return MakePrivateCall(
        criterion=takes_criterion,
        clipping="ghost" if ghost and not takes_criterion else "flat",
        double_backward=ghost and not takes_criterion,
    )

