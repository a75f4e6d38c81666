#!/usr/bin/env bash
# The main job: set up, then audit every bundled implementation (correct ones and buggy variants) with the
# quick profile, writing dp-audit-report.json. Extra arguments go to `dpverify audit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/dpverify audit --all --profile quick --report dp-audit-report.json "$@"
