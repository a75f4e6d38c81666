"""Language-model audit benchmark of UniAud's setting (the measured baseline, ``REPEATED_TOKEN_BASELINE``):
ε_L against the claimed ε, repeated-token canaries beside NewToken. The Dirac token design, the LM audit's
default, is measured by ``benchmarks/language_dirac.py``.

    .venvs/torch/bin/python benchmarks/language.py --seeds 2

Writes ``benchmarks/results/language.md`` (``language-cuda.md`` on a GPU) stating the device, the date
and the command: for each canary mode, claimed ε and seed, one audit of ``opacus-lm`` under
``REPEATED_TOKEN_BASELINE`` in each design, with the claim in the pair design's relation
(replace-one) and Opacus' own add/remove ε beside it; then seconds per audit in Opacus' two per-sample
gradient modes. Numbers here are measurements, never test assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import sys
import time
from pathlib import Path

from audits import EPSILONS, _table, _write, device_line  # benchmarks/ is the script's directory
from language_dirac import describe

from dpverify.audits.planning import resolve_device
from dpverify.audits.language import REPEATED_TOKEN_BASELINE, LanguageAuditConfig, run_language_audit
from dpverify_opacus import language_implementations

RESULTS = Path(__file__).resolve().parent / "results"


def configured(base: LanguageAuditConfig, *, design: str, mode: str, epsilon: float, seed: int) -> LanguageAuditConfig:
    return base.with_overrides(design=design, mode=mode, epsilon=epsilon, seed=seed)


def header(args: argparse.Namespace, config: LanguageAuditConfig) -> list[str]:
    """Title, device, date, command and configuration (audits.py's header is tied to the MLP profiles)."""
    return [
        "# Language-model audit: repeated-token canaries (UniAud) and NewToken (Panda et al. 2025)",
        "",
        f"- device: {device_line(config.device)}",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `{args.command}`",
        f"- configuration: REPEATED_TOKEN_BASELINE: {describe(config)}",
        "",
    ]


def power(args: argparse.Namespace, base: LanguageAuditConfig) -> list[str]:
    opacus_lm = language_implementations()[0]
    rows = []
    for design in args.designs:
        for mode in args.modes:
            for epsilon in args.epsilons:
                results = [
                    run_language_audit(opacus_lm, configured(base, design=design, mode=mode, epsilon=epsilon, seed=s))
                    for s in range(args.seeds)
                ]
                for r in results:
                    if r.error:
                        raise RuntimeError(r.error)
                first = results[0]
                rows.append((
                    design, mode, first.library_epsilon, first.claimed_epsilon,
                    " / ".join(f"{r.epsilon_lower_bound:.2f}" for r in results),
                    statistics.median(r.epsilon_lower_bound for r in results),
                    first.optimal_epsilon, " / ".join(r.verdict for r in results),
                    statistics.mean(r.seconds for r in results),
                ))  # fmt: skip
                print(rows[-1], flush=True)
    columns = ("design", "canaries", "Opacus ε (add/remove)", "claimed ε in the design's relation", "ε_L per seed",
               "median ε_L", "ε_O", "verdicts", "s / audit")
    return ["## ε_L against claimed ε (opacus-lm, ghost clipping)", "", *_table(columns, rows)]


def speed(args: argparse.Namespace, base: LanguageAuditConfig) -> list[str]:
    """Seconds per audit of the same run in both modes (they train the same model, see the tests)."""
    config = configured(base, design=base.design, mode="repeated", epsilon=2.0, seed=0)
    rows = []
    for mode in ("ghost", "hooks"):
        implementation = language_implementations()[0]
        implementation.grad_sample_mode = mode
        result = run_language_audit(implementation, config)
        rows.append((mode, config.hyperparameters.steps, result.seconds, result.epsilon_lower_bound))
    return ["## Seconds per audit by Opacus grad_sample_mode (ε = 2, repeated)", "", *_table(("mode", "steps", "s / audit", "ε_L"), rows)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--designs", nargs="+", choices=("inclusion", "pair"), default=["inclusion", "pair"])
    parser.add_argument("--modes", nargs="+", choices=("repeated", "new_token"), default=["repeated", "new_token"])
    args = parser.parse_args(argv)
    args.command = "python benchmarks/language.py " + " ".join(argv if argv is not None else sys.argv[1:])
    base = dataclasses.replace(REPEATED_TOKEN_BASELINE, device=resolve_device(args.device))
    started = time.perf_counter()
    lines = header(args, base)
    lines += power(args, base) + [""] + speed(args, base)
    lines += ["", f"Total wall time: {time.perf_counter() - started:.0f} s."]
    _write("language", lines, args)


if __name__ == "__main__":
    main()
