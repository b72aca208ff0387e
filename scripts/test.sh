#!/usr/bin/env bash
# Set up .venv (TransformerLens 4, the TransformerBridge backend: what a new install gets), then run
# ruff and the whole test suite (unit + integration on both bundled models + notebooks + the
# browser tier: every committed HTML figure opened offline in headless Chromium) on two workers
# (scripts/pytest_args.sh). The same suite on TransformerLens 3.9 with HookedTransformer:
# scripts/test_tl39.sh. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/chromium.sh  # the browser tier's Chromium (only the tests need one)
.venv/bin/ruff check sitelens tests benchmarks scripts
. scripts/pytest_args.sh
if [ -n "${SITELENS_SKIP_BROWSER:-}" ]; then
  exec .venv/bin/python -m pytest "${PYTEST_ARGS[@]}" -m "not browser" "$@"
fi
exec .venv/bin/python -m pytest "${PYTEST_ARGS[@]}" "$@"
