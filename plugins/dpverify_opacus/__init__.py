"""Opacus 1.6 under audit: the library as users call it, and deliberately buggy variants of it.

``opacus-ghost`` and ``opacus-hooks`` train with ``PrivacyEngine.make_private`` (Poisson sampling through
Opacus' ``DPDataLoader``, ``grad_sample_mode`` "ghost" or "hooks") and claim what Opacus' accountant
states: RDP ε as ``epsilon``, the PRV ε of the same history as ``other_epsilons["opacus.prv"]``.

Each variant (``opacus-no-noise``, ...) changes one rule of a correct DP-SGD step (a row of
``docs/bugs.md``) inside the real Opacus code path and keeps Opacus' claim; see
:mod:`dpverify_opacus.variants` for how. :func:`noise_scaled` builds (without registering) Opacus with its
noise divided by k, for benchmarks of the smallest noise deficit an audit catches.

``opacus-dataloader`` calls Opacus the way its tutorials do, ``make_private`` on a plain
``DataLoader(dataset, batch_size=B)``, so that Opacus derives the sampling rate, the normaliser and the
epoch's steps from the dataset (:mod:`dpverify_opacus._dataloader`); B = round(q·N) by default, or a
user's constant through :class:`OpacusDataLoaderImplementation`.

``opacus-lm`` (ghost clipping) and ``opacus-lm-hooks`` train a small causal transformer on token canaries
through the language-model contract (:class:`dpverify.contract.SequenceRequest`), with the same engine and
the same tweaks; :data:`LANGUAGE_VARIANTS` are their buggy variants (no noise, clipping at 2C, an
un-noised or unclipped embedding).

Importing this package is cheap: torch and opacus are imported inside the implementations' ``train``.
It sets ``THP_MEM_ALLOC_ENABLE=1`` (unless the user set it) for torch, which reads it at its first
allocation: hooks mode allocates two fresh (B, out, in) per-sample gradient buffers every step (2 GB each
at the quick profile), and on 4 KiB pages most of its time went to page faults; torch then backs large
CPU allocations with transparent huge pages. Only memory pages change, not a single result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest

__all__ = [
    "OpacusDataLoaderImplementation",
    "OpacusDpcrImplementation",
    "OpacusImplementation",
    "OpacusLanguageImplementation",
    "VariantSpec",
    "VARIANTS",
    "LANGUAGE_VARIANTS",
    "dataloader_implementation",
    "dpcr_implementations",
    "shuffled_batches_implementation",
    "implementations",
    "language_implementations",
    "linear_formula",
    "noise_scaled",
    "variant",
]

_REQUIRES = ("torch", "opacus")
#: Open upstream report of the leak the two-world audit finds in the unmodified library.
OPACUS_571 = "https://github.com/pytorch/opacus/issues/571"
#: Where Opacus documents ``poisson_sampling=False``: it "doesn't fit the assumptions made by privacy
#: accounting mechanism, but it can be a good approximation when using Poisson sampling is unfeasible".
OPACUS_POISSON_SAMPLING_DOC = "https://github.com/pytorch/opacus/blob/v1.6.0/opacus/privacy_engine.py#L367-L371"
#: What draws the batches of every Poisson path here (:attr:`dpverify.contract.ImplementationInfo.sampler`).
POISSON_SAMPLER = "opacus.DPDataLoader"

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch's first allocation; see the module docstring


class OpacusImplementation(Implementation):
    """Opacus' PrivacyEngine in ``grad_sample_mode``, with an optional tweak (a buggy variant)."""

    def __init__(
        self,
        info: ImplementationInfo,
        *,
        grad_sample_mode: str = "ghost",
        tweak: str | None = None,
        tweak_args: Mapping[str, Any] | None = None,
    ):
        if grad_sample_mode not in ("hooks", "ghost"):
            raise ValueError(f"grad_sample_mode must be 'hooks' or 'ghost', got {grad_sample_mode!r}")
        self.info = info
        self.grad_sample_mode = grad_sample_mode
        self.tweak = tweak
        self.tweak_args = dict(tweak_args or {})

    def unavailable_reason(self) -> str | None:
        """Also ``n/a`` where the installed Opacus release has no ``grad_sample_mode`` path (1.4's ghost)."""
        layer = self.tweak_args.get("layer") if self.tweak == "undercounting_norm" else None
        return super().unavailable_reason() or _missing_path(self.info.name, self.grad_sample_mode, norm_sampler=layer)

    def make_tweak(self):
        """The :class:`~dpverify_opacus._training.Tweak` object for this implementation (imports torch)."""
        from dpverify_opacus.variants import make_tweak

        return make_tweak(self.tweak, **self.tweak_args)

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_opacus._training import train_opacus

        return train_opacus(
            request, name=self.info.name, grad_sample_mode=self.grad_sample_mode, tweak=self.make_tweak()
        )


