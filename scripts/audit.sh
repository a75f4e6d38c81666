#!/usr/bin/env bash
# The main job: set up, then audit every bundled implementation (correct ones and buggy variants) of every
# family with the quick profile: one session in .venvs/torch that runs the JAX family's audits in .venvs/jax
# (--env), so one level is shared by all of them, one table is printed and one dp-audit-report.json written.
# Left out unless --full comes first: the JAX-Privacy Keras path's four variants (jax-privacy-keras-no*), the
# same buggy steps as the core path's variants, which the main job audits, run through Keras' fit instead
# (tests/test_jax_privacy.py checks that fit takes them); each Keras audit traces a train step per pooled run,
# so the four cost about 125 CPU-s. Also left out: opacus-lm-hooks-clip-2c, opacus-lm-clip-2c's bug in
# hooks mode (tests/test_language_opacus.py checks its step), and the D4 opacus-lm-unclipped-embedding,
# which the language design cannot see: 29 and 35 s of the main job's audits. Extra arguments go to
# `dpverify audit`.
set -euo pipefail
selection=(--all '!jax-privacy-keras-no*' '!opacus-lm-hooks-clip-2c' '!opacus-lm-unclipped-embedding')
if [ "${1:-}" = --full ]; then selection=(--all); shift; fi
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export KERAS_BACKEND="${KERAS_BACKEND:-jax}"  # Keras 3 in .venvs/jax; .venvs/torch's Keras 2 ignores it
# Three processes in all (--jobs 3), shared by the environments in proportion to their audits: two for the
# torch family's, one for the JAX family's, side by side on the cores. One thread each (torch's OpenMP; a
# JAX worker is confined to one core, dpverify/workers.py), as the test command runs its workers, or each
# takes every core and they oversubscribe.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}"
exec .venvs/torch/bin/dpverify audit "${selection[@]}" --env .venvs/jax --jobs 3 --profile quick --report dp-audit-report.json "$@"
