"""``dpverify``: audits, the registry and the bound from the command line, outside pytest."""

from __future__ import annotations

import argparse
import codecs
import collections
import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from dpverify import __version__
from dpverify.config import DESIGNS, DEVICES, PROFILE_NAMES, PROFILES, parse_settings
from dpverify.execution import EXECUTORS, ExecutorSpec
from dpverify.progress import ProgressLine, StreamDisplay
from dpverify.session import EXCLUDE
from dpverify.workers import JOB_VARIABLE, confine_jax_worker

#: The target ε when neither ``--epsilon`` nor ``--set noise_multiplier=`` is given.
DEFAULT_EPSILON = 2.0
#: Exit status of a run stopped by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130
#: Measured seconds per audit on a quiet 2-core CPU, for ``--profile``'s help (benchmarks/results/main-job.md,
#: profiles-standard.md); each profile's size comes from its config.
PROFILE_SECONDS = {
    "quick": "about 1 s per audit for Opacus ghost and the reference, 2-6 s for opacus-hooks and TF-Privacy on a 2-core CPU",
    "standard": "21-30 s for opacus-ghost (profiles-standard.md), about 95 s for TF-Privacy Keras on a 2-core CPU",
    "gpu": "wants a GPU",
    "mlp": "UniAud's MLP, for models with hidden layers",
    "paper": "the paper's setting, wants a GPU",
}


