#!/usr/bin/env bash
# Set up, then run the test suite with the quick DP audits of every bundled implementation and variant in
# .venvs/torch, then in .venvs/jax what applies there: the JAX-Privacy tests (tests/test_layers.py: its layer
# designs; the torch ones skip), the event claims in the relations only its dp_accounting 0.6 accounts
# (tests/test_claim_events.py: replace-one and zero-out), the correlated-noise strategies checked against
# JAX-Privacy's own sensitivities (tests/test_correlated.py), its dense matrix-factorization path
# (tests/test_dense_mf.py) and the ready-made audits of the
# JAX family (`dp-audit`, the virtual module of the ready-made audits) but what the default gate leaves out
# (pyproject.toml's dp_audit_implementations, read by scripts/gate_selection.py; here the Keras path's four
# variants).
# Extra arguments go to both pytest runs; a --dp-audit-report=PATH.json of the second is written to
# PATH-jax.json. Fails if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit
# Two xdist workers on two cores: one intra-op thread each. The audits' models are small, and two threads
# a worker oversubscribe the cores (the suite took 686 s of tests that way against 513 s, 2026-11-26).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export KERAS_BACKEND="${KERAS_BACKEND:-jax}"  # Keras 3 in .venvs/jax; .venvs/torch's Keras 2 ignores it
status=0
.venvs/torch/bin/pytest --dp-audit -n 2 "$@" || status=$?

jax_args=()
for arg in "$@"; do
  case "$arg" in
    --dp-audit-report=*.json) jax_args+=("${arg%.json}-jax.json") ;;
    *) jax_args+=("$arg") ;;
  esac
done
jax_tests=()
# The matrix-factorization files first: their audits are the run's longest tests, and xdist deals the items
# in this order, so last they would leave one worker idle at the end.
for file in tests/test_jax_privacy_bandmf.py tests/test_dense_mf.py tests/test_jax_privacy.py tests/test_jax_auditing.py tests/test_layers.py \
    tests/test_claim_events.py tests/test_correlated.py tests/test_correlated_cyclic.py; do
  [ -f "$file" ] && jax_tests+=("$file")
done
# The family's audits less the gate's exclusions (a command-line selection replaces the ini's, so it repeats
# them, from the one place they are written).
jax_selection="jax-privacy-*"
exclusions=$(.venvs/torch/bin/python scripts/gate_selection.py --exclusions | paste -sd, -) || status=1
[ -n "$exclusions" ] && jax_selection+=",$exclusions"
# XLA, like torch above, one thread a worker (its default takes every core in each of the two workers).
XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}" \
  .venvs/jax/bin/pytest --dp-audit -n 2 --dp-audit-implementations="$jax_selection" "${jax_tests[@]}" dp-audit "${jax_args[@]}" || status=$?
exit "$status"