class OpacusDataLoaderImplementation(Implementation):
    """Opacus' ``make_private`` on the user's ``DataLoader(dataset, batch_size=B)``: ``batch_size`` a
    user's constant, or ``None`` for round(q·N) of each request (then q and the steps are the requested
    ones whenever N is a multiple of 1/q)."""

    def __init__(self, info: ImplementationInfo, *, batch_size: int | None = None, grad_sample_mode: str = "ghost"):
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or None, got {batch_size!r}")
        self.info = info
        self.batch_size = batch_size
        self.grad_sample_mode = grad_sample_mode

    def unavailable_reason(self) -> str | None:
        return super().unavailable_reason() or _missing_path(self.info.name, self.grad_sample_mode)

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_opacus._dataloader import train_opacus_dataloader

        return train_opacus_dataloader(
            request, name=self.info.name, batch_size=self.batch_size, grad_sample_mode=self.grad_sample_mode
        )


def dataloader_implementation(
    batch_size: int | None = None, *, grad_sample_mode: str = "ghost"
) -> OpacusDataLoaderImplementation:
    """``opacus-dataloader`` (``batch_size=None``, registered) or, for a user's constant B, the same
    library path named ``opacus-dataloader-b<B>`` (not registered)."""
    from dpverify_opacus._releases import GHOST_MAX_GRAD_NORM, installed_version

    suffix = "" if batch_size is None else f"-b{batch_size}"
    finding = GHOST_MAX_GRAD_NORM.at(installed_version()) if grad_sample_mode == "ghost" else None
    info = _info(
        f"opacus-dataloader{suffix}",
        expected="known-issue",
        issue=OPACUS_571,
        sampler=POISSON_SAMPLER,  # make_private swaps the user's loader for it
        notes="PrivacyEngine.make_private on DataLoader(dataset, batch_size=B) as in Opacus' tutorials: q = "
        "1/len(loader), expected_batch_size = int(N·q) (Opacus #571: both read the private dataset size); "
        "a two-world audit of 2 vs 3 records refutes Opacus' claim (benchmarks/results/two-world-finding.md)"
        + ("" if finding is None else f"; installed release, also: {finding.summary} ({finding.issue})"),
    )
    return OpacusDataLoaderImplementation(info, batch_size=batch_size, grad_sample_mode=grad_sample_mode)


def shuffled_batches_implementation() -> OpacusImplementation:
    """``opacus-shuffled-batches``: ``make_private(poisson_sampling=False)`` on a shuffled
    ``DataLoader(dataset, batch_size=B)`` as Opacus documents it, its accountant still stating Poisson
    sampling at q = 1/len(loader) (docs/bugs.md class 9). Its every-update audit refutes that claim, which Opacus
    calls "a good approximation": a known issue, with the documentation's link."""
    info = _info(
        "opacus-shuffled-batches",
        expected="known-issue",
        issue=OPACUS_POISSON_SAMPLING_DOC,
        bug=9,
        notes="make_private(poisson_sampling=False) on DataLoader(dataset, batch_size=B, shuffle=True), the "
        "designated normaliser kept; the fixed-batch world (every update seen) refutes the Poisson claim",
    )
    return OpacusImplementation(info, tweak="shuffled_batches")


