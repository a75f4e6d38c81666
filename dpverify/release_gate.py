"""The release gate, run inside one release's environment (``nox -s release``): the quick audits of the
library's implementations, then the release's facts added to the report. Apart from :mod:`dpverify.releases`,
which describes the releases and must stay stdlib-only and free of the audit machinery (the noxfile imports
it before any environment exists, and the contract reads its environments).

``python -m dpverify.release_gate SPEC [dpverify audit arguments]``.
"""

from __future__ import annotations

from dpverify.releases import Release, release_from_command_line

__all__ = ["NOT_APPLICABLE", "gate", "record_release"]


#: How an implementation says the installed release has no such path (its ``unavailable_reason``).
NOT_APPLICABLE = "n/a: "


def gate(release: Release, argv: list[str]) -> int:
    """The release gate, run inside the release's environment: ``dpverify audit`` of the library's
    implementations at the quick profile (``argv`` added, ``--report`` defaulting to :attr:`Release.report`),
    then :func:`record_release`. Exit status: the audit's (non-zero when a correct path is refuted without a
    recorded finding or an audit errors), or 1 when an implementation cannot run for a reason other than a
    path the release lacks (the library missing from the environment)."""
    from dpverify.cli import main as audit_main

    report = argv[argv.index("--report") + 1] if "--report" in argv else release.report
    status = audit_main(["audit", release.library.implementations, "--profile", "quick", *argv, *([] if "--report" in argv else ["--report", report])])
    broken = record_release(release, report)
    if broken:
        print(f"{len(broken)} implementation(s) of {release.spec} could not run: {', '.join(broken)}")
    return 1 if broken else status


def record_release(release: Release, report: str) -> list[str]:
    """Print each implementation whose path the installed release lacks as an ``n/a`` line with its reason,
    and add to ``report`` the release and installed version (``release``), those paths
    (``not_applicable``) and each known issue's address (``issues``). Returns the implementations that
    cannot run here for another reason."""
    import fnmatch
    import json
    from importlib import metadata

    from dpverify.registry import registered_implementations

    pattern = release.library.implementations
    chosen = [impl for impl in registered_implementations() if fnmatch.fnmatchcase(impl.info.name, pattern)]
    skipped = [(impl.info.name, reason) for impl in chosen if (reason := impl.unavailable_reason())]
    for name, reason in skipped:
        print(f"{name}: {reason}")
    broken = [name for name, reason in skipped if not reason.startswith(NOT_APPLICABLE)]
    with open(report, encoding="utf-8") as stream:
        data = json.load(stream)
    data["release"] = {"spec": release.spec, "installed": metadata.version(release.library.package)}
    data["issues"] = {impl.info.name: impl.info.issue for impl in chosen if impl.info.issue}
    data["not_applicable"] = [
        {"implementation": name, "reason": reason.removeprefix(NOT_APPLICABLE)} for name, reason in skipped if name not in broken
    ]
    with open(report, "w", encoding="utf-8") as stream:
        json.dump(data, stream, indent=2, allow_nan=False)
        stream.write("\n")
    return broken


def main(argv: list[str] | None = None) -> int:
    """``python -m dpverify.release_gate SPEC [dpverify audit arguments]``: :func:`gate`, or the error and
    exit 2."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    release = release_from_command_line(args, "dpverify.release_gate", " [dpverify audit arguments]")
    return 2 if release is None else gate(release, args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
