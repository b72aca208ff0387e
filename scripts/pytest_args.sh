#!/usr/bin/env bash
# The CI jobs' pytest options (sourced by scripts/test.sh and scripts/test_tl39.sh): the suite on
# SITELENS_TEST_WORKERS pytest-xdist workers (default 2; 0 runs it in one process), each with one
# torch/OpenMP thread so that the workers do not oversubscribe the cores. --dist loadfile keeps a
# test file on one worker: a file's module- and session-scoped models (the bundled SmolLM2 and
# Gemma, the tiny models) load once per worker that runs it, not once per test.
workers=${SITELENS_TEST_WORKERS:-2}
PYTEST_ARGS=(-q -p no:cacheprovider)
if [ "$workers" != 0 ]; then
  PYTEST_ARGS+=(-n "$workers" --dist loadfile)
  export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
fi