class OpacusLanguageImplementation(OpacusImplementation):
    """Opacus' PrivacyEngine training the causal transformer of the language-model contract, with an
    optional tweak (a buggy variant) named as in :data:`dpverify_opacus.variants.TWEAKS`."""

    def train(self, request):  # a dpverify.contract.SequenceRequest -> SequenceModel
        from dpverify_opacus._language import train_opacus_language

        return train_opacus_language(
            request, name=self.info.name, grad_sample_mode=self.grad_sample_mode, tweak=self.make_tweak()
        )


def language_implementations() -> list[OpacusLanguageImplementation]:
    """Opacus on the language-model contract in both ``grad_sample_mode``s, and its variants
    (:data:`LANGUAGE_VARIANTS`)."""
    return [
        _correct(
            "opacus-lm",
            "ghost",
            "PrivacyEngine.make_private on a causal transformer, ghost clipping",
            kind=OpacusLanguageImplementation,
            task="language",
        ),
        _correct(
            "opacus-lm-hooks",
            "hooks",
            "PrivacyEngine.make_private on a causal transformer, hooks mode",
            kind=OpacusLanguageImplementation,
            task="language",
        ),
        *(spec.build() for spec in LANGUAGE_VARIANTS),
    ]


#: Where opacus-dpcr 1.0.0 accounts (no upstream report of the finding was found): DPCREngine.make_private hands
#: Opacus' DP-SGD accountant hook σ and q for every step, whatever the DPCR mechanism.
OPACUS_DPCR_ACCOUNTING = "https://github.com/imcjp/Opacus-DPCR/blob/main/opacus_dpcr/dpcr_engine.py"


class OpacusDpcrImplementation(Implementation):
    """opacus-dpcr's ``DPCREngine`` with the binary tree (:mod:`dpverify_opacus._dpcr`): its accountant's claim
    or the tree's exact mechanism (``claim``), with an optional change of its code path (``tweak``)."""

    def __init__(self, info: ImplementationInfo, *, claim: str = "accountant", tweak: str | None = None):
        self.info, self.claim, self.tweak = info, claim, tweak

    def train(self, request: TrainingRequest) -> TrainedModel:
        from dpverify_opacus._dpcr import train_dpcr

        return train_dpcr(request, name=self.info.name, claim=self.claim, tweak=self.tweak)


def _dpcr_info(name: str, **fields: Any) -> ImplementationInfo:
    return ImplementationInfo(
        name=name, library="opacus-dpcr", requires=(*_REQUIRES, "opacus_dpcr", "dpcrpy", "dp_accounting"),
        extra="opacus-dpcr", correlated_noise=True, sampler=POISSON_SAMPLER, **fields,
    )  # fmt: skip  # DPCREngine.make_private(poisson_sampling=True) swaps the loader for Opacus' DPDataLoader


def dpcr_implementations() -> list[OpacusDpcrImplementation]:
    """opacus-dpcr as it ships (its accountant's claim: a known issue), its tree claimed as the mechanism it is,
    and that path's variants."""
    return [
        OpacusDpcrImplementation(
            _dpcr_info(
                "opacus-dpcr",
                expected="known-issue",
                issue=OPACUS_DPCR_ACCOUNTING,
                bug=13,
                notes="DPCREngine(dpcrGenerator=BinMech(4)) claiming its accountant's ε: Opacus' RDP of σ at every "
                "step, while the tree's noise σ·√(k+1) is scaled for a record in one step of each 16-step tree; "
                "a record in every step moves node t by lowbit(t) (‖C·1‖²/(k+1) = 75.2 per tree against the 16 "
                "accounted: μ 2.17 times the claim), and the full-batch every-update audit refutes the claim "
                "(benchmarks/results/opacus-dpcr.md). Not reported upstream (no report found)",
            ),
            claim="accountant",
        ),
        OpacusDpcrImplementation(
            _dpcr_info(
                "opacus-dpcr-tree",
                notes="DPCREngine(dpcrGenerator=BinMech(4)) claiming the tree's exact Gaussian mechanism for a "
                "record in every step, GaussianDpEvent(σ·√(k+1)/‖C·1‖): the library's noise, our accounting",
            ),
            claim="mechanism",
        ),
        *(
            OpacusDpcrImplementation(
                _dpcr_info(name, expected="violation", bug=bug, breaks=breaks, detectability=detectability, notes=notes),
                claim="mechanism",
                tweak=tweak,
            )
            for name, bug, tweak, detectability, breaks, notes in DPCR_VARIANTS
        ),
    ]


