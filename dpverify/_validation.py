"""Input checks at the door, with messages that name the parameter, the value and the allowed range."""

from __future__ import annotations

import errno
import math
import os
import tempfile
from numbers import Integral, Real
from pathlib import Path


def check_int(name: str, value: object, *, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int, or raise ``ValueError`` if it is not an integer in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {'in ' if high is not None else ''}{bounds}, got {value}")
    return int(value)


def check_real(
    name: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` naming the interval it must lie in."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite number in {interval}, got {value}")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        raise ValueError(f"{name} must be in {interval}, got {value:g}")
    return value


def check_probability(name: str, value: object) -> float:
    """A probability strictly inside (0, 1), as δ and confidence levels must be."""
    return check_real(name, value, low=0.0, high=1.0, low_open=True, high_open=True)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return str(value)


def check_writable(path: str | os.PathLike[str], *, directory: bool = False) -> None:
    """Write where ``path`` (a file, or a ``directory`` of files) will be written, now, and remove what this
    made: a new file is created and deleted, beside an existing one (or in the directory) a temporary file,
    as an atomic rewrite makes; missing folders are made and removed again. A path that cannot be written
    raises ``ValueError`` naming it and the system's reason, before any work that would end there."""
    target = Path(path)
    folder = target if directory else target.parent
    missing = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    try:
        if not directory and target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        folder.mkdir(parents=True, exist_ok=True)
        if directory or target.exists():
            with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{target.name}."):
                pass
        else:
            target.open("x").close()
            target.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        for made in missing:
            try:
                made.rmdir()
            except OSError:
                break
