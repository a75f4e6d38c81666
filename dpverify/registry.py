"""Where implementations under audit are registered.

Two ways in, both public: an entry point in the group ``dpverify.implementations`` whose object is a
callable returning an iterable of :class:`~dpverify.contract.Implementation` (how the built-ins and
installed packages register), and :func:`register_implementation` (how a library's ``conftest.py``
registers the optimizer it wants audited in its own CI). Names are unique.
"""

from __future__ import annotations

from importlib import metadata
from typing import Iterable

from dpverify.contract import Implementation

ENTRY_POINT_GROUP = "dpverify.implementations"

_registry: dict[str, Implementation] = {}
_bundled: set[str] = set()
_entry_points_loaded = False


class DuplicateImplementationError(ValueError):
    """Two implementations were registered under one name."""


def register_implementation(implementation: Implementation, *, replace: bool = False) -> Implementation:
    """Register ``implementation`` under ``implementation.info.name`` and return it (usable as a decorator
    on an instance factory's result). ``replace=True`` overwrites an existing registration on purpose."""
    if not isinstance(implementation, Implementation):
        raise TypeError(f"expected a dpverify.contract.Implementation, got {type(implementation).__name__}")
    _load_entry_points()
    name = implementation.info.name
    if name in _registry and not replace and _registry[name] is not implementation:
        raise DuplicateImplementationError(
            f"an implementation named {name!r} is already registered ({_registry[name]!r}); "
            "choose another name or pass replace=True"
        )
    _registry[name] = implementation
    return implementation


def unregister_implementation(name: str) -> None:
    """Remove a registration (for tests that register temporary implementations)."""
    _load_entry_points()
    if name not in _registry:
        raise KeyError(f"no implementation named {name!r}; registered: {', '.join(sorted(_registry))}")
    del _registry[name]


def forget_registrations() -> None:
    """Drop every registration made by calls (conftest files), keeping entry points; the plugin calls
    this when a pytest session ends, so each session sees only its own conftest's implementations."""
    global _entry_points_loaded
    _registry.clear()
    _bundled.clear()
    _entry_points_loaded = False


def get_implementation(name: str) -> Implementation:
    _load_entry_points()
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"no implementation named {name!r}; registered: {', '.join(sorted(_registry))}") from None


def registered_implementations() -> list[Implementation]:
    """Every registered implementation, sorted by name."""
    _load_entry_points()
    return [_registry[name] for name in sorted(_registry)]


def is_bundled(name: str) -> bool:
    """True for implementations shipped with dpverify itself (the built-ins and their buggy variants)."""
    _load_entry_points()
    return name in _bundled


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        factory = entry_point.load()
        provided: Iterable[Implementation] = factory() if callable(factory) else factory
        bundled = entry_point.dist is not None and entry_point.dist.name == "dpverify"
        for implementation in provided:
            register_implementation(implementation)
            if bundled:
                _bundled.add(implementation.info.name)