#: opacus-dpcr-tree's variants: (name, docs/bugs.md class, tweak of :mod:`dpverify_opacus._dpcr`, detectability,
#: the rule it breaks, how).
DPCR_VARIANTS: tuple[tuple[str, int, str, str, str, str], ...] = (
    (
        "opacus-dpcr-unscaled-noise",
        13,
        "unscaled_noise",
        "D2",
        "each tree node's noise must be σ·C times the tree's sensitivity √(k+1); here it is σ·C",
        "TensorGaussNoiMech.setSens keeps sensitivity 1 when BinMech sets √(k+1): the nodes' noise √5 = 2.24 "
        "times too small",
    ),
    (
        "opacus-dpcr-unrestarted-tree",
        16,
        "unrestarted_tree",
        "D3",
        "the tree must restart every 2^k steps, as its noise and its claim count; here one deeper tree spans the run",
        "the generator's BinMech spans every step of the run, its noise still scaled for BinMech(4)'s 5 nodes: at "
        "the gate's 32 steps its μ is 1.42 times the claim, 1.23 through the claimed trees' whitening (D3: "
        "benchmarks/results/opacus-dpcr.md)",
    ),
)


def _info(name: str, **fields: Any) -> ImplementationInfo:
    """An implementation of this package: the library, its imports and the extra to install are Opacus'."""
    return ImplementationInfo(name=name, library="opacus", requires=_REQUIRES, extra="opacus", **fields)


#: The layer designs both grad_sample_modes train (:class:`dpverify.contract.LayerArchitecture`); ``conv`` through
#: Opacus' Conv1d grad sampler (every release from 1.4.0; ghost clipping, which has no Conv norm sampler, takes
#: the norms of its per-sample gradients).
LAYERS = ("embedding", "linear_3d", "layer_norm", "conv")


def _missing_path(name: str, grad_sample_mode: str, *, norm_sampler: str | None = None) -> str | None:
    """``n/a: <why>`` when the installed release lacks the path (:func:`._releases.missing_path`), else ``None``."""
    from importlib import metadata

    from dpverify_opacus._releases import installed_version, missing_path

    version = installed_version()
    reason = None if version is None else missing_path(version, grad_sample_mode, norm_sampler=norm_sampler)
    return None if reason is None else f"n/a: {name} needs {reason}; installed: Opacus {metadata.version('opacus')}"


def _correct(
    name: str, mode: str, notes: str, *, kind: type[OpacusImplementation] = OpacusImplementation, **fields: Any
) -> OpacusImplementation:
    """A correct path (a classification one also trains the layer designs); in ghost mode, a known issue on
    the releases where one holds (:mod:`._releases`): of the whole path (:data:`._releases.GHOST_MAX_GRAD_NORM`),
    or of its linear_3d design alone (:data:`._releases.GHOST_LINEAR_BIAS_3D`), the one design that finds it,
    so that its other audits still count and fail on a new bug."""
    from dpverify_opacus._releases import GHOST_LINEAR_BIAS_3D, GHOST_MAX_GRAD_NORM, installed_version

    if kind is OpacusImplementation:
        fields.setdefault("layers", LAYERS)
        fields.setdefault("sampler", POISSON_SAMPLER)
    version = installed_version() if mode == "ghost" else None
    finding = GHOST_MAX_GRAD_NORM.at(version)
    bias = GHOST_LINEAR_BIAS_3D.at(version) if "linear_3d" in fields.get("layers", ()) else None
    if finding is not None:
        fields.update(expected="known-issue", issue=finding.issue)
    elif bias is not None:
        fields.update(layer_issues=(("linear_3d", bias.issue),))
    for holds in (finding, bias):
        notes = notes if holds is None else f"{notes}; installed release: {holds.summary}"
    return kind(_info(name, notes=notes, **fields), grad_sample_mode=mode)