def _profile_help() -> str:
    parts = []
    for name, config in PROFILES.items():
        runs = f" in {config.pooled_runs} pooled runs" if config.pooled_runs > 1 else ""
        parts.append(f"{name}: m = {config.canaries.m} {config.canaries.mode} canaries{runs}, {PROFILE_SECONDS[name]}")
    return "; ".join(parts) + " (quick is what CI runs)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpverify", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dpverify {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    registers = argparse.ArgumentParser(add_help=False)
    registers.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a dotted name, or a path to a .py file such as tests/conftest.py) first, so that "
        "its register_implementation calls register; repeatable",
    )

    audit = commands.add_parser(
        "audit", parents=[registers], help="audit registered implementations (the level is shared among them)"
    )
    audit.add_argument(
        "names",
        nargs="*",
        help=f"implementation names or glob patterns (see `dpverify list`); a pattern after {EXCLUDE} leaves out "
        f"the names it matches (quote it from the shell: '*' '{EXCLUDE}jax-privacy-keras-no*', or --all "
        f"'{EXCLUDE}opacus-lm*')",
    )
    audit.add_argument("--all", action="store_true", help="audit every registered, available implementation")
    audit.add_argument("--profile", choices=PROFILE_NAMES, default="quick", help=_profile_help())
    audit.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help=f"target ε to calibrate to, > 0 (inf: non-private; default {DEFAULT_EPSILON:g} unless "
        "--set noise_multiplier=SIGMA gives the noise instead, or --design two_world, whose world designates it)",
    )
    audit.add_argument(
        "--design",
        choices=DESIGNS,
        default=None,
        help="inclusion or pair (synthetic canaries); multitask (UniAud++), in_distribution or mislabeled "
        "(real data, report test accuracy; need pip install 'dpverify[data]'); two_world (many runs on two "
        "crafted neighbouring datasets: --set world=, runs=, records=, outputs=, relation=). Language models take "
        "inclusion or pair",
    )
    audit.add_argument(
        "--worlds",
        default=None,
        metavar="WORLDS",
        help="the two-world (many-run) audits run beside each one-run audit: applicable (every crafted world "
        "that applies to the implementation, see `dpverify list`), none, or comma-separated world names "
        "(default: applicable; none when --design is given)",
    )
    audit.add_argument(
        "--every-update",
        choices=("on", "off"),
        default=None,
        help="the every-update audit run beside each classifier's one-run audit: its adversary sees the "
        "parameters after every step and tests a claim at q < 1 at its own curve (default: on; off when "
        "--design is given)",
    )
    audit.add_argument(
        "--layers",
        default=None,
        choices=("applicable", "none"),
        help="the layer-design audits run beside each one-run audit: applicable (each layer type the "
        "implementation trains, see `dpverify list`) or none (default: applicable; none when --design is given)",
    )
    audit.add_argument("--m", type=int, default=None, help="number of canaries (audit records of a data design), >= 1")
    audit.add_argument("--epochs", type=int, default=None, help=">= 1")
    audit.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other audit setting, as a marker keyword (e.g. --set num_tags=50, --set prefix_length=8); "
        "VALUE is a Python literal. Each implementation takes the settings its audit knows",
    )
    audit.add_argument(
        "--confidence", type=float, default=0.95, help="confidence for all audits of this run together, in (0, 1)"
    )
    audit.add_argument("--seed", type=int, default=0, help=">= 0")
    audit.add_argument("--device", choices=DEVICES, default="auto")
    audit.add_argument(
        "--report",
        metavar="PATH",
        help="write the JSON report (the pytest plugin's shape); rewritten after every audit, so an "
        "interrupted run keeps what it finished",
    )
    audit.add_argument("--plots", metavar="DIR", help="write per-audit PNG plots (needs matplotlib)")
    audit.add_argument(
        "--compare",
        metavar="BASELINE.json",
        help="compare the audits with a saved report (an earlier run's --report): baseline and now side by side, "
        "and a flag where an audit's rate of correct guesses rose significantly (Fisher's exact test at the "
        "run's level split over the compared audits)",
    )
    audit.add_argument("--compare-fail", action="store_true", help="exit 1 when --compare finds a significant rise")
    audit.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help="where an audit's independent runs train (a two-world audit's, pooled runs): inprocess, pool (local worker "
        "processes) or ray (a Ray cluster; pip install 'dpverify[ray]'); results are the same by seed "
        "(default: inprocess, or pool with --workers)",
    )
    audit.add_argument("--workers", type=int, default=None, help="processes of the pool (CPUs of a local Ray cluster), >= 1")
    audit.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="audit in this many processes in all, >= 1, shared among the environments (--env) in proportion to "
        "their audits, at least one each: each deals its implementations among its processes and their audits "
        "run side by side (one table, one report, one level; the same results as in one process)",
    )
    audit.add_argument("--ray-address", metavar="ADDRESS", help="a running Ray cluster: auto, or ray://HOST:10001")
    audit.add_argument(
        "--env",
        dest="envs",
        action="append",
        default=[],
        metavar="PATH",
        help="another Python environment (a virtual environment's directory, or its python) that audits, in a "
        "process of its own, the selected implementations this one cannot run: a family of DP libraries that "
        "cannot share this environment, such as .venvs/jax for JAX-Privacy (made by bash scripts/setup.sh). "
        "Its audits join this run's table and report and take their share of its level; repeatable",
    )
    audit.add_argument(
        "--plan",
        action="store_true",
        help="print the audits this run would make, as JSON (each with whether it can run here), and exit "
        "without training (what --env asks another environment)",
    )
    audit.add_argument(
        "--planned-audits",
        type=int,
        default=None,
        metavar="N",
        help="split the level over N audits that can raise a false alarm instead of this run's own count: a run "
        "that is part of a larger session (--env starts its runs so); at least this run's own count",
    )

    listing = commands.add_parser(
        "list", parents=[registers], help="registered implementations, their library versions and availability"
    )
    listing.add_argument("--json", action="store_true", help="print a JSON list instead of the table")

    bound = commands.add_parser("bound", help="ε lower bound from counts (Steinke, Nasr & Jagielski 2023)")
    bound.add_argument("--m", type=int, required=True, help="number of canaries, >= 1")
    bound.add_argument("--guesses", type=int, required=True, help="guesses the audit made, in [0, m]")
    bound.add_argument("--correct", type=int, required=True, help="correct guesses, in [0, guesses]")
    bound.add_argument("--delta", type=float, default=1e-5, help="δ the claim holds at, in (0, 1) (default %(default)g)")
    bound.add_argument("--confidence", type=float, default=0.95, help="confidence of the bound, in (0, 1) (default %(default)g)")
    return parser


