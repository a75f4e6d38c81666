"""The default gate's layer-design audits over seeds: does each design pass the correct paths and refute the
variant whose per-layer norm formula undercounts its layer, at the per-audit confidence the main job gives it?

    python benchmarks/layer_designs.py --seeds 5
    python benchmarks/layer_designs.py --seeds 5 --layers conv --append
    KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/layer_designs.py --seeds 5 --planned 54 --output layer-designs-jax.md
    python benchmarks/layer_designs.py --timing --seeds 3 --output layer-designs-speed.md
    python benchmarks/layer_designs.py --formulas --seeds 5 --output layer-formulas.md
    python benchmarks/layer_designs.py --formulas root first_position --seeds 2 --output /tmp/some.md

Writes ``benchmarks/results/layer-designs.md``: per implementation and layer design, the violations in the
seeds, the (ε, δ) test's and the curve test's ε_L (min – max), the signal fraction ρ and the smallest noise
deficit k* refuted with probability ≥ 0.8 (median), and seconds per audit (median; the first audit of a
process also imports the library). Seed s is the session seed, as `dpverify audit --all --seed s` runs it.
The rows "none (default one-run audit)" time each chosen correct implementation's default one-run audit
(softmax regression) in the same process: the reference for the layer audits' cost on a machine as loaded
as this one was.

``--timing`` runs, per seed, each chosen correct implementation's default one-run audit and its layer
audits one after the other in one process (after one warm-up audit each, which imports and traces), and
writes each audit's median seconds and its ratio to the same implementation's default audit: on a shared
machine the ratio is the number that carries over.

``--formulas`` audits, on the ``linear_3d`` design, Opacus' ghost clipping with its Linear norm sampler's 3-D
formula replaced by each of ``dpverify_opacus.variants.LINEAR_NORM_FORMULAS`` or those it names (the exact one,
expected private, and the wrong ones, shipped or not, expected refuted), and adds each audit's curve-test p-value (max) and the
share of its canaries whose stated norm is too small (the design's regimes where the formula undercounts).

``--layers`` runs those layer designs only (and, outside ``--timing``, no default audit); ``--append`` adds
the run to the output file as a new dated section instead of replacing the file.
``--planned N`` sets the per-audit confidence to the main job's, 1 − 0.05/N, where this environment plans
fewer audits than the main job (which runs every family in one session): the JAX environment.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from dpverify.audits import run_audit
from dpverify.config import layer_config, profile_config
from dpverify.contract import LAYERS
from dpverify.gate import gate_audits
from dpverify.registry import registered_implementations
from dpverify.session import AuditSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
from two_world import RESULTS, _range, _write, header, verdict_cells  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--implementations", nargs="*", help="names (default: every one with layer designs)")
    parser.add_argument("--output", default="layer-designs.md")
    parser.add_argument("--timing", action="store_true", help="time the correct implementations' audits, interleaved")
    parser.add_argument("--layers", nargs="*", choices=LAYERS, help="layer designs (default: every one)")
    parser.add_argument("--append", action="store_true", help="add a dated section to the output file")
    parser.add_argument("--planned", type=int, help="counted audits of the main job (default: those planned here)")
    parser.add_argument("--formulas", nargs="*", help="audit each Linear norm formula (or those named) on the linear_3d design")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:  # the JAX environment
        pass
    else:
        torch.set_num_threads(1)
    registered = [i for i in registered_implementations() if i.info.task == "classification" and not i.unavailable_reason()]
    planned = args.planned or sum(a.counted for a in gate_audits([i.info for i in registered]))
    confidence = 1 - 0.05 / planned
    chosen = [i for i in registered if i.info.layers and (not args.implementations or i.info.name in args.implementations)]
    lines = header(
        "The default gate's layer-design audits over seeds",
        args,
        [
            f"- each audit at confidence {confidence:.5f}: the main job's (`dpverify audit --all`, {planned} planned "
            f"audits{' (--planned)' if args.planned else ' here'}, session 0.95); seed s is the session seed, as "
            "`dpverify audit --all --seed s` runs it",
            "- settings: `dpverify.config.LAYER_SETTINGS` (quick profile: q = 1, 10 steps, C = 0.5, target ε 2, "
            "inclusion design; embedding 4 runs × 1000 canaries, 16 positions, lr 2; linear_3d 8 × 500, 16 positions, "
            "input 1/16, lr 2; layer_norm 8 × 500, 4 positions, lr 1/8; conv 8 × 500, kernel 3, 16 outputs, lr 2; "
            "positions pooled by each record's regime, `dpverify.contract.position_weights`); the numpy ceiling of the "
            "designs before the regimes: `python benchmarks/layer_sim.py`",
        ],
    ) + [
        "| implementation | expected | layer | violations | as expected | ε_L (min – max) | curve ε_L (min – max) | ρ (median) | k* (median) | s/audit (median) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if args.timing:
        _timing(args, chosen, confidence)
        return
    rows = [(i, a) for i in chosen for a in gate_audits([i.info], worlds="none") if _chosen_layer(a.layer, args)]
    if args.formulas is not None:
        rows = [(i, a) for i in _formula_implementations(args.formulas) for a in gate_audits([i.info], worlds="none") if a.layer]
        lines[-2] = lines[-2].replace(" s/audit (median) |", " curve p (max) | s/audit (median) |")
        lines[-1] += "---|"
    elif not args.layers:
        rows += [(i, gate_audits([i.info], worlds="none")[0]) for i in chosen if i.info.expected == "private"]
    for implementation, audit in rows:
        info = implementation.info
        results, seconds = [], []
        for seed in range(args.seeds):
            session = AuditSession(enabled=True, profile="quick", confidence=0.95, seed=seed, device="cpu",
                                   epsilon=2.0, implementations=(), report_path=None, plots_dir=None)  # fmt: skip
            base = profile_config("quick") if audit.layer is None else layer_config("quick", audit.layer)
            config = base.with_overrides(seed=session.audit_seed(audit.seed_key), confidence=confidence, device="cpu")
            started = time.perf_counter()
            results.append(run_audit(implementation, config))
            seconds.append(time.perf_counter() - started)
        powers = [r.power for r in results if r.power is not None]
        rho = np.median([p.signal_fraction for p in powers if p.signal_fraction is not None]) if powers else float("nan")
        deficits = [p.smallest_deficit for p in powers if p.smallest_deficit is not None]
        row = (
            verdict_cells(info, audit.layer or "none (default one-run audit)", results)
            + f"{_range([r.curve_epsilon_lower_bound or 0.0 for r in results])} | {rho:.2f} | "
            f"{f'{np.median(deficits):.2f}' if deficits else 'not stated'} | "
            + (f"{max(r.curve_p_value for r in results):.2g} | " if args.formulas is not None else "")
            + f"{np.median(seconds):.1f} |"
        )
        print(row, flush=True)
        lines.append(row)
    _write_section(args, lines)


def _formula_implementations(names: list[str]) -> list:
    """Opacus' ghost path with its Linear norm formula on a 3-D input replaced by each of
    ``LINEAR_NORM_FORMULAS`` (those in ``names``, if any), audited on the linear_3d design (the exact one
    expected private)."""
    from dpverify_opacus import linear_formula
    from dpverify_opacus.variants import LINEAR_NORM_FORMULAS

    return [linear_formula(formula) for formula in LINEAR_NORM_FORMULAS if not names or formula in names]


def _chosen_layer(layer: str | None, args) -> bool:
    """Whether a gate audit of ``layer`` (``None``: the default one-run audit) is a layer audit ``--layers`` chose."""
    return layer is not None and (not args.layers or layer in args.layers)


def _write_section(args, lines: list[str]) -> None:
    """The output file: ``lines``, or with ``--append`` the file's text and ``lines`` as its next section."""
    path = RESULTS / args.output
    if args.append and path.exists():
        lines = [path.read_text().rstrip("\n"), "", "#" + lines[0], *lines[1:]]
    _write(args.output, lines)


