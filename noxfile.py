"""The environments dpverify's checks run in, one per family of DP libraries that can share one.

Opacus and TF-Privacy (family ``torch``) share one; JAX-Privacy 2.0 (family ``jax``) cannot join them:
TF-Privacy 0.9 pins dp-accounting 0.4.3 and numpy < 2, JAX-Privacy 2.0 needs dp-accounting >= 0.6 and
numpy 2. nox installs with pip, which honours the machine's pip configuration (its package mirror, its
local CPU build of torch). ``bash scripts/setup.sh`` runs both sessions; ``nox -s jax -- pytest ...``
runs a command in a family's environment (``.venvs/<family>``).
"""

import nox

nox.options.envdir = ".venvs"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["torch", "jax"]

#: TF-Privacy 0.9 needs Python < 3.12; both families use the same interpreter.
PYTHON = "3.11"


def _run_posargs(session: nox.Session) -> None:
    """Run the command after ``--`` in the environment just made, if one was given."""
    if session.posargs:
        session.run(*session.posargs)


@nox.session(python=PYTHON, venv_backend="venv")
def torch(session: nox.Session) -> None:
    """Opacus, TF-Privacy and the reference DP-SGD. The CPU build of torch goes first: an unpinned torch
    would pull a multi-GB CUDA build."""
    session.install("--quiet", "--upgrade", "pip")
    session.install("--quiet", "torch==2.13.0")
    session.install("--quiet", "-e", ".[all]", "-c", "constraints.txt")
    _run_posargs(session)


@nox.session(python=PYTHON, venv_backend="venv")
def jax(session: nox.Session) -> None:
    """JAX-Privacy 2.0 with Keras 3 on its JAX backend (``KERAS_BACKEND=jax`` for the command run here, as
    scripts/audit.sh and scripts/test.sh set it)."""
    session.install("--quiet", "--upgrade", "pip")
    session.install("--quiet", "-e", ".[jax-privacy,test,plots]", "-c", "constraints-jax.txt")
    session.env["KERAS_BACKEND"] = "jax"
    _run_posargs(session)
