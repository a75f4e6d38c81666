#!/usr/bin/env bash
# Gate one release of a DP library: make (or reuse) its environment through nox, the family's environment
# with that release in place of the pinned one (.venvs/release-<package>-<version>), audit the library's
# implementations there with the default gate at the quick profile, print the table and write the report
# (default release-<package>-<version>.json). Exit status non-zero when a correct path is refuted without a
# recorded finding, or an audit errors. Supported releases: each plugin's LIBRARY (plugins/*/_releases.py); all of them: nox -s release.
#   bash scripts/release.sh opacus==1.5.2 [--report PATH]
set -euo pipefail
usage="usage: bash scripts/release.sh PACKAGE==VERSION [--report PATH]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
spec=$1; shift
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --report) [ $# -ge 2 ] && [ -n "$2" ] || { echo "--report needs a path; $usage" >&2; exit 2; }; extra+=(--report "$(realpath -m "$2")"); shift 2 ;;
    *) echo "unknown argument $1; $usage" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
# The release's nox session, or a clear error (malformed spec, another package, a release out of range).
info=$(PYTHONPATH=. "$PYTHON" -m dpverify.releases "$spec")
session=${info%%$'\n'*}
NOX_VERSION=2026.10.20
if [ ! -x .venvs/nox/bin/nox ] || [ "$(.venvs/nox/bin/nox --version 2>&1)" != "$NOX_VERSION" ]; then
  "$PYTHON" -m venv .venvs/nox
  .venvs/nox/bin/python -m pip install --quiet "nox==$NOX_VERSION"
fi
# One thread each, as the main job runs (scripts/audit.sh).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}"
exec .venvs/nox/bin/nox --sessions "$session" -- "${extra[@]}"
