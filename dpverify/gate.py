"""What the default gate audits: every implementation's one-run audit, its every-update audit at q < 1
(the adversary of every released update, whom the accountant's ε bounds: a wrong q, a miscounted step or
a mis-stated accountant at q < 1 shows there), the two-world audits of the crafted worlds that apply to it,
so that the bugs libraries ship (a normaliser that reads the data, microbatches, reused noise, shuffled
fixed-size batches), which only many runs show, are found without any option, and the layer designs it
trains (:class:`~dpverify.contract.LayerArchitecture`), so that a fast-clipping norm formula that
undercounts one layer type shows.

Framework-free: the pytest plugin and the command line plan their audits here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dpverify.canaries.worlds import WORLDS, world_names
from dpverify.config import AuditConfig, every_update_config, gate_layer_config, gate_world_config
from dpverify.contract import ImplementationInfo

__all__ = [
    "CORRELATED_NOISE_BUGS", "EVERY_UPDATE_BUGS", "GateAudit", "WORLD_CHOICE_WORDS", "applicable_worlds",
    "every_update_applies", "gate_audits", "structure_audit_only",
]  # fmt: skip

#: The docs/bugs.md classes of correlated noise: a stddev, a participation pattern, a noising matrix or a tree
#: that does not match what was accounted.
CORRELATED_NOISE_BUGS: tuple[int, ...] = (13, 14, 15, 16)
#: The docs/bugs.md classes whose buggy variants get the every-update audit: the accountant fed the wrong numbers
#: (too few steps, too small q), which at q < 1 only the claim's own subsampled curve shows, and correlated noise
#: (13 to 16), which only a score that decorrelates every update by the stated structure reads near its claim.
EVERY_UPDATE_BUGS: tuple[int, ...] = (8, *CORRELATED_NOISE_BUGS)

#: ``--dp-audit-worlds`` / ``--worlds`` words besides world names: every world that applies, or none.
WORLD_CHOICE_WORDS: tuple[str, ...] = ("applicable", "none")


def applicable_worlds(info: ImplementationInfo) -> tuple[str, ...]:
    """The worlds that apply to an implementation: to one expected private (or with a known issue that
    names no docs/bugs.md class), every world it has what it needs for (:attr:`~dpverify.canaries.worlds.World.needs`:
    the microbatch world needs microbatches); to a buggy variant or a known issue of a docs/bugs.md class, the
    worlds built for that class (:attr:`~dpverify.canaries.worlds.World.bugs`); to a language model, none (the
    worlds are classification datasets). An implementation that cannot take a designated normaliser
    (:attr:`~dpverify.contract.ImplementationInfo.designated_normaliser`) gets only the worlds whose
    normaliser is its own batch size."""
    if info.task != "classification":
        return ()
    if info.expected == "violation" or (info.expected == "known-issue" and info.bug is not None):
        worlds = tuple(world for world in world_names() if info.bug in WORLDS[world].bugs)
    else:
        worlds = tuple(world for world in world_names() if all(getattr(info, flag) for flag in WORLDS[world].needs))
    if not info.designated_normaliser:
        worlds = tuple(world for world in worlds if WORLDS[world].normaliser == "batch_size")
    return worlds


def every_update_applies(info: ImplementationInfo) -> bool:
    """Whether the gate gives an implementation the every-update audit: a classifier expected private, or a
    buggy variant or known issue of a row in :data:`EVERY_UPDATE_BUGS`. A known issue of another kind is
    registered for the finding its own audits make, and may not take the designated steps and rate at all
    (``opacus-dataloader`` derives both from the dataset's size: #571). The audit designates the normaliser
    q·m (its members' count is secret), so an API that divides by its own batch size (JAX-Privacy's Keras
    API, :attr:`~dpverify.contract.ImplementationInfo.designated_normaliser` false) cannot take it."""
    if info.task != "classification" or not info.designated_normaliser:
        return False
    return info.expected == "private" or info.bug in EVERY_UPDATE_BUGS


def structure_audit_only(info: ImplementationInfo) -> bool:
    """Whether the gate gives an implementation its every-update audit of correlated noise in place of its
    one-run audit: a buggy variant or known issue of a correlated-noise row (:data:`CORRELATED_NOISE_BUGS`)
    whose claim states its noise structure (:attr:`~dpverify.contract.ImplementationInfo.correlated_noise`).
    That audit decorrelates every released update by the stated structure, while the final model carries a
    fraction of the signal: it refuted jax-privacy-dense-mf-mismatched-noising, opacus-dpcr-unscaled-noise and
    the known issue opacus-dpcr on 5 of 5 seeds, whose one-run p-values (0.0011-0.022, 1e-4-0.005, and no
    refutation at all) miss the main job's per-audit level; each one-run audit left out saves 10-30 CPU-s
    (benchmarks/results/main-job-families.md). With the every-update audits off, the one-run audit stays."""
    return (
        info.correlated_noise
        and info.expected in ("violation", "known-issue")
        and info.bug in CORRELATED_NOISE_BUGS
        and every_update_applies(info)
    )


@dataclass(frozen=True)
class GateAudit:
    """One audit of the gate: an implementation's one-run audit (``world`` and ``layer`` ``None``), its
    every-update audit (``every_update``; of correlated noise, at the full batch, with ``correlated``, or in
    epochs of several steps where the implementation is not ``amplified``), its
    two-world audit of ``world``, or its one-run audit of the ``layer`` design."""

    implementation_name: str
    expected: str
    world: str | None = None
    every_update: bool = False
    layer: str | None = None
    correlated: bool = False
    amplified: bool = True

    @property
    def test_name(self) -> str:
        """``dp-audit[<name>]``, ``every-update[<name>]``, ``two-world[<name>-<world>]`` or
        ``layer[<name>-<layer>]``: the pytest item's name."""
        if self.every_update:
            return f"every-update[{self.implementation_name}]"
        if self.layer is not None:
            return f"layer[{self.implementation_name}-{self.layer}]"
        if self.world is None:
            return f"dp-audit[{self.implementation_name}]"
        return f"two-world[{self.implementation_name}-{self.world}]"

    @property
    def seed_key(self) -> str:
        """The one-run audit keeps the name alone as its key, so one seed means one audit in pytest and in
        ``dpverify audit --seed``; the every-update audit, a world or a layer adds its own."""
        extra = "every_update" if self.every_update else self.world or self.layer
        return self.implementation_name if extra is None else f"{self.implementation_name}#{extra}"

    def config(self, profile: str, settings: Mapping[str, Any], *, one_run: Callable[[], AuditConfig]) -> AuditConfig:
        """This audit's configuration at ``profile``: the every-update audit's, the layer design's or the
        world's, each with those of a run's ``settings`` (``--set``, ``--dp-audit-set``, device and time
        limit) its design lets change; or the one-run audit's, which ``one_run`` builds (the command line and
        the plugin each rank a run's settings their own way)."""
        if self.every_update:
            return every_update_config(profile, dict(settings), correlated=self.correlated, amplified=self.amplified)
        if self.layer is not None:
            return gate_layer_config(profile, self.layer, dict(settings))
        if self.world is not None:
            return gate_world_config(profile, self.world, dict(settings))
        return one_run()

    @property
    def counted(self) -> bool:
        """Only an implementation expected to be private can raise a false alarm: a buggy variant fails
        when it is *not* refuted, a known issue is a finding either way."""
        return self.expected == "private"


def gate_audits(
    infos: list[ImplementationInfo],
    *,
    worlds: str | tuple[str, ...] = "applicable",
    every_update: bool = True,
    layers: bool = True,
    full_batch: bool = True,
) -> list[GateAudit]:
    """The gate's audits of ``infos``, each one-run audit followed by its every-update audit (where
    ``every_update`` and :func:`every_update_applies`), its two-world audits and its layer designs' audits
    (:attr:`~dpverify.contract.ImplementationInfo.layers`): ``worlds`` is ``"applicable"`` (every world that
    applies, a world :attr:`~dpverify.canaries.worlds.World.once_per_sampler` once per named sampler), ``"none"`` or world names (those of them that apply); ``layers=False`` leaves the layer designs
    out (a run that asks for one design). A buggy variant that breaks a layer's norm formula gets its layers'
    audits only: the other designs cannot see it; a correlated-noise variant or known issue whose claim
    states its structure gets its every-update audit only (:func:`structure_audit_only`). A layer design with a known issue
    (:attr:`~dpverify.contract.ImplementationInfo.layer_issues`) expects it; the implementation's other
    audits keep its own expectation. ``full_batch``: the one-run audits train at q = 1 (every
    profile but ``paper``), where an implementation of a row of a
    :attr:`~dpverify.canaries.worlds.World.full_batch_blind` world gets that world instead."""
    if isinstance(worlds, str) and worlds not in WORLD_CHOICE_WORDS:
        raise ValueError(f"worlds must be one of {', '.join(WORLD_CHOICE_WORDS)} or world names, got {worlds!r}")
    if not isinstance(worlds, str):
        unknown = sorted(set(worlds) - set(world_names()))
        if unknown:
            raise ValueError(f"unknown world(s) {', '.join(unknown)}; known: {', '.join(world_names())}")
    audits = []
    sampler_world_elsewhere = _sampler_world_elsewhere(infos)
    for info in infos:
        own_layers = [GateAudit(info.name, info.for_layer(layer).expected, layer=layer) for layer in info.layers]
        if info.layers and info.expected == "violation":
            audits.extend(own_layers if layers else [])
            continue
        chosen = () if worlds == "none" else applicable_worlds(info)
        if not isinstance(worlds, str):
            chosen = tuple(world for world in chosen if world in worlds)
        else:
            chosen = tuple(world for world in chosen if (info.name, world) not in sampler_world_elsewhere)
        full_batch_blind = full_batch and any(WORLDS[world].full_batch_blind and info.bug in WORLDS[world].bugs for world in chosen)
        if not (full_batch_blind or (every_update and structure_audit_only(info))):
            audits.append(GateAudit(info.name, info.expected))
        if every_update and every_update_applies(info):
            audits.append(GateAudit(
                info.name, info.expected, every_update=True, correlated=info.correlated_noise, amplified=info.amplified
            ))
        audits.extend(GateAudit(info.name, info.expected, world) for world in chosen)
        audits.extend(own_layers if layers else [])
    return audits


def _sampler_world_elsewhere(infos: list[ImplementationInfo]) -> set[tuple[str, str]]:
    """``(implementation, world)`` for each world run once per sampler that another implementation takes
    for the implementation's sampler: of those that name one sampler and get the world for no row of their
    own (a variant or known issue of the world's row keeps it: that is its finding), the first expected
    private takes it, else the first known issue, of those the one that needs the fewest packages
    (:attr:`~dpverify.contract.ImplementationInfo.requires`: the world then runs wherever the sampler's library
    is installed, not on an add-on's path that a missing extra skips); the others leave it."""
    elsewhere = set()
    for world in (name for name in world_names() if WORLDS[name].once_per_sampler):
        sharing = [
            info for info in sorted(infos, key=lambda info: (info.expected != "private", len(info.requires)))
            if info.sampler is not None and info.bug not in WORLDS[world].bugs and world in applicable_worlds(info)
        ]  # fmt: skip
        takers = {info.sampler: info.name for info in reversed(sharing)}  # the first of each sampler wins
        elsewhere |= {(info.name, world) for info in sharing if info.name not in takers.values()}
    return elsewhere
