"""The releases of each DP library that dpverify supports and gates, one environment each (issue 30).

``pyproject.toml``'s extras declare these ranges; ``nox -s release`` makes an environment per release
(``.venvs/release-<package>-<version>``, the family's environment with that release, and any pins of its
own, in place of the pinned ones) and audits the library's implementations there; ``bash
scripts/release.sh PACKAGE==VERSION`` does it for one. Framework-free and stdlib-only: the noxfile imports it before any environment exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LIBRARIES", "Finding", "Library", "Release", "installed_release", "parse_release", "parse_version", "releases"]


@dataclass(frozen=True)
class Library:
    """A DP library: its package on the index, the family environment it joins (noxfile.py), the
    constraints file that pins its other packages, its implementations' name pattern, its releases, and
    ``pins``: for a release the family's constraints do not fit, what is installed with it in place of the
    family's pins of those packages (``(version, ("jax==0.6.2", ...))``)."""

    package: str
    family: str
    constraints: str
    implementations: str
    versions: tuple[str, ...]
    pins: tuple[tuple[str, tuple[str, ...]], ...] = ()


#: Every release in the declared ranges. Opacus: all releases 1.4.0–1.6.0 (1.5 is the index's name of 1.5.0).
#: TF-Privacy: 0.8.12 (with tf-models-official 2.15.0 and tensorflow-text 2.15.0, which its pin ~= 2.13 lets
#: pip choose beside TF 2.15) and 0.9.0. 0.8.11 and earlier pin tensorflow-probability ~= 0.20.0 (built for
#: TF 2.12), which the family's 0.22.1 excludes.
#: JAX-Privacy: 1.0.0 and 2.0.0 (the plugin resolves their calls in ``dpverify_jaxprivacy/_api.py``). 1.0.0's
#: wheel pins jax and jaxlib 0.6.2 and more-itertools 10.1.0, imports chex without declaring it (0.1.90: the
#: last chex for jax < 0.7) and its Keras API calls a Keras-internal method (``_enforce_jax_state_sharding``)
#: that Keras 3.12 removed, so its environment has those pins and Keras 3.11.3 in place of the family's.
LIBRARIES: tuple[Library, ...] = (
    Library(
        package="opacus",
        family="torch",
        constraints="constraints.txt",
        implementations="opacus-*",
        versions=("1.4.0", "1.4.1", "1.5", "1.5.1", "1.5.2", "1.5.3", "1.5.4", "1.6.0"),
    ),
    Library(
        package="tensorflow-privacy",
        family="torch",
        constraints="constraints.txt",
        implementations="tf-privacy-*",
        versions=("0.8.12", "0.9.0"),
    ),
    Library(
        package="jax-privacy",
        family="jax",
        constraints="constraints-jax.txt",
        implementations="jax-privacy-*",
        versions=("1.0.0", "2.0.0"),
        pins=(("1.0.0", ("jax==0.6.2", "jaxlib==0.6.2", "more-itertools==10.1.0", "chex==0.1.90", "keras==3.11.3")),),
    ),
)

@dataclass(frozen=True)
class Finding:
    """A leak in unmodified releases ``[first, fixed)`` of one library: the upstream report or fix, and what
    it is. A plugin makes the path it holds for ``known-issue`` on those releases only."""

    issue: str
    first: tuple[int, ...]
    fixed: tuple[int, ...]
    summary: str

    def applies(self, version: tuple[int, ...] | None) -> bool:
        return version is not None and self.first <= version < self.fixed

    def at(self, version: tuple[int, ...] | None) -> Finding | None:
        """This finding where it holds for release ``version`` (``None``: not installed), else ``None``: what a
        plugin makes its path a known issue for."""
        return self if self.applies(version) else None


