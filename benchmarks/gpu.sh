#!/usr/bin/env bash
# The device measurements: the gpu profile, then what the quick profile (the main job's) audits on CUDA: each
# Opacus path with its every-update audit and layer designs, a formula-breaking variant of each design, the
# language models, JAX-Privacy's core and Keras paths with theirs, and the correlated-noise mechanisms
# (Opacus-DPCR's tree aggregation, JAX-Privacy's BandMF plan and dense matrix factorization) with their variants.
# Run on a machine with CUDA where dpverify and opacus are importable (and jax_privacy with keras for the JAX
# steps, opacus_dpcr for the DPCR step; each is skipped, saying so, without them). Writes each step's table and log
# to $1 (default benchmarks/results/cuda) as <step>.log and <step>.json (the audits' report). Each step has its own
# time limit so that one slow step leaves the others' results. The paper profile (`--profile paper`) and the
# fixed-batch world are left out: the first is unchanged since its measurement in profiles-cuda.md, the second
# trains a model far too small for a GPU (about 10 s an audit on CUDA as on the CPU, same file).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>/dev/null || echo "jax: not importable"
step() {
  local limit=$1 name=$2; shift 2
  echo "== $name (limit ${limit} s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" --report "$out/$name.json" >"$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - start)) s"
  grep -E "^(implementation|-----|[a-z].*  (pass|violation|undecided|error|n/a))" "$out/$name.log" | cut -c1-260
}
audit=(python3 -m dpverify audit --seed 0 --device cuda)
one_run=(--worlds none --every-update off --layers none)
# The gpu profile: 250 000 Dirac canaries in 25 runs of 10 000; correct paths, then a D1, a D2 and a D3 variant.
step 210 gpu-profile "${audit[@]}" reference-dpsgd opacus-ghost opacus-hooks opacus-no-noise opacus-batch-clipping \
  opacus-accountant-steps --profile gpu "${one_run[@]}"
# The quick profile's every-update audits and layer designs on CUDA (the one-run audit beside them), with a
# variant that breaks one layer type's norm formula.
step 100 opacus-designs-cuda "${audit[@]}" opacus-ghost opacus-hooks opacus-ghost-conv-norm opacus-ghost-linear-bias-norm \
  opacus-ghost-linear-bias-squared-norm \
  --profile quick --worlds none
# The language models on CUDA (Opacus' ghost clipping and hooks on a transformer) and a D1 variant.
step 60 lm-cuda "${audit[@]}" opacus-lm opacus-lm-hooks opacus-lm-no-noise --profile quick --worlds none
# Correlated noise on CUDA: Opacus-DPCR's tree aggregation as it ships (a known issue), with restarts, and its
# two variants.
if python3 -c "import opacus_dpcr" 2>/dev/null; then
  step 90 dpcr-cuda "${audit[@]}" opacus-dpcr opacus-dpcr-tree opacus-dpcr-unscaled-noise opacus-dpcr-unrestarted-tree \
    --profile quick --worlds none
else
  echo "== dpcr: skipped, opacus_dpcr is not importable here"
fi
# JAX-Privacy on the GPU (XLA takes the GPU by itself; --device is the torch trainers' setting): the core path
# with its every-update audit and layer designs, the Keras path, #287 and a layer variant.
if KERAS_BACKEND=jax python3 -c "import jax_privacy, keras" 2>/dev/null; then
  export KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false
  step 100 jax-cuda "${audit[@]}" jax-privacy-core jax-privacy-keras jax-privacy-keras-accumulation \
    jax-privacy-linear-bias-norm --profile quick --worlds none
  # The correlated-noise mechanisms: the BandMF execution plan and dense matrix factorization, with their variants.
  step 150 jax-correlated-cuda "${audit[@]}" jax-privacy-bandmf jax-privacy-bandmf-one-participation \
    jax-privacy-bandmf-poisson-everywhere jax-privacy-bandmf-unbanded-noise jax-privacy-dense-mf \
    jax-privacy-dense-mf-single-participation jax-privacy-dense-mf-mismatched-noising jax-privacy-dense-mf-short-noising \
    --profile quick --worlds none
else
  echo "== jax: skipped, jax_privacy or keras is not importable here"
fi
