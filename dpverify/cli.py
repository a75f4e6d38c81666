"""``dpverify``: audits, the registry and the bound from the command line, outside pytest."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from dpverify.config import DESIGNS, DEVICES, PROFILE_NAMES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpverify", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    audit = commands.add_parser("audit", help="audit registered implementations (the level is shared among them)")
    audit.add_argument("names", nargs="*", help="implementation names or glob patterns (see `dpverify list`)")
    audit.add_argument("--all", action="store_true", help="audit every registered, available implementation")
    audit.add_argument("--profile", choices=PROFILE_NAMES, default="quick")
    audit.add_argument("--epsilon", type=float, default=2.0, help="target ε to calibrate to (inf: non-private)")
    audit.add_argument(
        "--design",
        choices=DESIGNS,
        default=None,
        help="inclusion or pair (synthetic canaries); multitask (UniAud++), in_distribution or mislabeled "
        "(real data, report test accuracy; need pip install 'dpverify[data]')",
    )
    audit.add_argument("--m", type=int, default=None, help="number of canaries (audit records of a data design)")
    audit.add_argument("--epochs", type=int, default=None)
    audit.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other audit setting, as a marker keyword (e.g. --set num_tags=50, --set prefix_length=8); "
        "VALUE is a Python literal. Each implementation takes the settings its audit knows",
    )
    audit.add_argument("--confidence", type=float, default=0.95, help="confidence for all audits of this run together")
    audit.add_argument("--seed", type=int, default=0)
    audit.add_argument("--device", choices=DEVICES, default="auto")
    audit.add_argument("--report", metavar="PATH", help="write the JSON report (the pytest plugin's shape)")
    audit.add_argument("--plots", metavar="DIR", help="write per-audit PNG plots (needs matplotlib)")

    commands.add_parser("list", help="registered implementations, their library versions and availability")

    bound = commands.add_parser("bound", help="ε lower bound from counts (Steinke, Nasr & Jagielski 2023)")
    bound.add_argument("--m", type=int, required=True, help="number of canaries")
    bound.add_argument("--guesses", type=int, required=True)
    bound.add_argument("--correct", type=int, required=True)
    bound.add_argument("--delta", type=float, default=1e-5)
    bound.add_argument("--confidence", type=float, default=0.95)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"audit": _audit, "list": _list, "bound": _bound}[args.command](args)
    except ValueError as exc:
        print(f"dpverify: error: {exc}", file=sys.stderr)
        return 2


def _bound(args: argparse.Namespace) -> int:
    from dpverify.stats.bounds import epsilon_lower_bound, optimal_epsilon

    kwargs = dict(delta=args.delta, confidence=args.confidence)
    epsilon = epsilon_lower_bound(args.m, args.guesses, args.correct, **kwargs)
    print(f"epsilon_lower_bound = {epsilon:.6f}  (optimal for m={args.m}: {optimal_epsilon(args.m, **kwargs):.6f})")
    return 0


def _list(args: argparse.Namespace) -> int:
    from dpverify.registry import registered_implementations

    for implementation in registered_implementations():
        info = implementation.info
        version = implementation.library_version() or "not installed"
        reason = implementation.unavailable_reason()
        expected = "private" if info.expected == "private" else f"buggy variant, {info.detectability}: {info.breaks}"
        status = "available" if reason is None else f"unavailable ({reason})"
        print(f"{info.name:32s} {info.library} {version:12s} {status}; {expected}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from dpverify.audits import run_audit
    from dpverify.registry import registered_implementations
    from dpverify.session import AuditSession, outcome_as_expected

    if not args.names and not args.all:
        raise ValueError("name at least one implementation (see `dpverify list`) or pass --all")
    session = AuditSession(
        enabled=True,
        profile=args.profile,
        confidence=args.confidence,
        seed=args.seed,
        device=args.device,
        epsilon=args.epsilon,
        implementations=() if args.all else tuple(args.names),
        report_path=args.report,
        plots_dir=args.plots,
    )
    chosen = [impl for impl in registered_implementations() if session.selected(impl.info.name)]
    if not chosen:
        raise ValueError(f"no registered implementation matches {', '.join(args.names)}; see `dpverify list`")
    # As in the plugin: only audits of implementations expected to be private can raise a false alarm.
    session.planned_audits = sum(impl.info.expected == "private" for impl in chosen)
    overrides = {k: v for k, v in (("design", args.design), ("m", args.m), ("epochs", args.epochs)) if v is not None}
    overrides.update(_settings(args.settings))
    print(session.header(rerun=f"--seed {session.seed}"), file=sys.stderr)
    for index, implementation in enumerate(chosen, start=1):
        reason = implementation.unavailable_reason()
        if reason:
            print(f"[{index}/{len(chosen)}] skipped: {reason}", file=sys.stderr)
            continue
        config = _config_for(implementation, args.profile, overrides).with_overrides(
            epsilon=args.epsilon,
            device=args.device,
            seed=session.audit_seed(implementation.info.name),
            confidence=session.per_audit_confidence,
        )
        started = time.perf_counter()

        def progress(stage: str, index: int = index) -> None:
            print(f"[{index}/{len(chosen)}] {time.perf_counter() - started:6.1f}s {stage}", file=sys.stderr)

        result = run_audit(implementation, config, progress=progress)
        accuracy = "" if result.test_accuracy is None else f", test accuracy {result.test_accuracy:.3f}"
        progress(f"{result.verdict}: ε_L = {result.epsilon_lower_bound:.3f}, claimed {result.claimed_epsilon:.3f}{accuracy}")
        session.results.append(result.to_dict())
        if args.plots:
            from dpverify.plots import save_audit_plots

            save_audit_plots(result, args.plots)
    print("\n".join(session.summary_lines()))
    if args.report:
        session.write_report()
        print(f"JSON report: {Path(args.report)}")
    unexpected = [r for r in session.results if not outcome_as_expected(r)]
    for r in unexpected:
        print(f"unexpected: {r['implementation']} {r['verdict']}" + (f": {r['error']}" if r["error"] else ""))
    return 1 if unexpected else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def _settings(pairs: Sequence[str]) -> dict[str, object]:
    """``--set NAME=VALUE`` pairs as overrides; a VALUE that is no Python literal stays a string."""
    import ast

    settings: dict[str, object] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--set takes NAME=VALUE, got {pair!r}")
        try:
            settings[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            settings[name] = text
    return settings


def _config_for(implementation, profile: str, overrides: dict[str, object]):
    """The audit config of ``implementation``'s task from ``profile``, with the overrides it knows; a
    setting that no audit knows is a ``ValueError`` naming it."""
    from dpverify.config import OVERRIDABLE, profile_config
    from dpverify.audits.language import LANGUAGE_SETTINGS, language_config_like

    unknown = sorted(set(overrides) - set(OVERRIDABLE) - set(LANGUAGE_SETTINGS))
    if unknown:
        raise ValueError(f"unknown audit setting(s) {', '.join(unknown)}; known: {', '.join(sorted(set(OVERRIDABLE) | set(LANGUAGE_SETTINGS)))}")
    if implementation.info.task == "language":
        config = language_config_like(profile_config(profile))
        return config.with_overrides(**{k: v for k, v in overrides.items() if k in LANGUAGE_SETTINGS})
    return profile_config(profile, **{k: v for k, v in overrides.items() if k in OVERRIDABLE})
