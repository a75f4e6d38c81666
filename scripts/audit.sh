#!/usr/bin/env bash
# The main job: set up, then audit every bundled implementation (correct ones and buggy variants) of every
# family with the quick profile: one session in .venvs/torch that runs the JAX family's audits in .venvs/jax
# (--env), so one level is shared by all of them, one table is printed and one dp-audit-report.json written.
# Extra arguments go to `dpverify audit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export KERAS_BACKEND="${KERAS_BACKEND:-jax}"  # Keras 3 in .venvs/jax; .venvs/torch's Keras 2 ignores it
# The two environments' audits run side by side, one process each: one thread each (torch's OpenMP, XLA's
# Eigen pool), as the test command runs its two workers, or each takes every core and they oversubscribe.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}"
exec .venvs/torch/bin/dpverify audit --all --env .venvs/jax --profile quick --report dp-audit-report.json "$@"
