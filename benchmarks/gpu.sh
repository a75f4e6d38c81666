#!/usr/bin/env bash
# The GPU tables: run on a machine with CUDA where dpverify and opacus are importable. Writes
# <name>-cuda.md into $1 (default benchmarks/results) and a log of each step beside them. Each step has
# its own time limit so that one slow step leaves the others' tables.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
step() { local limit=$1 log=$2; shift 2; echo "== $log: $*"; timeout "$limit" "$@" 2>&1 | tee "$out/$log.log" | tail -40; }
step 150 speed-cuda python3 benchmarks/audits.py speed --device cuda --warm-up --results-dir "$out" \
  --implementations opacus-ghost reference-dpsgd opacus-hooks --overhead-profiles quick standard paper \
  --m 4000 10000 --hidden-widths 10000 100000
step 90 power-cuda python3 benchmarks/audits.py power --device cuda --seeds 1 --m 10000 --scores 1 --results-dir "$out"
step 110 tests-cuda python3 -m pytest tests -q -n 12 -p no:cacheprovider --dp-audit --dp-audit-device=cuda
step 160 sweep-cuda python3 benchmarks/audits.py sweep --device cuda --grid cuda --seeds 1 --results-dir "$out"