#: ``(command, option, test, what a good value is)``: every number is checked before anything runs, and
#: the message names the option as the user typed it (not the config field it becomes).
OPTION_CHECKS: tuple[tuple[str, str, Callable[[Any], bool], str], ...] = (
    ("audit", "--epsilon", lambda v: v > 0, "> 0 (or inf)"),
    ("audit", "--m", lambda v: v >= 1, ">= 1"),
    ("audit", "--epochs", lambda v: v >= 1, ">= 1"),
    ("audit", "--confidence", lambda v: 0 < v < 1, "in (0, 1)"),
    ("audit", "--seed", lambda v: v >= 0, ">= 0"),
    ("audit", "--workers", lambda v: v >= 1, "an integer >= 1"),
    ("audit", "--jobs", lambda v: v >= 1, "an integer >= 1"),
    ("audit", "--planned-audits", lambda v: v >= 0, ">= 0"),
    ("bound", "--m", lambda v: v >= 1, ">= 1"),
    ("bound", "--delta", lambda v: 0 < v < 1, "in (0, 1)"),
    ("bound", "--confidence", lambda v: 0 < v < 1, "in (0, 1)"),
)


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` (exit 2) for the first option out of its range, and for ``--all`` with names."""
    for command, option, good, allowed in OPTION_CHECKS:
        value = getattr(args, option.lstrip("-").replace("-", "_"), None) if args.command == command else None
        if value is not None and not good(value):
            parser.error(f"{option} must be {allowed}, got {value:g}")
    if args.command == "audit" and args.compare_fail and not args.compare:
        parser.error("--compare-fail fails the run on a significant rise since a baseline; give the baseline with --compare")
    if args.command == "audit" and args.all and not all(name.startswith(EXCLUDE) for name in args.names):
        parser.error(
            f"--all audits every registered implementation; give names ({' '.join(args.names)}) or --all, not both "
            f"(--all takes only exclusions, e.g. '{EXCLUDE}opacus-lm*')"
        )
    if args.command == "audit" and args.plan and args.envs:
        parser.error("--plan prints this environment's audits; give it without --env")


def main(argv: Sequence[str] | None = None) -> int:
    _survive_any_terminal()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    _check_options(parser, args)
    try:
        if args.command == "audit":
            return _audit(args, command=shlex.join(["dpverify", *argv]))
        return {"list": _list, "bound": _bound}[args.command](args)
    except ValueError as exc:
        print(f"dpverify: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dpverify list | head`: the reader left; say nothing more to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _ascii_fallback(error: UnicodeError) -> tuple[str, int]:
    """Codec error handler: what the stream cannot encode, in ASCII."""
    from dpverify.session import to_ascii

    if not isinstance(error, UnicodeEncodeError):
        raise error
    return to_ascii(error.object[error.start : error.end]), error.end


def _can_show(stream: TextIO, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _survive_any_terminal() -> None:
    """Let stdout and stderr print on a terminal of any encoding (cp1252, ascii): a symbol the terminal
    cannot show is written in ASCII ('ε' as 'eps', '∞' as 'inf') instead of crashing the run."""
    codecs.register_error("dpverify-ascii", _ascii_fallback)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="dpverify-ascii")


def _bound(args: argparse.Namespace) -> int:
    from dpverify.stats.bounds import epsilon_lower_bound, optimal_epsilon

    kwargs = dict(delta=args.delta, confidence=args.confidence)
    epsilon = epsilon_lower_bound(args.m, args.guesses, args.correct, **kwargs)
    print(f"epsilon_lower_bound = {epsilon:.6f}  (optimal for m={args.m}: {optimal_epsilon(args.m, **kwargs):.6f})")
    return 0


