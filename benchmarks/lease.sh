#!/usr/bin/env bash
# One lease of a GPU machine (the device tool), as one prepared command: install dpverify and the libraries from
# the wheels in .whl/ (the machine reaches no package index; its Python has torch and jax), then the CUDA
# measurements (benchmarks/gpu.sh) and the false-alarm audits of the gate's designs on the machine's cores
# (benchmarks/false_alarms_gate.py, CPU training, one process a core; SEEDS 0 leaves them out). Writes under $1.
#   Prepare here: pip wheel --no-deps . -w .whl (and of opacus-dpcr's and dpcrpy's sdists: pure Python), and
#   `pip download --no-deps` of opacus, dp-accounting, jax-privacy, keras and the needs the machine lacks for
#   its Python (see profiles-cuda.md's last section).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/lease.sh OUT_FOLDER [SEEDS]}
seeds=${2:-24}
mkdir -p "$out"
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --no-index --find-links .whl .whl/dpverify-*.whl \
  opacus opacus-dpcr dpcrpy dp-accounting jax-privacy keras 2>&1 | tail -5
bash benchmarks/gpu.sh "$out/cuda"
[ "$seeds" -gt 0 ] || exit 0
echo "== false alarms on $(nproc) cores, $seeds seeds"
timeout 300 python3 benchmarks/false_alarms_gate.py reference-dpsgd opacus-ghost opacus-hooks --seeds "$seeds" \
  --parallel "$(nproc)" --device cpu --output false-alarms-gate.md
cp benchmarks/results/false-alarms-gate.md "$out/"
