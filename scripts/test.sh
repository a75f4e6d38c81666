#!/usr/bin/env bash
# Set up, then run the test suite with the quick DP audits of every bundled implementation and variant.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two xdist workers on two cores: one intra-op thread each. The audits' models are small, and two threads
# a worker oversubscribe the cores (the suite took 686 s of tests that way against 513 s, 2026-11-26).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/pytest --dp-audit -n 2 "$@"