@dataclass(frozen=True)
class VariantSpec:
    """A buggy variant: its name, the tweak that makes it, and what it breaks."""

    name: str
    bug: int
    tweak: str
    breaks: str
    detectability: str
    notes: str
    tweak_args: Mapping[str, Any] = field(default_factory=dict)
    grad_sample_mode: str = "ghost"
    task: str = "classification"
    layers: tuple[str, ...] = ()

    def build(self) -> OpacusImplementation:
        info = _info(
            self.name,
            expected="violation",
            breaks=self.breaks,
            bug=self.bug,
            detectability=self.detectability,  # type: ignore[arg-type]
            notes=self.notes,
            task=self.task,
            layers=self.layers,
        )
        kind = OpacusLanguageImplementation if self.task == "language" else OpacusImplementation
        return kind(info, grad_sample_mode=self.grad_sample_mode, tweak=self.tweak, tweak_args=self.tweak_args)


VARIANTS: tuple[VariantSpec, ...] = (
    VariantSpec(
        name="opacus-no-noise",
        bug=1,
        tweak="scaled_noise",
        tweak_args={"scale": 0.0},
        breaks="noise N(0, σ²C²) must be added to the clipped sum at every step; this step adds none",
        detectability="D1",
        notes="DPOptimizer.add_noise runs with noise_multiplier 0 (restored before the accountant hook reads it)",
    ),
    VariantSpec(
        name="opacus-no-clipping",
        bug=2,
        tweak="no_clipping",
        breaks="each per-example gradient must be clipped to norm C; here rows are summed unclipped while "
        "the noise is still σ·C for the nominal C",
        detectability="D1",
        notes="the ghost-clipping module's max_grad_norm is set to inf; the optimizer keeps C for the noise",
    ),
    VariantSpec(
        name="opacus-noise-for-mean",
        bug=3,
        tweak="scaled_noise",
        tweak_args={"scale": "per_batch"},
        breaks="the noise on the sum of clipped rows must have std σ·C; here it is σ·C/B (σ·C on the mean)",
        detectability="D1",
        notes="DPOptimizer.add_noise with noise_multiplier / expected_batch_size; D1 since B = qN ≈ 100 in an audit",
    ),
    VariantSpec(
        name="opacus-batch-clipping",
        bug=4,
        tweak="batch_clipping",
        breaks="each example's gradient must be clipped by its own norm; here the batch's mean gradient is "
        "clipped to C as one row (the sum to B·C)",
        detectability="D2",
        notes="ghost per-row clipping off (module max_grad_norm = inf); DPOptimizerFastGradientClipping."
        "accumulate clips the summed gradient to expected_batch_size·C. Caught on every seed at claimed "
        "ε ≤ 2 by the quick profile (benchmarks/results/detection.md)",
    ),
    VariantSpec(
        name="opacus-unnoised-layer",
        bug=5,
        tweak="unnoised_layer",
        breaks="noise must be added to every coordinate of the clipped sum; the output layer gets none",
        detectability="D1",
        notes="DPOptimizer.add_noise, then the output Linear's weight and bias get their clipped sum back "
        "un-noised; D1 (the stronger end of D1–D2) because the un-noised layer is the output layer, which "
        "memorises the labels: caught on every seed at claimed ε 1, 2 and 4 by the quick profile "
        "(benchmarks/results/detection.md)",
    ),
    VariantSpec(
        name="opacus-duplicated-rows",
        bug=6,
        tweak="duplicated_rows",
        tweak_args={"copies": 2},
        breaks="each sampled record must contribute one clipped row; here it contributes two (sensitivity 2C "
        "against noise for C)",
        detectability="D3",
        notes="Opacus' UniformWithReplacementSampler with each sampled index repeated twice in its batch. "
        "docs/bugs.md class 6, D2; at two copies (the low end of its 2-10x range) this audit measured "
        "ε_L 0.55–1.6 at claimed ε 2 (quick profile at lr 1 and 5; benchmarks/results/detection.md) "
        "against a true ε of 4.0 (PLD), so it is D3 here: reported, not required to be caught",
    ),
    VariantSpec(
        name="opacus-realised-batch-norm",
        bug=7,
        tweak="realised_batch",
        breaks="the noisy sum must be divided by a data-independent constant (q·N); here by the realised "
        "batch size",
        detectability="D3",
        notes="DPOptimizer.scale_grad divides by the number of rows of the step (Opacus #571); D3, the "
        "weaker end of D2–D3",
    ),
    VariantSpec(
        name="opacus-accountant-steps",
        bug=8,
        tweak="accountant_steps",
        tweak_args={"every": 4},
        breaks="the accountant must compose every step taken; here it records one step in four",
        detectability="D3",
        notes="the accountant's optimizer step hook runs on every 4th step only, and a target ε is calibrated "
        "for steps/4; the claim states the accounted steps, so the claim's steps differ from the request's; "
        "D3, the weaker end of D2–D3",
    ),
    VariantSpec(
        name="opacus-accountant-rate",
        bug=8,
        tweak="accountant_rate",
        tweak_args={"factor": 4},
        breaks="the accountant must be given the rate the batches are sampled at; here it is told q/4",
        detectability="D3",
        notes="the accountant's optimizer step hook records q/4 (jax_privacy #287: q read from the physical "
        "batch of 4 accumulation steps), and a target ε is calibrated at q/4; at q = 1 the one-run audit sees "
        "a claim for q = 1/4, at q < 1 the every-update audit tests the claim's own subsampled curve",
    ),
    VariantSpec(
        name="opacus-replace-one-claim",
        bug=10,
        tweak="replace_one_claim",
        breaks="a claim must name the neighbouring relation its accountant computed; here the add/remove ε "
        "is stated as replace-one",
        detectability="D3",
        notes="Opacus' RDP (add/remove) ε with relation='replace_one'",
    ),
    VariantSpec(
        name="opacus-microbatches",
        bug=11,
        tweak="microbatches",
        tweak_args={"size": 2},
        breaks="each clipped row must belong to one record; here rows are means over pairs of records, "
        "accounted as if each record were clipped alone",
        detectability="D3",
        notes="records paired as the 2 sequence positions of Opacus' ghost clipping (criterion shape=(B/2, 2, C)); "
        "sum divided by the expected number of pairs",
    ),
    VariantSpec(
        name="opacus-reused-noise",
        bug=12,
        tweak="reused_noise",
        breaks="noise must be fresh at every step; here the same noise vector is added at every step",
        detectability="D4",
        notes="the noise generator is reseeded before each DPOptimizer.add_noise; D4, the weaker end of D3–D4",
    ),
    *(
        VariantSpec(
            name=f"opacus-ghost-{name}-norm",
            bug=2,
            tweak="undercounting_norm",
            tweak_args={"layer": layer},
            breaks=f"each record's gradient must be clipped by its whole norm; here {breaks}",
            detectability="D2",
            notes=f"{how}; invisible to softmax regression (one Linear on 2-D input)",
            layers=(layer,),
        )
        for name, layer, breaks, how in (
            (
                "embedding",
                "embedding",
                "ghost clipping's Embedding norm takes a token repeated within a record as separate rows, "
                "√(Σ_t |g_t|²), so a record of T equal tokens is clipped at √T·C",
                "Opacus' own Embedding norm sampler with each position's token offset to a token of its own, in the "
                "run's copy of GradSampleModuleFastGradientClipping.NORM_SAMPLERS; seen by the embedding layer "
                "design (its small regime's 16 positions: sensitivity 4C)",
            ),
            (
                "linear-bias",
                "linear_3d",
                "ghost clipping's Linear bias norm on a 3-D input is its 2-D formula, √(Σ_t |g_t|²), not the norm "
                "of the gradient summed over positions (Opacus #751)",
                "Opacus' own Linear norm sampler with the bias entry replaced, in the run's copy of "
                "GradSampleModuleFastGradientClipping.NORM_SAMPLERS; seen by the linear_3d layer design (its "
                "small regime's 16 positions, input 1/16: sensitivity 3.9C)",
            ),
            (
                "layer-norm",
                "layer_norm",
                "fast gradient clipping's LayerNorm per-record gradients (whose norms it clips by) average over "
                "the positions instead of summing them",
                "Opacus' own LayerNorm grad sampler divided by the positions, in the run's copy of "
                "GradSampleModuleFastGradientClipping.GRAD_SAMPLERS (ghost mode has no LayerNorm norm sampler; "
                "it takes norms of these); seen by the layer_norm design (4 positions: sensitivity 4C)",
            ),
            (
                "conv",
                "conv",
                "ghost clipping's Conv1d norm takes a record's output positions as separate rows, √(Σ_q |g_q|²), "
                "not the norm of the gradient summed over them (the unfold formula's sum over positions dropped)",
                "Opacus' own Conv1d grad sampler applied to each output position alone, the per-position gradients "
                "kept as the record's rows, in the run's copy of GradSampleModuleFastGradientClipping.GRAD_SAMPLERS "
                "(ghost mode has no Conv norm sampler; it takes norms of these); seen by the conv design (its small "
                "regime's 16 positions: sensitivity 4C)",
            ),
        )
    ),
    VariantSpec(
        name="opacus-ghost-linear-bias-squared-norm",
        bug=2,
        tweak="undercounting_norm",
        tweak_args={"layer": "linear_3d", "formula": "squared_gram"},
        breaks="each record's gradient must be clipped by its whole norm; here ghost clipping's Linear bias norm on a "
        "3-D input is √(Σᵢⱼ (gᵢ·gⱼ)²), the formula Opacus 1.5.0–1.5.3 shipped (fixed in 1.5.4, #751), not "
        "√(Σᵢⱼ gᵢ·gⱼ) = |Σ_t g_t|: for equal positions of output gradient g it states |g| times the bias's norm, "
        "nearly right where |g| is near 1 and too little where |g| is below 1",
        detectability="D2",
        notes="Opacus' own Linear norm sampler with the bias entry computed as 1.5.3's compute_linear_norm_sample "
        "does, in the run's copy of GradSampleModuleFastGradientClipping.NORM_SAMPLERS; seen by the linear_3d "
        "design's small regime (16 positions of weight 0.18: sensitivity 5.4C); invisible to softmax regression (one Linear on 2-D input)",
        layers=("linear_3d",),
    ),
)


