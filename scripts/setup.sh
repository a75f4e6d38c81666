#!/usr/bin/env bash
# Make the environments, one per family of DP libraries (noxfile.py): .venvs/torch (Opacus, TF-Privacy,
# the reference) and .venvs/jax (JAX-Privacy 2.0), which cannot share one (numpy < 2 against numpy 2).
# nox itself is installed first, pinned, into .venvs/nox, from Python 3.11 and pip alone. A second run
# reuses the environments and only checks their packages.
set -euo pipefail
cd "$(dirname "$0")/.."
NOX_VERSION=2026.10.20
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venvs/nox/bin/nox ] || [ "$(.venvs/nox/bin/nox --version 2>&1)" != "$NOX_VERSION" ]; then
  "$PYTHON" -m venv .venvs/nox
  .venvs/nox/bin/python -m pip install --quiet "nox==$NOX_VERSION"
fi
exec .venvs/nox/bin/nox --sessions torch jax
