#!/usr/bin/env bash
# The device measurements: the profiles that want a GPU (gpu, paper), the quick profile on CUDA beside the
# CPU's numbers, and JAX-Privacy on a GPU. Run on a machine with CUDA where dpverify and opacus are
# importable (and jax_privacy with keras for the JAX step; it is skipped, saying so, without them). Writes
# each step's table and log to $1 (default benchmarks/results/cuda) as <step>.log and <step>.json (the
# audits' report). Each step has its own time limit so that one slow step leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
step() {
  local limit=$1 name=$2; shift 2
  echo "== $name (limit ${limit} s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" --report "$out/$name.json" >"$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - start)) s"
  grep -E "^(implementation|-----|[a-z].*  (pass|violation|undecided|error))" "$out/$name.log" | cut -c1-220
}
audit=(python3 -m dpverify audit --seed 0 --device cuda)
# The gpu profile: 250 000 Dirac canaries in 25 runs of 10 000; correct paths, then a D1, a D2 and a D3 variant.
step 180 gpu-profile "${audit[@]}" reference-dpsgd opacus-ghost opacus-hooks opacus-no-noise opacus-batch-clipping \
  opacus-accountant-steps --profile gpu --worlds none
# The paper's setting: an MLP with 10^5 hidden units, m = 10^4, q = 0.1, 500 steps.
step 80 paper-profile "${audit[@]}" opacus-ghost opacus-no-noise --profile paper --worlds none
# JAX-Privacy on the GPU (XLA takes the GPU by itself; --device is the torch trainers' setting).
if KERAS_BACKEND=jax python3 -c "import jax_privacy, keras" 2>/dev/null; then
  export KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false
  step 100 jax-cuda "${audit[@]}" jax-privacy-core jax-privacy-keras jax-privacy-keras-accumulation jax-privacy-no-noise \
    --profile quick --worlds none
else
  echo "== jax: skipped, jax_privacy or keras is not importable here"
fi
# The fixed-batch world (every released update seen) on CUDA: the reference and Opacus' documented shuffled batches.
step 100 fixed-batch-cuda "${audit[@]}" reference-dpsgd opacus-shuffled-batches --profile quick --worlds fixed_batch
# The quick profile (what CI runs on a CPU) on CUDA: correct paths and a D1 variant of each model.
step 80 quick-cuda "${audit[@]}" reference-dpsgd opacus-ghost opacus-hooks opacus-no-noise opacus-lm opacus-lm-hooks \
  opacus-lm-no-noise --profile quick --worlds none