#: Variants of Opacus training the designated transformer (the language-model contract). Those that break
#: one layer kind were measured in the zero-initialised transformer of the Dirac token audit
#: (benchmarks/results/language-detection.md).
LANGUAGE_VARIANTS: tuple[VariantSpec, ...] = (
    VariantSpec(
        name="opacus-lm-no-noise",
        bug=1,
        tweak="scaled_noise",
        tweak_args={"scale": 0.0},
        breaks="noise N(0, σ²C²) must be added to the clipped sum at every step; this step adds none",
        detectability="D1",
        notes="DPOptimizer.add_noise runs with noise_multiplier 0 (restored before the accountant reads it)",
        task="language",
    ),
    *(
        VariantSpec(
            name=name,
            bug=2,
            tweak="scaled_clipping",
            tweak_args={"scale": 2.0},
            breaks="rows must be clipped to the C the noise σ·C is drawn for; here they are clipped to 2C (a 2x "
            "noise deficit)",
            detectability="D2",
            notes=notes,
            grad_sample_mode=mode,
            task="language",
        )
        for name, mode, notes in (
            ("opacus-lm-clip-2c", "ghost", "Opacus' ghost-clipping module's max_grad_norm is 2C; the DPOptimizer keeps C for the noise"),
            ("opacus-lm-hooks-clip-2c", "hooks", "DPOptimizer.clip_and_accumulate clips at 2C; add_noise keeps C"),
        )
    ),
    VariantSpec(
        name="opacus-lm-unnoised-embedding",
        bug=5,
        tweak="unnoised_embedding",
        breaks="noise must be added to every coordinate of the clipped sum; the embeddings get none",
        detectability="D1",
        notes="DPOptimizer.add_noise, then the token and position embeddings get their clipped sum back "
        "un-noised. A non-member's prefix row never moves, so the model answers its prefix exactly as a "
        "never-seen token, which a member's never does (benchmarks/results/language-embedding-leak.md): the "
        "Dirac token score ranks such untouched canaries last. The suffix likelihood alone does not see it (the "
        "embeddings' gradient flows through the LM head, which starts at zero: second order)",
        task="language",
    ),
    VariantSpec(
        name="opacus-lm-unclipped-embedding",
        bug=2,
        tweak="unclipped_embedding",
        breaks="each per-example gradient must be clipped to norm C as a whole; here the embeddings' part is "
        "left out of the clipping",
        detectability="D4",
        notes="hooks mode: DPOptimizer.clip_and_accumulate takes norms and clips without the embeddings and adds "
        "their per-sample gradients as they are. In the designated transformer the embeddings' gradient is "
        "second order (it flows through the LM head, which starts at zero), so the excess sensitivity is tiny: "
        "caught on 0 of 5 seeds at claimed ε 2 and 4 (benchmarks/results/language-detection.md)",
        grad_sample_mode="hooks",
        task="language",
    ),
)


