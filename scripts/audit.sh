#!/usr/bin/env bash
# The main job: set up, then audit every bundled implementation (correct ones and buggy variants) of every
# family with the quick profile: one session in .venvs/torch that runs the JAX family's audits in .venvs/jax
# (--env), so one level is shared by all of them, one table is printed and one dp-audit-report.json written.
# What it audits is the default gate's selection, pyproject.toml's dp_audit_implementations (which says what
# is left out and why; "*" is --all), read by scripts/gate_selection.py; --full first audits every
# implementation. Extra arguments go to `dpverify audit`.
set -euo pipefail
full=false
if [ "${1:-}" = --full ]; then full=true; shift; fi
cd "$(dirname "$0")/.."
bash scripts/setup.sh
selection=(--all)
if ! $full; then
  mapfile -t selection < <(.venvs/torch/bin/python scripts/gate_selection.py | sed 's/^\*$/--all/')
fi
export KERAS_BACKEND="${KERAS_BACKEND:-jax}"  # Keras 3 in .venvs/jax; .venvs/torch's Keras 2 ignores it
# Three processes in all (--jobs 3), shared by the environments in proportion to their audits: two for the
# torch family's, one for the JAX family's, side by side on the cores, each family of implementations (one and
# its variants) in one process, which makes what they share once. One thread each (torch's OpenMP; a
# JAX worker is confined to one core, dpverify/workers.py), as the test command runs its workers, or each
# takes every core and they oversubscribe.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}"
exec .venvs/torch/bin/dpverify audit "${selection[@]}" --env .venvs/jax --jobs 3 --profile quick --report dp-audit-report.json "$@"