def _list(args: argparse.Namespace) -> int:
    from dpverify.gate import gate_audits
    from dpverify.registry import registered_implementations

    _import_all(args.imports)
    implementations = registered_implementations()
    worlds: dict[str, list[str]] = {}  # what the default gate of them all runs (a sampler's world once)
    for audit in gate_audits([implementation.info for implementation in implementations]):
        if audit.world is not None:
            worlds.setdefault(audit.implementation_name, []).append(audit.world)
    rows = []
    for implementation in implementations:
        info = implementation.info
        reason = implementation.unavailable_reason()
        rows.append(
            {
                "name": info.name,
                "task": info.task,
                "library": info.library,
                "version": implementation.library_version(),
                "available": reason is None,
                "unavailable_reason": reason,
                "expected": info.expected,
                "detectability": info.detectability,
                "bug": info.bug,
                "bug_reference": info.bug_reference,
                "breaks": info.breaks,
                "issue": info.issue,
                "two_world_worlds": worlds.get(info.name, []),
                "sampler": info.sampler,
                "layers": list(info.layers),
                "layer_issues": dict(info.layer_issues),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "task", "library", "version", "status", "expected", "two-world worlds", "layers", "bug class", "what it breaks")
    table = [header] + [
        (
            row["name"],
            row["task"],
            row["library"],
            row["version"] or "not installed",
            "available" if row["available"] else f"unavailable: {row['unavailable_reason']}",
            _expectation(row),
            ",".join(row["two_world_worlds"]) or "-",
            ",".join(row["layers"]) or "-",
            row["bug_reference"] or "-",
            row["breaks"] or "-",
        )
        for row in rows
    ]
    # Every column but the last (free text) is padded to its widest cell.
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    for line in table:
        print("  ".join([cell.ljust(width) for cell, width in zip(line, widths)] + [line[-1]]))
    return 0


def _expectation(row: dict[str, Any]) -> str:
    """What a listed implementation is expected to do, as the table says it."""
    if row["expected"] == "known-issue":
        return f"known issue {row['issue']}"
    if row["expected"] == "violation":
        return f"buggy variant, {row['detectability']}"
    return "; ".join(["private", *(f"known issue {issue} in {layer}" for layer, issue in row["layer_issues"].items())])


#: The ``audit`` options a run in another environment (``--env``) takes from this one: everything that
#: decides an audit. The others are this run's alone (what to audit, where the report goes, the comparison;
#: ``--jobs``, of which each environment is given its share).
FORWARDED_OPTIONS: tuple[tuple[str, str], ...] = (
    ("imports", "--import"), ("profile", "--profile"), ("epsilon", "--epsilon"), ("design", "--design"),
    ("worlds", "--worlds"), ("every_update", "--every-update"), ("layers", "--layers"), ("m", "--m"), ("epochs", "--epochs"), ("settings", "--set"),
    ("confidence", "--confidence"), ("seed", "--seed"), ("device", "--device"), ("plots", "--plots"),
    ("executor", "--executor"), ("workers", "--workers"), ("ray_address", "--ray-address"),
)  # fmt: skip


def forwarded_options(args: argparse.Namespace) -> list[str]:
    """:data:`FORWARDED_OPTIONS` as this run was given them, spelled for another run's command line."""
    argv: list[str] = []
    for dest, flag in FORWARDED_OPTIONS:
        value = getattr(args, dest)
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                argv += [flag, repr(item) if isinstance(item, float) else str(item)]
    return argv


def _audit(args: argparse.Namespace, *, command: str) -> int:
    from dpverify.audits import auditor_failure, run_audit
    from dpverify.environments import Environment, delegate, finish_delegation, plan_entry, share_jobs, start_delegation
    from dpverify.registry import registered_implementations
    from dpverify.releases import environment_for
    from dpverify.session import AuditSession, audit_entry, outcome_as_expected, with_plots

    if not args.names and not args.all:
        raise ValueError("name at least one implementation (see `dpverify list`) or pass --all")
    _import_all(args.imports)
    overrides = _overrides(args)
    session = AuditSession(
        enabled=True,
        profile=args.profile,
        confidence=args.confidence,
        seed=args.seed,
        device=args.device,
        epsilon=overrides.get("epsilon", float("nan")),
        implementations=("*", *args.names) if args.all else tuple(args.names),  # --all takes only exclusions
        report_path=args.report,
        plots_dir=args.plots,
        command=command,
        executor=ExecutorSpec(executor=args.executor, workers=args.workers, ray_address=args.ray_address),
        settings=overrides,
        worlds=_worlds(args),
        every_update=_every_update(args),
        # A run that asks for one design (--design) gets that design only: no worlds or layers unless asked.
        layers="applicable" if args.layers == "applicable" or (args.layers is None and args.design is None) else "none",
    )
    environments = [Environment.at(path) for path in args.envs]
    chosen = [impl for impl in registered_implementations() if session.selected(impl.info.name)]
    delegations = delegate(
        environments,
        [*(["--all"] if args.all else []), *args.names, *forwarded_options(args)],
        runnable_here={impl.info.name for impl in chosen if impl.unavailable_reason() is None},
    )
    delegated = {name for delegation in delegations for name in delegation.names}
    chosen = [impl for impl in chosen if impl.info.name not in delegated]
    if not chosen and not delegations and not args.plan:
        raise ValueError(f"no registered implementation matches {', '.join(args.names)}; see `dpverify list`")
    audits = session.gate_audits([impl.info for impl in chosen])
    # As in the plugin: only audits of implementations expected to be private can raise a false alarm,
    # here and in the other environments alike: one level for the whole session.
    counted = sum(audit.counted for audit in audits) + sum(delegation.counted for delegation in delegations)
    if args.planned_audits is not None and args.planned_audits < counted:
        raise ValueError(f"--planned-audits must be at least this run's {counted} counted audit(s), got {args.planned_audits}")
    session.planned_audits = counted if args.planned_audits is None else args.planned_audits
    plan = _plan(audits, overrides, session)
    _refuse_undecidable(plan)
    if args.plan:
        entries = [plan_entry(audit, implementation, config, nodeid=_nodeid(audit)) for audit, implementation, config in plan]
        print(json.dumps({"planned_audits": session.planned_audits, "audits": entries}, indent=2))
        return 0
    session.load_baseline(args.compare, option="--compare")
    _check_outputs(session)
    print(session.header(rerun=f"--seed {session.seed}"), file=sys.stderr)
    progress = None
    here, *elsewhere = share_jobs(args.jobs, [len(plan), *(len(delegation.planned) for delegation in delegations)])
    plan, shared = _share_among_jobs(plan, here)
    if shared:  # this process is job 0 of its environment's (dpverify.workers)
        os.environ.setdefault(JOB_VARIABLE, "0")
    confine_jax_worker(session.executor.kind)  # a --jobs worker, before its first audit starts XLA
    argv = forwarded_options(args)
    running = [
        start_delegation(delegation, [*argv, "--jobs", str(jobs)], session=session)
        for delegation, jobs in zip(delegations, elsewhere)
    ]
    running += [
        start_delegation(delegation, [*argv, "--jobs", "1"], session=session, job=job)
        for job, delegation in enumerate(shared, start=1)
    ]
    delegations = [*delegations, *shared]
    try:
        for index, (audit, implementation, config) in enumerate(plan, start=1):
            label = f"[{index}/{len(plan)}] {_audit_name(audit)}"
            reason = implementation.unavailable_reason()
            if reason:
                environment = environment_for(implementation.info.extra)
                print(f"{label}: skipped: {reason}" + (f" (or add --env {environment})" if environment else ""), file=sys.stderr)
                continue
            progress = ProgressLine(label, StreamDisplay(sys.stderr))
            started = time.perf_counter()
            try:
                result = run_audit(
                    implementation, config, progress=progress.stage, step_progress=progress.step, executor=session.executor_for_audits()
                )
            except ValueError:  # a setting the audit cannot take: the run's input, named (exit 2)
                raise
            except Exception as exc:  # the audit's own failure ends this audit as an error, not the session
                result = auditor_failure(implementation, config, exc, seconds=time.perf_counter() - started)
            progress.finish(result.headline())
            if args.plots:
                result = with_plots(result, args.plots)
            session.results.append(audit_entry(result, implementation, nodeid=_nodeid(audit), counted=audit.counted))
            _write_partial_report(session)
        while running:
            finish_delegation(running.pop(0), session=session)
            _write_partial_report(session)
    except KeyboardInterrupt:
        if progress is not None:
            progress.finish("interrupted")
        while running:  # the other environments saw the Ctrl-C too: keep what their reports hold
            with contextlib.suppress(KeyboardInterrupt):
                finish_delegation(running.pop(0), session=session)
        total = len(plan) + sum(len(delegation.planned) for delegation in delegations)
        print(
            f"dpverify: interrupted; {len(session.results)} of {total} audit(s) finished, "
            "the table and the report hold only those",
            file=sys.stderr,
        )
        _conclude(session, stopped="interrupted")
        return INTERRUPTED
    finally:
        for orphan in running:  # an error here ended the session: stop the audits it started elsewhere
            orphan.process.kill()
            orphan.process.wait()
            orphan.directory.cleanup()
        session.close()
    comparison = session.compare()
    _conclude(session)
    risen = _show_comparison(comparison)
    unexpected = [r for r in session.results if not outcome_as_expected(r)]
    for r in unexpected:
        print(f"unexpected: {r['implementation']} {r['verdict']}" + (f": {r['error']}" if r["error"] else ""))
    if risen and args.compare_fail:
        print(f"{risen} significant rise(s) since the baseline: --compare-fail fails the run")
    return 1 if unexpected or (risen and args.compare_fail) else 0


def _share_among_jobs(plan: list[tuple[Any, Any, Any]], jobs: int) -> tuple[list[tuple[Any, Any, Any]], list[Any]]:
    """``--jobs``: this environment's runnable implementations dealt into ``jobs`` hands of about equal audit
    counts (:func:`~dpverify.environments.deal`); the audits of the first (and of the implementations that
    cannot run here, to say so) stay in this process, each other hand is delegated to a process of this
    environment's own Python, which audits it as an ``--env`` run would."""
    from dpverify.environments import Delegation, deal, plan_entry, this_environment

    runnable = collections.Counter(audit.implementation_name for audit, impl, _ in plan if impl.unavailable_reason() is None)
    samplers = {impl.info.name: impl.info.sampler for _, impl, _ in plan}
    _, *others = deal(list(runnable), jobs, audits=runnable, together=samplers) or [()]
    shared = [
        Delegation(
            environment=this_environment(),
            names=hand,
            planned=tuple(plan_entry(a, i, c, nodeid=_nodeid(a)) for a, i, c in plan if a.implementation_name in hand),
        )
        for hand in others
    ]
    elsewhere = {name for hand in others for name in hand}
    return [entry for entry in plan if entry[0].implementation_name not in elsewhere], shared


def _show_comparison(comparison: Any) -> int:
    """Print the comparison after the table; how many audits rose significantly."""
    if comparison is None:
        return 0
    from dpverify.session import to_ascii

    text = "\n".join(["comparison with the baseline:", *comparison.lines()])
    print(text if _can_show(sys.stdout, "ε→") else to_ascii(text))
    return len(comparison.risen)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    """The audit settings the options give: ``--design``, ``--m``, ``--epochs``, every ``--set`` and one
    privacy target (``--epsilon``, ``--set epsilon=`` or ``--set noise_multiplier=``; two are an error,
    none means ε = 2, but for ``--design two_world``, whose world designates its σ)."""
    overrides = {k: v for k, v in (("design", args.design), ("m", args.m), ("epochs", args.epochs)) if v is not None}
    try:
        overrides.update(parse_settings(args.settings))
    except ValueError as exc:
        raise ValueError(f"--set: {exc}") from None
    targets = ["--epsilon"] * (args.epsilon is not None) + [
        f"--set {name}" for name in ("epsilon", "noise_multiplier") if name in overrides
    ]
    if len(targets) > 1:
        raise ValueError(f"give one privacy target, got {' and '.join(targets)}")
    if args.epsilon is not None or not (targets or overrides.get("design") == "two_world"):
        overrides["epsilon"] = DEFAULT_EPSILON if args.epsilon is None else args.epsilon
    return overrides


def _import_all(targets: Sequence[str]) -> None:
    """Import each ``--import`` target, a dotted module name or a path to a .py file, so that its
    ``register_implementation`` calls register. As pytest does for a conftest, the working directory and
    a file's own directory are importable."""
    import importlib
    import importlib.util

    if targets and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for target in targets:
        try:
            if target.endswith(".py"):
                path = Path(target).resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no file {path}")
                sys.path.insert(0, str(path.parent))
                spec = importlib.util.spec_from_file_location(f"dpverify_imported.{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(target)
        except Exception as exc:
            raise ValueError(f"--import {target} failed: {type(exc).__name__}: {exc}") from exc


def _worlds(args: argparse.Namespace) -> str | tuple[str, ...]:
    """``--worlds`` as :func:`dpverify.gate.gate_audits` takes it: a word or world names; by default every
    world that applies, none when ``--design`` asks for one design."""
    if args.worlds is None:
        return "none" if args.design is not None else "applicable"
    text = args.worlds.strip()
    return text if text in ("applicable", "none") else tuple(name.strip() for name in text.split(",") if name.strip())


def _every_update(args: argparse.Namespace) -> bool:
    """``--every-update``: on by default, off when ``--design`` asks for one design."""
    return args.design is None if args.every_update is None else args.every_update == "on"


def _nodeid(audit: Any) -> str:
    """What the report calls an audit run from the command line (``dpverify audit <name>``)."""
    return f"dpverify audit {_audit_name(audit)}"


def _audit_name(audit: Any) -> str:
    """An audit as the table and the progress lines name it: the implementation, and the every-update audit,
    the world or the layer if any."""
    if audit.every_update:
        return f"{audit.implementation_name} every-update"
    if audit.layer is not None:
        return f"{audit.implementation_name} layer {audit.layer}"
    return audit.implementation_name if audit.world is None else f"{audit.implementation_name} two-world {audit.world}"


def _plan(audits: list[Any], overrides: dict[str, object], session: Any) -> list[tuple[Any, Any, Any]]:
    """``(gate audit, implementation, audit config)`` for every planned audit, all built (and so checked)
    before the first audit runs: a setting one of them cannot take fails in a second, not after minutes
    of audits. A two-world, every-update or layer audit of the gate takes, of the settings, only those its
    design lets change."""
    from dpverify.registry import get_implementation

    plan = []
    for audit in audits:
        implementation = get_implementation(audit.implementation_name)
        try:
            config = session.gate_config(audit, one_run=lambda: _config_for(implementation, session.profile, overrides))
            config = config.with_overrides(
                device=session.device,
                seed=session.audit_seed(audit.seed_key),
                confidence=session.per_audit_confidence,
            )
        except ValueError as exc:
            raise ValueError(f"{_audit_name(audit)}: {exc}") from exc
        plan.append((audit, implementation.audited_in(config.architecture), config))
    return plan


def _refuse_undecidable(plan: list[tuple[Any, Any, Any]]) -> None:
    """Refuse, before any training, every audit this environment would run that could only end undecided
    (:func:`dpverify.audits.undecidable`), naming the option that would make it decide. An implementation
    that cannot run here is skipped or runs in another environment (``--env``), which checks it."""
    from dpverify.audits import undecidable

    refused = []
    for audit, implementation, config in plan:
        refusal = None if implementation.unavailable_reason() else undecidable(implementation, config)
        if refusal is not None:
            spelled = "--m " if refusal.setting == "m" else f"--set {refusal.setting}="
            refused.append(f"{_audit_name(audit)}: {refusal.message(spelled=spelled)}")
    if refused:
        raise ValueError("refusing audits that can decide nothing:\n  " + "\n  ".join(refused))


def _check_outputs(session: Any) -> None:
    """Fail at once, not after every audit, when the report or the plots cannot be written
    (:func:`~dpverify._validation.check_writable`); the report is then written now (empty,
    ``complete: false``)."""
    from dpverify._validation import check_writable

    if session.plots_dir:
        try:
            import dpverify.plots  # noqa: F401  (needs matplotlib)
        except ImportError as exc:
            raise ValueError(f"--plots needs matplotlib ({exc}): pip install 'dpverify[plots]'") from exc
    for option, path, directory in (("--report", session.report_path, False), ("--plots", session.plots_dir, True)):
        try:
            if path:
                check_writable(path, directory=directory)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    session.write_report(complete=False)


def _write_partial_report(session: Any) -> None:
    """Rewrite the report after an audit; should that fail, say so and go on: the audits still run, their
    verdicts reach the table, and the final report is written (or fails) at the end."""
    try:
        session.write_report(complete=False)
    except Exception as exc:
        print(f"dpverify: warning: the report could not be rewritten after an audit: {type(exc).__name__}: {exc}", file=sys.stderr)


def _conclude(session: Any, *, stopped: str | None = None) -> None:
    """The table on stdout and the report on disk; ``stopped`` says why a run ended early (interrupted)."""
    print("\n".join(session.summary_lines(ascii=not _can_show(sys.stdout, "ε∞"))))
    path = session.write_report(stopped=stopped)
    if path is not None:
        print(f"JSON report: {path}" + (f" (incomplete: {stopped})" if stopped else ""))


def _config_for(implementation, profile: str, overrides: dict[str, object]):
    """The audit config of ``implementation``'s task from ``profile``, with the overrides it knows; a
    setting that no audit knows, or a design its task cannot take, is a ``ValueError`` naming it."""
    from dpverify.audits.language import LANGUAGE_DESIGNS, LANGUAGE_SETTINGS, language_config_like
    from dpverify.config import OVERRIDABLE, profile_config

    unknown = sorted(set(overrides) - set(OVERRIDABLE) - set(LANGUAGE_SETTINGS))
    if unknown:
        raise ValueError(f"unknown audit setting(s) {', '.join(unknown)}; known: {', '.join(sorted(set(OVERRIDABLE) | set(LANGUAGE_SETTINGS)))}")
    if implementation.info.task == "language":
        design = overrides.get("design", LANGUAGE_DESIGNS[0])
        if design not in LANGUAGE_DESIGNS:
            raise ValueError(
                f"a language model takes the designs {', '.join(LANGUAGE_DESIGNS)}, not --design {design}; "
                "audit it in a run of its own"
            )
        config = language_config_like(profile_config(profile))
        return config.with_overrides(**{k: v for k, v in overrides.items() if k in LANGUAGE_SETTINGS})
    return profile_config(profile, **{k: v for k, v in overrides.items() if k in OVERRIDABLE})


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