def variant(name: str) -> OpacusImplementation:
    """Build the buggy variant called ``name``."""
    for spec in (*VARIANTS, *LANGUAGE_VARIANTS):
        if spec.name == name:
            return spec.build()
    raise KeyError(f"no Opacus variant named {name!r}; known: {', '.join(s.name for s in (*VARIANTS, *LANGUAGE_VARIANTS))}")


def noise_scaled(k: float, *, grad_sample_mode: str = "ghost", task: str = "classification") -> OpacusImplementation:
    """Opacus (ghost mode unless ``grad_sample_mode`` says otherwise) whose noise std is divided by ``k``
    while the claim stays Opacus' claim for σ.

    Not registered; for benchmarks of the smallest noise deficit an audit catches. ``k = 1`` is the
    correct library."""
    if not k >= 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    info = _info(
        f"opacus{'-lm' if task == 'language' else ''}-noise-div-{k:g}",
        task=task,
        expected="violation" if k > 1 else "private",
        breaks=f"the noise on the clipped sum must have std σ·C; here it is σ·C/{k:g}" if k > 1 else None,
        detectability=("D1" if k >= 10 else "D2" if k >= 2 else "D3") if k > 1 else None,
        notes="benchmark variant: DPOptimizer.add_noise with noise_multiplier / k",
    )
    kind = OpacusLanguageImplementation if task == "language" else OpacusImplementation
    return kind(info, grad_sample_mode=grad_sample_mode, tweak="scaled_noise", tweak_args={"scale": 1.0 / k})


