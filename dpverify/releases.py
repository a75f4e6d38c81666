"""The releases of each DP library that dpverify supports and gates, one environment each (issue 30).

Each library is described by its plugin (:class:`Library`, named under the :data:`LIBRARY_GROUP` entry
points); ``pyproject.toml``'s extras declare these ranges; ``nox -s release`` makes an environment per release
(``.venvs/release-<package>-<version>``, the family's environment with that release, and any pins of its
own, in place of the pinned ones) and audits the library's implementations there; ``bash
scripts/release.sh PACKAGE==VERSION`` does it for one. Framework-free and stdlib-only: the noxfile imports it before any environment exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LIBRARY_GROUP",
    "Finding",
    "Library",
    "Release",
    "environment_for",
    "installed_release",
    "libraries",
    "parse_release",
    "parse_version",
    "release_from_command_line",
    "releases",
]


@dataclass(frozen=True)
class Library:
    """A DP library, as its plugin describes it (:func:`libraries`): its package on the index, the package
    ``extra`` that installs it (``pip install 'dpverify[<extra>]'``), the family environment it joins
    (noxfile.py's session of that name, ``.venvs/<family>``), the constraints file that pins its other
    packages, its implementations' name pattern, its supported releases, and ``pins``: for a release the
    family's constraints do not fit, what is installed with it in place of the family's pins of those
    packages (``(version, ("jax==0.6.2", ...))``)."""

    package: str
    extra: str
    family: str
    constraints: str
    implementations: str
    versions: tuple[str, ...]
    pins: tuple[tuple[str, tuple[str, ...]], ...] = ()


#: The entry point group under which a plugin names its :class:`Library` (``module:ATTRIBUTE``), in
#: pyproject.toml beside its ``dpverify.implementations``.
LIBRARY_GROUP = "dpverify.libraries"


def libraries() -> tuple[Library, ...]:
    """The libraries the plugins describe, by package name: each entry point of :data:`LIBRARY_GROUP`.
    Where dpverify is not installed, was installed before the group existed, or its plugins cannot be
    imported (the noxfile and scripts/release.sh run before any environment exists; an editable install's
    metadata beside the source without the plugins on the path), the group is read from the pyproject.toml of
    the source tree and each module loaded from its file alone: a plugin's package imports numpy, its
    description must not."""
    from importlib import metadata

    try:
        found = [entry_point.load() for entry_point in metadata.entry_points(group=LIBRARY_GROUP)]
    except ImportError:
        found = []
    if not found:
        found = [_load_from_source(value, roots) for value, roots in _source_entry_points()]
    return tuple(sorted(found, key=lambda library: library.package))


def _source_entry_points() -> list[tuple[str, list[Path]]]:
    """``(module:attribute, package roots)`` for each entry point of :data:`LIBRARY_GROUP` that the
    pyproject.toml beside this package declares; none outside a source tree (or before Python 3.11)."""
    root = Path(__file__).resolve().parent.parent
    try:
        import tomllib

        with open(root / "pyproject.toml", "rb") as stream:
            project = tomllib.load(stream)
    except (ImportError, OSError):
        return []
    roots = [root / where for where in project.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {}).get("where", ["."])]
    group = project.get("project", {}).get("entry-points", {}).get(LIBRARY_GROUP, {})
    return [(value, roots) for value in group.values()]


def _load_from_source(value: str, roots: list[Path]) -> Library:
    """The attribute ``value`` (``package.module:ATTRIBUTE``) names, from the module's file under one of
    ``roots``, executed without its package's ``__init__``."""
    import importlib.util
    import sys

    module_name, _, attribute = value.partition(":")
    relative = Path(*module_name.split(".")).with_suffix(".py")
    path = next((root / relative for root in roots if (root / relative).is_file()), None)
    if path is None:
        raise ValueError(f"{LIBRARY_GROUP} entry point {value!r}: no {relative} under {', '.join(map(str, roots))}")
    name = f"_dpverify_library_{module_name.replace('.', '_')}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass in the module looks its module up while it is defined
        spec.loader.exec_module(module)
    return getattr(sys.modules[name], attribute)


def environment_for(extra: str | None) -> str | None:
    """This repository's environment for an implementation of ``extra`` (noxfile.py's sessions, made by
    ``bash scripts/setup.sh``): its library's family's, ``.venvs/<family>``, or the family's own when
    ``extra`` names a family; ``None`` for any other. Families that cannot share one environment
    (TF-Privacy 0.9 needs numpy < 2, JAX-Privacy 2.0 numpy 2) are audited from their own."""
    known = libraries()
    family = next((library.family for library in known if library.extra == extra), None)
    if family is None and extra in {library.family for library in known}:
        family = extra
    return None if family is None else f".venvs/{family}"


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
    """Every supported release of every library, in :func:`libraries`' order."""
    return [Release(library, version) for library in libraries() for version in library.versions]


def parse_release(spec: str) -> Release:
    """The supported release ``spec`` (``PACKAGE==VERSION``) names; a ValueError that says what is
    supported when it is malformed, names another package or a release outside the range."""
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(f"a release is PACKAGE==VERSION, e.g. opacus==1.5.2; got {spec!r}")
    package = match.group("package").lower().replace("_", "-")
    known = libraries()
    for library in known:
        if library.package == package:
            asked = match.group("version")
            for version in library.versions:
                if _release_number(version) == _release_number(asked):
                    return Release(library, version)
            raise ValueError(f"{package}=={asked} is not a supported release; supported: {', '.join(library.versions)}")
    names = ", ".join(library.package for library in known)
    raise ValueError(f"{match.group('package')!r} is not a library dpverify gates releases of; known: {names}")


def release_from_command_line(args: list[str], program: str, rest: str = "") -> Release | None:
    """The release the first of ``args`` names, or ``None`` after printing ``program``'s usage (no spec, or
    arguments after it where ``rest`` allows none) or the spec's error to standard error."""
    import sys

    if not args or (len(args) > 1 and not rest):
        print(f"usage: python -m {program} PACKAGE==VERSION{rest}", file=sys.stderr)
        return None
    try:
        return parse_release(args[0])
    except ValueError as error:
        print(f"{program}: {error}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m dpverify.releases SPEC``: print the release's nox session, environment, implementation
    pattern and default report, one a line (for scripts/release.sh), or the error and exit 2."""
    import sys

    release = release_from_command_line(sys.argv[1:] if argv is None else argv, "dpverify.releases")
    if release is None:
        return 2
    print(release.session, release.envdir, release.library.implementations, release.report, sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