def parse_version(text: str) -> tuple[int, ...]:
    """``"1.5.2"`` → ``(1, 5, 2)``, trailing zeros dropped (``"1.5.0"`` and ``"1.5"`` are one release); a
    local or pre-release suffix is ignored."""
    match = re.match(r"^\s*(\d+(?:\.\d+)*)", text or "")
    if match is None:
        raise ValueError(f"not a release number: {text!r}")
    parts = [int(part) for part in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def installed_release(package: str) -> tuple[int, ...] | None:
    """The installed release of ``package`` (:func:`parse_version`), or ``None`` when it is not installed."""
    from importlib import metadata

    try:
        return parse_version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return None


_SPEC = re.compile(r"^(?P<package>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[0-9][0-9A-Za-z.]*)$")


@dataclass(frozen=True)
class Release:
    """One release of one library: what ``nox`` and ``scripts/release.sh`` need to build and gate it."""

    library: Library
    version: str

    @property
    def spec(self) -> str:
        """``package==version``, as pip takes it and as the nox session is parametrised."""
        return f"{self.library.package}=={self.version}"

    @property
    def session(self) -> str:
        """The nox session that makes this release's environment: ``release(<spec>)``."""
        return f"release({self.spec})"

    @property
    def envdir(self) -> str:
        """Where nox puts that environment (its normalisation of the session's name)."""
        return ".venvs/release-" + re.sub(r"[^A-Za-z0-9]+", "-", self.spec).strip("-").lower()

    @property
    def report(self) -> str:
        """The default report's file name: ``release-<package>-<version>.json``."""
        return f"release-{self.library.package}-{self.version}.json"

    @property
    def requirements(self) -> tuple[str, ...]:
        """What pip installs beside the family's packages: :attr:`spec` and the release's own pins
        (:attr:`Library.pins`; mostly none)."""
        return (self.spec, *dict(self.library.pins).get(self.version, ()))

    def constraints(self, text: str) -> str:
        """``text`` (the family's constraints file) without the lines that pin a package of
        :attr:`requirements`, so that they can be installed in their place."""
        replaced = {_pinned_name(requirement) for requirement in self.requirements}
        kept = [line for line in text.splitlines() if _pinned_name(line) not in replaced]
        return "\n".join(kept) + "\n"


def _pinned_name(line: str) -> str | None:
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*[=<>~!]", line)
    return match.group(1).lower().replace("_", "-") if match else None


def _release_number(version: str) -> str:
    """``version`` without trailing ``.0`` parts, as pip compares them (1.5.0 is the index's 1.5)."""
    return re.sub(r"(\.0+)+$", "", version)


def releases() -> list[Release]:
    """Every supported release of every library, in :data:`LIBRARIES`' order."""
    return [Release(library, version) for library in LIBRARIES for version in library.versions]


def parse_release(spec: str) -> Release:
    """The supported release ``spec`` (``PACKAGE==VERSION``) names; a ValueError that says what is
    supported when it is malformed, names another package or a release outside the range."""
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(f"a release is PACKAGE==VERSION, e.g. opacus==1.5.2; got {spec!r}")
    package = match.group("package").lower().replace("_", "-")
    for library in LIBRARIES:
        if library.package == package:
            asked = match.group("version")
            for version in library.versions:
                if _release_number(version) == _release_number(asked):
                    return Release(library, version)
            raise ValueError(f"{package}=={asked} is not a supported release; supported: {', '.join(library.versions)}")
    known = ", ".join(library.package for library in LIBRARIES)
    raise ValueError(f"{match.group('package')!r} is not a library dpverify gates releases of; known: {known}")


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
    """``python -m dpverify.releases SPEC``: print the release's nox session, environment, implementation
    pattern and default report, one a line (for scripts/release.sh), or the error and exit 2.
    ``python -m dpverify.releases gate SPEC [dpverify audit arguments]``: :func:`gate`."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    run_gate = bool(args) and args[0] == "gate"
    if run_gate:
        args = args[1:]
    if not args or (len(args) != 1 and not run_gate):
        print("usage: python -m dpverify.releases [gate] PACKAGE==VERSION", file=sys.stderr)
        return 2
    try:
        release = parse_release(args[0])
    except ValueError as error:
        print(f"dpverify.releases: {error}", file=sys.stderr)
        return 2
    if run_gate:
        return gate(release, args[1:])
    print(release.session, release.envdir, release.library.implementations, release.report, sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
