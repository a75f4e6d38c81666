#!/usr/bin/env bash
# Create .venv and install dpverify with every extra. The CPU build of torch is pinned first: an unpinned
# torch would pull a multi-GB CUDA build. TF-Privacy 0.9.0 needs Python < 3.12 and numpy < 2.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e ".[all]" -c constraints.txt
