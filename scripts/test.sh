#!/usr/bin/env bash
# Set up, then run the test suite with the quick DP audits of every bundled implementation and variant.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest --dp-audit -n 2 "$@"
