#!/usr/bin/env bash
# Set up .venv, then run ruff and the whole test suite (unit + integration on the bundled models +
# the browser tier: every committed HTML figure opened offline in headless Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check sitelens tests benchmarks scripts
exec .venv/bin/python -m pytest -q "$@"
