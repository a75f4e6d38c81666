"""The environments dpverify's checks run in, one per family of DP libraries that can share one.

Opacus and TF-Privacy (family ``torch``) share one; JAX-Privacy 2.0 (family ``jax``) cannot join them:
TF-Privacy 0.9 pins dp-accounting 0.4.3 and numpy < 2, JAX-Privacy 2.0 needs dp-accounting >= 0.6 and
numpy 2. nox installs with pip, which honours the machine's pip configuration (its package mirror, its
local CPU build of torch). ``bash scripts/setup.sh`` runs both sessions; ``nox -s jax -- pytest ...``
runs a command in a family's environment (``.venvs/<family>``).

``nox -s release`` is the release matrix: for each supported release of each library
(:mod:`dpverify.releases`), the family's environment with that release in place of the pinned one
(``.venvs/release-<package>-<version>``; a release whose own pins conflict with the family's gets those in their
place, ``Library.pins``), then the default gate's audits of that library's implementations
at the quick profile. ``bash scripts/release.sh PACKAGE==VERSION`` runs one of them.
"""

import os
import sys
import tempfile

import nox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dpverify.releases import parse_release, releases  # noqa: E402  (stdlib only, importable before any venv)

nox.options.envdir = ".venvs"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["torch", "jax"]

#: TF-Privacy 0.9 needs Python < 3.12; both families use the same interpreter.
PYTHON = "3.11"
#: What each family installs from this repository, and the CPU build of torch installed first for ``torch``
#: (an unpinned torch would pull a multi-GB CUDA build).
EXTRAS = {"torch": ".[all]", "jax": ".[jax-privacy,test,plots]"}
TORCH = "torch==2.13.0"


def _run_posargs(session: nox.Session) -> None:
    """Run the command after ``--`` in the environment just made, if one was given."""
    if session.posargs:
        session.run(*session.posargs)


def _install_family(session: nox.Session, family: str, constraints: str, *pinned: str) -> None:
    """The family's packages under ``constraints``, with ``pinned`` (a release) installed alongside."""
    session.install("--quiet", "--upgrade", "pip")
    if family == "torch":
        session.install("--quiet", TORCH)
    session.install("--quiet", "-e", EXTRAS[family], *pinned, "-c", constraints)
    if family == "jax":
        session.env["KERAS_BACKEND"] = "jax"


@nox.session(python=PYTHON, venv_backend="venv")
def torch(session: nox.Session) -> None:
    """Opacus, TF-Privacy and the reference DP-SGD."""
    _install_family(session, "torch", "constraints.txt")
    _run_posargs(session)


@nox.session(python=PYTHON, venv_backend="venv")
def jax(session: nox.Session) -> None:
    """JAX-Privacy 2.0 with Keras 3 on its JAX backend (``KERAS_BACKEND=jax`` for the command run here, as
    scripts/audit.sh and scripts/test.sh set it)."""
    _install_family(session, "jax", "constraints-jax.txt")
    _run_posargs(session)


@nox.session(python=PYTHON, venv_backend="venv")
@nox.parametrize("spec", [release.spec for release in releases()], ids=[release.spec for release in releases()])
def release(session: nox.Session, spec: str) -> None:
    """One release's environment and gate (:func:`dpverify.release_gate.gate`: ``dpverify audit '<library>-*'
    --profile quick`` writing ``release-<package>-<version>.json``, and the paths the release lacks as n/a);
    the arguments after ``--`` go to ``dpverify audit`` (e.g. ``--report PATH``)."""
    chosen = parse_release(spec)
    with open(chosen.library.constraints) as pins, tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as own:
        own.write(chosen.constraints(pins.read()))
    try:
        _install_family(session, chosen.library.family, own.name, *chosen.requirements)
    finally:
        os.unlink(own.name)
    session.run("python", "-m", "dpverify.release_gate", chosen.spec, *session.posargs)
