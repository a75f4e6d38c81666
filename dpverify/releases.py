"""The releases of each DP library that dpverify supports and gates, one environment each (issue 30).

``pyproject.toml``'s extras declare these ranges; ``nox -s release`` makes an environment per release
(``.venvs/release-<package>-<version>``, the family's environment with that release in place of the
pinned one) and audits the library's implementations there; ``bash scripts/release.sh PACKAGE==VERSION``
does it for one. Framework-free and stdlib-only: the noxfile imports it before any environment exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LIBRARIES", "Library", "Release", "parse_release", "releases"]


@dataclass(frozen=True)
class Library:
    """A DP library: its package on the index, the family environment it joins (noxfile.py), the
    constraints file that pins its other packages, its implementations' name pattern and its releases.
    ``unpinned`` names packages of the constraints file each release brings its own pins for (they are
    dropped from the constraints with the library itself)."""

    package: str
    family: str
    constraints: str
    implementations: str
    versions: tuple[str, ...]
    unpinned: tuple[str, ...] = ()


#: Every release in the declared ranges. Opacus: all releases 1.4.0–1.6.0 (1.5 is the index's name of 1.5.0).
#: TF-Privacy: 0.8.12 and 0.9.0; 0.8.11 needs tf-models-official and 0.8.10 and earlier pin
#: tensorflow-probability ~= 0.20.0 (built for TF 2.12), so they do not install beside TF 2.15.
#: JAX-Privacy: 1.0.0 (pins jax 0.6.2) and 2.0.0.
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
        unpinned=("jax", "jaxlib", "optax"),
    ),
)

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

    def constraints(self, text: str) -> str:
        """``text`` (the family's constraints file) without the lines that pin this library or the packages
        its releases pin themselves, so that this release can be installed in their place."""
        dropped = {self.library.package, *self.library.unpinned}
        kept = [line for line in text.splitlines() if _pinned_name(line) not in dropped]
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


def main(argv: list[str] | None = None) -> int:
    """``python -m dpverify.releases SPEC``: print the release's nox session, environment, implementation
    pattern and default report, one a line (for scripts/release.sh), or the error and exit 2."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dpverify.releases PACKAGE==VERSION", file=sys.stderr)
        return 2
    try:
        release = parse_release(args[0])
    except ValueError as error:
        print(f"dpverify.releases: {error}", file=sys.stderr)
        return 2
    print(release.session, release.envdir, release.library.implementations, release.report, sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
