#!/usr/bin/env bash
# Make the environments, one per family of DP libraries (noxfile.py): .venvs/torch (Opacus, TF-Privacy,
# the reference) and .venvs/jax (JAX-Privacy 2.0), which cannot share one (numpy < 2 against numpy 2).
# nox itself is installed first, pinned, into .venvs/nox, from Python 3.11 and pip alone. A second run
# with nothing changed uses them as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
NOX_VERSION=2026.10.20
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venvs/nox/bin/nox ] || [ "$(.venvs/nox/bin/nox --version 2>&1)" != "$NOX_VERSION" ]; then
  "$PYTHON" -m venv .venvs/nox
  .venvs/nox/bin/python -m pip install --quiet "nox==$NOX_VERSION"
fi
# What the environments were made from: when none of it changed since they were made (the stamp), they are
# used as they are (dpverify and its plugins are installed editable, so edits to the code need nothing);
# checking every package again took 12 s. Remove .venvs/setup-stamp to have them checked.
stamp=.venvs/setup-stamp
made_from="$(cat pyproject.toml constraints.txt constraints-jax.txt noxfile.py | sha256sum) nox $NOX_VERSION $("$PYTHON" --version 2>&1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$made_from" ] && [ -x .venvs/torch/bin/python ] && [ -x .venvs/jax/bin/python ]; then
  exit 0
fi
rm -f "$stamp"
.venvs/nox/bin/nox --sessions torch jax
printf '%s' "$made_from" > "$stamp"