def _timing(args, chosen, confidence: float) -> None:
    audits = [
        (i, a)
        for i in chosen
        if i.info.expected == "private"
        for a in gate_audits([i.info], worlds="none")
        if a.layer is None or _chosen_layer(a.layer, args)
    ]

    def config(audit, seed):
        base = profile_config("quick") if audit.layer is None else layer_config("quick", audit.layer)
        return base.with_overrides(seed=seed, confidence=confidence, device="cpu")

    for implementation, audit in audits:  # warm-up: imports, traces
        run_audit(implementation, config(audit, 10_000))
    seconds: dict[tuple[str, str], list[float]] = {}
    for seed in range(args.seeds):
        for implementation, audit in audits:
            started = time.perf_counter()
            run_audit(implementation, config(audit, seed))
            seconds.setdefault((audit.implementation_name, audit.layer or "default"), []).append(time.perf_counter() - started)
    lines = header("Seconds per layer-design audit, against the default one-run audit", args, [
        f"- {args.seeds} seed(s), each audit after one warm-up audit of the same kind, interleaved in one process",
    ]) + ["| implementation | audit | s/audit (median) | min – max | / default audit |", "|---|---|---|---|---|"]
    for (name, kind), values in seconds.items():
        default = np.median(seconds[(name, "default")])
        row = f"| {name} | {kind} | {np.median(values):.1f} | {_range(values)} | {np.median(values) / default:.2f} |"
        print(row, flush=True)
        lines.append(row)
    _write_section(args, lines)


if __name__ == "__main__":
    main()
