#!/usr/bin/env bash
# Set up .venv, then run ruff and the whole test suite (unit + integration on the bundled models +
# the browser tier: every committed HTML figure opened offline in headless Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/chromium.sh  # the browser tier's Chromium (only the tests need one)
.venv/bin/ruff check sitelens tests benchmarks scripts
if [ -n "${SITELENS_SKIP_BROWSER:-}" ]; then
  exec .venv/bin/python -m pytest -q -m "not browser" "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