def linear_formula(formula: str) -> OpacusImplementation:
    """Opacus' ghost clipping with its Linear norm sampler's 3-D formula replaced by ``formula`` of
    :data:`~dpverify_opacus.variants.LINEAR_NORM_FORMULAS`, audited on the ``linear_3d`` design: private for
    ``exact``, a violation (class 2) for each wrong one.

    Not registered; for the benchmark and the test of the wrong-formula family (benchmarks/layer_designs.py
    --formulas)."""
    from dpverify_opacus.variants import LINEAR_NORM_FORMULAS

    if formula not in LINEAR_NORM_FORMULAS:
        raise ValueError(f"formula must be one of {', '.join(LINEAR_NORM_FORMULAS)}, got {formula!r}")
    wrong = formula != "exact"
    info = _info(
        f"opacus-ghost-linear-{formula}",
        expected="violation" if wrong else "private",
        breaks=formula if wrong else None,
        bug=2 if wrong else None,
        detectability="D2" if wrong else None,
        notes="benchmark variant: the linear_3d norm sampler's formula replaced",
        layers=("linear_3d",),
    )
    return OpacusImplementation(info, grad_sample_mode="ghost", tweak="undercounting_norm", tweak_args={"layer": "linear_3d", "formula": formula})


def implementations() -> list[Implementation]:
    """Entry point of the group ``dpverify.implementations``: the library in both modes and its variants."""
    return [
        _correct("opacus-ghost", "ghost", "PrivacyEngine.make_private, grad_sample_mode='ghost' (ghost clipping)"),
        _correct("opacus-hooks", "hooks", "PrivacyEngine.make_private, grad_sample_mode='hooks' (per-sample grads)"),
        dataloader_implementation(),
        shuffled_batches_implementation(),
        *(spec.build() for spec in VARIANTS),
        *language_implementations(),
        *dpcr_implementations(),
    ]
